package kubernetes

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// returnsWithin runs f and fails the test if it has not returned within a
// minute: the bounds under test are milliseconds, so only a call that
// waits without a bound (the failure looked for) comes near it.
func returnsWithin(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not return: it waits without a bound", what)
	}
}

// hangingServer is an API server that answers nothing: each request waits
// until its client gives up, except those answer says it answers.
func hangingServer(t *testing.T, answer func(r *http.Request) bool) *httptest.Server {
	t.Helper()
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server see the client go.
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if answer != nil && answer(r) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
			return
		}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // first: Close waits for the handlers
	return srv
}

// boundedDriver is a driver whose client (built by the test, with no
// Timeout of its own) talks to srv: only the driver's own bounds end a
// call that srv does not answer.
func boundedDriver(t *testing.T, srv *httptest.Server) *Driver {
	t.Helper()
	cfg := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{
		Namespace: "sandboxes", Tier: sandbox.TierGVisor, Client: cs, REST: cfg, CallTimeout: 100 * time.Millisecond,
		ImageRef: func(sandbox.Image) (string, corev1.PullPolicy, error) {
			return "stockade.invalid/shell:x", corev1.PullNever, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReapTerminating: a pod whose deletion the API server accepts but
// that stays (Terminating, on a node that does not answer) does not hold
// Reap, on a context without a deadline, beyond its short wait; a pod that
// cannot be deleted does not stop Reap from deleting the others, and its
// error is returned with them.
func TestReapTerminating(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	d.reapWait = 50 * time.Millisecond
	plant(t, cs, "", "stuck", nil)
	plant(t, cs, "", "refused", nil)
	plant(t, cs, "", "gone", nil)
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a.(k8stesting.DeleteAction).GetName() {
		case PodName("stuck"):
			return true, nil, nil // accepted, but the pod stays
		case PodName("refused"):
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, PodName("refused"), errors.New("no"))
		}
		return false, nil, nil
	})
	var reaped []string
	var err error
	returnsWithin(t, "Reap", func() { reaped, err = d.Reap(context.Background(), nil) })
	if want := []string{"gone", "stuck"}; !slices.Equal(reaped, want) {
		t.Errorf("Reap: %v, want %v", reaped, want)
	}
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("Reap's error: %v, want the refused pod's ErrPermissionDenied", err)
	}
	if left := d.Leftovers(t.Context(), "gone"); len(left) > 0 {
		t.Errorf("Reap stopped at the refused pod: %v left", left)
	}
}

// TestReapBounded: an API server that does not answer fails Reap, on a
// context without a deadline, with ErrUnavailable (which the daemon's
// start passes over) once the call's bound passes.
func TestReapBounded(t *testing.T) {
	d := boundedDriver(t, hangingServer(t, nil))
	var err error
	returnsWithin(t, "Reap", func() { _, err = d.Reap(context.Background(), nil) })
	if !errdefs.IsUnavailable(err) {
		t.Errorf("Reap of a server that does not answer: %v, want ErrUnavailable", err)
	}
}

// TestAwaitGoneUnavailable: a pod that is not gone when the wait's
// deadline passes is ErrUnavailable, not a bare context error.
func TestAwaitGoneUnavailable(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	plant(t, cs, "", "stays", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := d.awaitGone(ctx, PodName("stays"), "uid-stays"); !errdefs.IsUnavailable(err) {
		t.Errorf("awaitGone of a pod that stays: %v, want ErrUnavailable", err)
	}
}

// TestClientTimeout: the clients New builds bound every call but the
// watch (an http.Client's Timeout would cut a watch that waits longer for
// a pod to run) and the attach stream.
func TestClientTimeout(t *testing.T) {
	d, err := New(Config{Namespace: "sandboxes", Tier: sandbox.TierGVisor, GuestPath: "/x", REST: &rest.Config{Host: "https://cluster.invalid"}})
	if err != nil {
		t.Fatal(err)
	}
	timeout := func(cs kubernetes.Interface) time.Duration {
		return cs.CoreV1().RESTClient().(*rest.RESTClient).Client.Timeout
	}
	if got := timeout(d.cs); got != DefaultCallTimeout {
		t.Errorf("the client's Timeout: %s, want %s", got, DefaultCallTimeout)
	}
	if got := timeout(d.watch); got != 0 {
		t.Errorf("the watch's client's Timeout: %s, want none", got)
	}
	if d.rest.Timeout != 0 {
		t.Errorf("the attach stream's configuration has Timeout %s, want none", d.rest.Timeout)
	}
}

// TestCreateBounded: Create, on a context without a deadline, fails with
// ErrUnavailable when the API server does not answer the creation of the
// network policy, or of the pod, within the call's bound.
func TestCreateBounded(t *testing.T) {
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: "/x"}
	for name, answer := range map[string]func(*http.Request) bool{
		"policy": nil,
		"pod": func(r *http.Request) bool {
			return r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/networkpolicies")
		},
	} {
		d := boundedDriver(t, hangingServer(t, answer))
		var err error
		returnsWithin(t, "Create", func() { _, err = d.Create(context.Background(), sandbox.Spec{Image: img}) })
		if !errdefs.IsUnavailable(err) {
			t.Errorf("%s: Create with a server that does not answer: %v, want ErrUnavailable", name, err)
		}
		if d.policyOK != (answer != nil) {
			t.Errorf("%s: the policy was made: %v (%v)", name, d.policyOK, err)
		}
	}
}
