package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// sbx is one sandbox: a pod whose container's PID 1 is the guest, reached
// through one attach stream: our writes are the guest's stdin, its stdout
// carries the frames and its stderr the diagnostics.
type sbx struct {
	d    *Driver
	id   string
	name string // the pod's
	uid  string // the pod's UID: Destroy deletes this pod only

	cancel     context.CancelFunc // ends the attach stream
	stdin      *io.PipeWriter     // the guest's stdin
	stdout     *io.PipeReader     // the guest's stdout
	stderr     *sandboxkit.BoundedBuffer
	streamDone chan struct{} // closed when the attach stream has ended

	endMu     sync.Mutex
	endReason string // the container's terminated reason, once the stream ended by itself

	// Guest is the host's end of the guest, over the attach stream: it
	// serves the sandbox's Start, files and kernels. Deleting the pod
	// ends the stream, which ends an Exec in flight with everything read
	// so far.
	sandboxkit.Guest

	destroyed sandboxkit.UntilDone

	bindMu  sync.Mutex
	unbound bool // CreateUnbound made it and Bind has not bound it yet
	session bool // its Spec had a Workspace or a Deadline: Bind keeps its lifetime
}

var (
	_ sandbox.Sandbox = (*sbx)(nil)
	_ sandbox.Files   = (*sbx)(nil)
	_ sandbox.Kernels = (*sbx)(nil)
)

func (d *Driver) newSbx(id string, pod *corev1.Pod, limits sandbox.Limits) *sbx {
	s := &sbx{d: d, id: id, name: pod.Name, uid: string(pod.UID)}
	s.Guest = sandboxkit.Guest{
		Sandbox: id,
		Limits:  limits,
		// The container's cgroup is the node's: seen only where the
		// daemon runs on the node (see started); elsewhere the guest's
		// own report says the peak and the CPU time. Where it is seen,
		// it says them as on the local tiers: the peak under runc,
		// whose cgroup holds exactly the sandbox's processes, the CPU
		// time under gVisor, whose Sentry counts time the host
		// throttled.
		PeakFromCgroup: d.cfg.Tier == sandbox.TierContainer,
		CPUFromCgroup:  d.cfg.Tier == sandbox.TierGVisor,
		Kill:           s.kill,
		DiedOfOOM:      s.diedOfOOM,
	}
	return s
}

func (s *sbx) ID() string { return s.id }

// start waits for the pod's container to run, attaches to it, lets the
// gate through (see gate) and waits for the guest's hello.
func (s *sbx) start(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.d.cfg.ReadyTimeout)
	defer cancel()
	if err := s.awaitRunning(ctx); err != nil {
		return err
	}
	if err := s.attach(); err != nil {
		return err
	}
	// The write returns once the stream carries it: the attach is up.
	if _, err := io.WriteString(s.stdin, "\n"); err != nil {
		s.Guest.MarkGone()
		return sandboxkit.StartError("kubernetes", fmt.Errorf("attaching to pod %s: %w", s.name, err), s.stderr.String())
	}
	if err := s.Guest.AwaitReady(ctx, s.d.cfg.ReadyTimeout); err != nil {
		s.Guest.MarkGone()
		return sandboxkit.StartError("kubernetes", err, s.stderr.String())
	}
	return nil
}

// awaitRunning watches the pod until its container runs. A container that
// ended, or waits for a reason that will not pass by itself (an image
// that is not there, a configuration the kubelet refuses), fails.
func (s *sbx) awaitRunning(ctx context.Context) error {
	pods := s.d.cs.CoreV1().Pods(s.d.cfg.Namespace)
	w, err := s.d.watch.CoreV1().Pods(s.d.cfg.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + s.name})
	if err != nil {
		return s.d.apiError("watching pod "+s.name+" in", err)
	}
	defer w.Stop()
	// The pod may have run before the watch began: look once.
	if p, err := pods.Get(ctx, s.name, metav1.GetOptions{}); err == nil {
		if done, err := running(p, s.d.registry != nil); done {
			return s.started(p, err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s did not run within %s: %w: %w", s.name, s.d.cfg.ReadyTimeout, ctx.Err(), errdefs.ErrUnavailable)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watching pod %s: the watch ended: %w", s.name, errdefs.ErrUnavailable)
			}
			switch ev.Type {
			case watch.Deleted:
				return fmt.Errorf("pod %s was deleted before it ran: %w", s.name, errdefs.ErrUnavailable)
			case watch.Error:
				return fmt.Errorf("watching pod %s: %v: %w", s.name, ev.Object, errdefs.ErrUnavailable)
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if done, err := running(p, s.d.registry != nil); done {
				return s.started(p, err)
			}
		}
	}
}

// started notes the cgroup of running pod p's container, where this host
// is its node (see nodeCgroup): there the OOM kill of any of its processes
// is counted, as on the local tiers. It passes err on.
func (s *sbx) started(p *corev1.Pod, err error) error {
	if err == nil {
		s.Guest.Cgroup = nodeCgroup("", p)
	}
	return err
}

// stuck are the reasons of a waiting container that do not pass by
// themselves, besides a failed pull (pullFailure).
var stuck = map[string]bool{
	"ErrImageNeverPull": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

// running reports whether p's container has left the waiting state, and
// the error if that is not running; registry tells whether the driver
// pulls its images from one (see pullFailure).
func running(p *corev1.Pod, registry bool) (bool, error) {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return true, fmt.Errorf("pod %s ended before it ran (%s: %s): %w", p.Name, p.Status.Reason, p.Status.Message, errdefs.ErrUnavailable)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name != containerName {
			continue
		}
		switch {
		case c.State.Running != nil:
			return true, nil
		case c.State.Terminated != nil:
			t := c.State.Terminated
			return true, fmt.Errorf("the container of pod %s ended (%s, exit code %d): %s: %w", p.Name, t.Reason, t.ExitCode, t.Message, errdefs.ErrUnavailable)
		case c.State.Waiting != nil:
			if err := pullFailure(p.Name, c.Image, c.State.Waiting, registry); err != nil {
				return true, err
			}
			if stuck[c.State.Waiting.Reason] {
				return true, fmt.Errorf("the container of pod %s cannot start (%s): %s: %w", p.Name, c.State.Waiting.Reason, c.State.Waiting.Message, errdefs.ErrUnavailable)
			}
		}
	}
	return false, nil
}

// attach opens the attach stream of the pod's container in a goroutine:
// WebSocket, or SPDY where the API server refuses the upgrade.
func (s *sbx) attach() error {
	u := s.d.cs.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(s.d.cfg.Namespace).Name(s.name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: containerName, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec).
		URL()
	ws, err := remotecommand.NewWebSocketExecutor(s.d.rest, "GET", u.String())
	if err != nil {
		return fmt.Errorf("attaching to pod %s: %v: %w", s.name, err, errdefs.ErrUnavailable)
	}
	spdy, err := remotecommand.NewSPDYExecutor(s.d.rest, "POST", u)
	if err != nil {
		return fmt.Errorf("attaching to pod %s: %v: %w", s.name, err, errdefs.ErrUnavailable)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("attaching to pod %s: %v: %w", s.name, err, errdefs.ErrUnavailable)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s.stdin, s.stdout = inW, outR
	s.stderr = &sandboxkit.BoundedBuffer{Max: 16 << 10}
	s.Guest.In, s.Guest.Frames = inW, bufio.NewReaderSize(outR, 64<<10)
	s.streamDone = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.streamDone)
		// The stream's framing is the API server's and the kubelet's;
		// the guest's frames inside it are checked by guest.ReadFrame.
		err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: endOnClose{inR}, Stdout: outW, Stderr: s.stderr})
		if err == nil {
			err = io.EOF
		}
		if ctx.Err() == nil {
			// The stream ended with the container, not by our hand:
			// how it ended is read before anyone sees the end (and kills
			// the pod, whose status then goes with it).
			s.ending(ctx)
		}
		outW.CloseWithError(err)
		inR.CloseWithError(errors.Join(err, io.ErrClosedPipe))
	}()
	return nil
}

// endOnClose is the guest's stdin as the stream reads it: once the stream
// has ended (and closed the pipe, so that the guest's writer fails rather
// than blocks), the stream's own copier, which may still be reading, sees
// the end of the input rather than an error it would log.
type endOnClose struct{ r *io.PipeReader }

func (e endOnClose) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if errors.Is(err, io.ErrClosedPipe) {
		err = io.EOF
	}
	return n, err
}

// kill deletes the pod with a grace period of 1 s, which ends its
// processes and the stream. It does not wait. Not 0: a forced deletion
// removes the object before the kubelet has stopped the container, after
// which Leftovers would say clean while it still runs.
func (s *sbx) kill(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	grace := int64(1)
	_ = s.d.cs.CoreV1().Pods(s.d.cfg.Namespace).Delete(ctx, s.name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
}

// ending waits (within 5 s, or until ctx ends) for the kubelet to report
// the ended container's terminated state, and notes its reason.
func (s *sbx) ending(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if reason, ok := s.terminated(ctx); ok {
		s.endMu.Lock()
		s.endReason = reason
		s.endMu.Unlock()
	}
}

// terminated polls the pod until its container has ended, and returns
// the kubelet's reason ("OOMKilled", "Error", "Completed"); false if ctx
// ends first or the pod is gone.
func (s *sbx) terminated(ctx context.Context) (string, bool) {
	for {
		p, err := s.d.cs.CoreV1().Pods(s.d.cfg.Namespace).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return "", false
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Name == containerName && c.State.Terminated != nil {
				return c.State.Terminated.Reason, true
			}
		}
		select {
		case <-ctx.Done():
			return "", false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// diedOfOOM reports whether the kubelet saw the container OOM-killed: the
// reason noted when the stream ended by itself (ending), or else what the
// pod says within 5 s.
func (s *sbx) diedOfOOM(ctx context.Context) bool {
	s.endMu.Lock()
	reason := s.endReason
	s.endMu.Unlock()
	if reason == "" {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		reason, _ = s.terminated(ctx)
	}
	return reason == "OOMKilled"
}

// Destroy deletes the pod, waits until the API server no longer has it and
// closes the attach stream. It is idempotent; a call after a failure tries
// again.
func (s *sbx) Destroy(ctx context.Context) error {
	return s.destroyed.Do(func() error { return s.destroy(ctx) })
}

func (s *sbx) destroy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if s.stdin != nil {
		// The guest exits at the end of its input (stdinOnce): its
		// container has ended, or soon will, when the kubelet stops it.
		s.stdin.Close()
	}
	// A grace period, not a forced deletion: the API server keeps the pod
	// until the kubelet has stopped its containers, so that a pod that is
	// gone has nothing left running on the node.
	err := s.d.deletePod(ctx, s.name, s.uid, 1)
	if s.cancel != nil {
		// The stream ends with the container; a stream that does not is
		// cut.
		select {
		case <-s.streamDone:
		case <-time.After(100 * time.Millisecond):
		}
		s.cancel()
		// Unblock the stream if it is writing output nobody reads.
		s.stdout.Close()
		<-s.streamDone
		// An Exec in flight sees the stream end and returns soon.
		s.Guest.MarkGone()
	}
	return err
}
