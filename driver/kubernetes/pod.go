package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// The labels and annotations of every pod of this driver.
const (
	// LabelManaged marks the pods (and the network policy) of this driver;
	// its value is ManagedBy.
	LabelManaged = "app.kubernetes.io/managed-by"
	ManagedBy    = "stockade"
	// LabelSandbox holds the sandbox's ID, or a digest of it where the ID
	// is not a valid label value (see sandboxLabel).
	LabelSandbox = "stockade.sh/sandbox"
	// LabelOwner holds Config.Owner: the daemon whose pods they are.
	LabelOwner = "stockade.sh/owner"
	// AnnotationID holds the sandbox's ID as it is.
	AnnotationID = "stockade.sh/id"
	// AnnotationLabels holds the Spec's labels as a JSON object: Reap
	// matches them. Label values of Kubernetes are too narrow for them
	// (63 characters of a small alphabet).
	AnnotationLabels = "stockade.sh/labels"
	// PolicyName is the namespace's deny-all network policy.
	PolicyName = "stockade-deny-all"
	// containerName is the pod's one container.
	containerName = "sandbox"
	// TerminationLogDir and TerminationLogPath are where the pod's
	// termination message file is mounted. The kubelet bind-mounts a file
	// of the node's disk, mode 0666, read-write into every container at
	// its terminationMessagePath, whatever the pod asks (by default
	// /dev/termination-log): a sandbox could fill the node's disk through
	// it. Every image the driver writes (WriteImageArchive) has
	// TerminationLogDir as root's, mode 0700, so the sandbox's user, with
	// no capability, cannot reach the file below it: the mount is there,
	// but no path to it resolves (TestClusterTerminationLog).
	TerminationLogDir  = profile.KubeletDir
	TerminationLogPath = TerminationLogDir + "/termination-log"
)

// gate is the container's command: it waits for the host's first line on
// stdin and then replaces itself with the guest, which becomes PID 1. The
// guest greets the host as soon as it starts, and an attach stream carries
// only what a container writes after the attach: the host attaches first,
// then sends the line, so the greeting is not lost.
var gate = []string{"/bin/sh", "-c", "read -r _ && exec " + profile.GuestPath}

// gateNProc is gate that first sets RLIMIT_NPROC to n (soft and hard; a
// non-root user may lower it): the pids limit of a gVisor pod's program,
// as the local gvisor tier sets it (internal/oci, UserSpaceKernel). The
// Sentry counts only the sandbox's tasks against it; the pod's pids cgroup
// (the kubelet's podPidsLimit) also counts the Sentry's own threads and
// so needs headroom above n. On runc the limit would count every process
// of the uid on the node, other sandboxes' too, so it is not set there.
// dash (Debian's /bin/sh) calls the option -p, bash and busybox -u.
func gateNProc(n int64) []string {
	v := strconv.FormatInt(n, 10)
	return []string{"/bin/sh", "-c", "{ ulimit -u " + v + " 2>/dev/null || ulimit -p " + v + "; } && read -r _ && exec " + profile.GuestPath}
}

// labelValue matches a valid Kubernetes label value that is not empty.
var labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// podNamePart matches an ID that can follow "stockade-" in a pod name.
var podNamePart = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,52}[a-z0-9])?$`)

// digest12 is the first 24 hex digits of s's sha256.
func digest12(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}

// PodName is the name of sandbox id's pod: "stockade-" and the ID where it
// is a DNS label, else "stockade-h" and a digest of it.
func PodName(id string) string {
	if podNamePart.MatchString(id) {
		return "stockade-" + id
	}
	return "stockade-h" + digest12(id)
}

// sandboxLabel is the value of LabelSandbox for id.
func sandboxLabel(id string) string {
	if labelValue.MatchString(id) {
		return id
	}
	return "h" + digest12(id)
}

// podConfig is what buildPod needs besides the Spec.
type podConfig struct {
	ID           string
	Namespace    string
	Owner        string
	Image        string
	PullPolicy   corev1.PullPolicy
	RuntimeClass string
	// Sysctls are set for the pod; empty under gVisor, whose netstack
	// applies none (see the profile's low-ports difference).
	Sysctls bool
	// Seccomp names the node's profile (Localhost) to use instead of
	// RuntimeDefault: see Config.Seccomp.
	Seccomp string
	// NProc, when set, makes the gate set RLIMIT_NPROC to the limits'
	// Pids (gVisor: see gateNProc).
	NProc bool
	// Lifetime, when set, is the pod's ActiveDeadlineSeconds (rounded
	// up): the kubelet ends a pod that a lost daemon left (see
	// podLifetime).
	Lifetime time.Duration
}

// lifetimeMargin is added to a pod's expected lifetime: its deadline is a
// backstop for a pod nobody deletes, never the bound of a live one.
const lifetimeMargin = 10 * time.Minute

// podLifetime is how long the pod of spec may run at most: a session's
// (a Spec with a Workspace or a Deadline) until its Deadline, or
// sessionCeiling without one; a one-shot sandbox's for its Exec's timeout;
// each plus the wait for it to run (ready) and lifetimeMargin.
func podLifetime(spec sandbox.Spec, l sandbox.Limits, ready, sessionCeiling time.Duration, now time.Time) time.Duration {
	life := l.Timeout
	switch {
	case !spec.Deadline.IsZero():
		life = max(spec.Deadline.Sub(now), 0)
	case spec.Workspace > 0:
		life = sessionCeiling
	}
	return life + ready + lifetimeMargin
}

// buildPod expresses profile p in a pod's terms for a sandbox with limits
// l: one container, the guest as PID 1, no service account token, no host
// namespace or path the spec could leave out, the profile's user, no
// capability, no privilege escalation, Stockade's seccomp filter (or the
// runtime's default), a read-only root and memory-backed /tmp (and /workspace).
func buildPod(p profile.Profile, c podConfig, spec sandbox.Spec, l sandbox.Limits) (*corev1.Pod, error) {
	switch {
	case spec.Network != sandbox.NetworkNone:
		return nil, errdefs.Publicf("the kubernetes driver gives a sandbox no network (egress through Stockade's proxy in a cluster is not built yet), so a tool with egress cannot run on it: %w", errdefs.ErrInvalidArgument)
	case len(spec.Mounts) > 0:
		return nil, errdefs.Publicf("the kubernetes driver mounts no host directory into a pod, so a tool with data mounts cannot run on it: %w", errdefs.ErrInvalidArgument)
	case len(p.Capabilities) > 0:
		return nil, fmt.Errorf("a pod cannot give a non-root user capabilities %v in every set: %w", p.Capabilities, errdefs.ErrInvalidArgument)
	case !p.ReadOnlyRoot || !p.NoNewPrivs:
		return nil, fmt.Errorf("the kubernetes driver builds pods with a read-only root and no privilege escalation only: %w", errdefs.ErrInvalidArgument)
	}
	labels := map[string]string{LabelManaged: ManagedBy, LabelSandbox: sandboxLabel(c.ID)}
	if c.Owner != "" {
		labels[LabelOwner] = c.Owner
	}
	userLabels := spec.Labels
	if userLabels == nil {
		userLabels = map[string]string{}
	}
	lj, err := json.Marshal(userLabels)
	if err != nil {
		return nil, fmt.Errorf("encoding labels: %w", err)
	}
	uid, gid := int64(p.User.UID), int64(p.User.GID)
	yes, no := true, false
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	for i, s := range p.Scratch {
		if s.SessionOnly && spec.Workspace == 0 {
			continue
		}
		size := l.TmpSize
		if s.SessionOnly {
			size = spec.Workspace
		}
		name := "scratch-" + strconv.Itoa(i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(size, resource.BinarySI)},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: s.Path})
	}
	var sysctls []corev1.Sysctl
	if c.Sysctls {
		for _, s := range p.Network.Sysctls {
			sysctls = append(sysctls, corev1.Sysctl{Name: s.Name, Value: s.Value})
		}
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(l.CPU*1000+0.5), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(l.Memory, resource.BinarySI),
	}
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	if c.Seccomp != "" {
		name := c.Seccomp
		seccomp = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: &name}
	}
	grace := int64(0)
	command := gate
	if c.NProc && l.Pids > 0 {
		command = gateNProc(l.Pids)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(c.ID),
			Namespace:   c.Namespace,
			Labels:      labels,
			Annotations: map[string]string{AnnotationID: c.ID, AnnotationLabels: string(lj)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         &no,
			Hostname:                      p.Hostname,
			TerminationGracePeriodSeconds: &grace,
			// The cluster's resolvers stay out of the sandbox's
			// resolv.conf, as Docker's do (the docker tier).
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}, Searches: []string{}},
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser:      &uid,
				RunAsGroup:     &gid,
				RunAsNonRoot:   &yes,
				SeccompProfile: seccomp,
				Sysctls:        sysctls,
			},
			Volumes: volumes,
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           c.Image,
				ImagePullPolicy: c.PullPolicy,
				Command:         command,
				WorkingDir:      "/",
				// The guest speaks the framed protocol on stdin and
				// stdout; stdin closes when the host's attach ends.
				Stdin:     true,
				StdinOnce: true,
				TTY:       false,
				// The guest's stdout is the protocol: the kubelet logs it
				// (bounded by its log rotation); no message file is read,
				// and its mount is out of the sandbox's reach
				// (TerminationLogPath).
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				TerminationMessagePath:   TerminationLogPath,
				VolumeMounts:             mounts,
				Resources:                corev1.ResourceRequirements{Limits: res, Requests: res},
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                &uid,
					RunAsGroup:               &gid,
					RunAsNonRoot:             &yes,
					Privileged:               &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           seccomp,
				},
			}},
		},
	}
	if c.RuntimeClass != "" {
		rc := c.RuntimeClass
		pod.Spec.RuntimeClassName = &rc
	}
	if c.Lifetime > 0 {
		secs := int64((c.Lifetime + time.Second - 1) / time.Second)
		pod.Spec.ActiveDeadlineSeconds = &secs
	}
	return pod, nil
}

// denyAll is the namespace's network policy: every pod of this driver
// neither sends nor receives anything (no rule admits any peer). A cluster
// whose network plugin enforces no policies ignores it: see the package's
// doc.
func denyAll(namespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: PolicyName, Namespace: namespace, Labels: map[string]string{LabelManaged: ManagedBy}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManaged: ManagedBy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// podLabels reads the Spec's labels back from a pod's annotation; a pod
// whose annotation does not decode has none.
func podLabels(pod *corev1.Pod) map[string]string {
	var m map[string]string
	if err := json.Unmarshal([]byte(pod.Annotations[AnnotationLabels]), &m); err != nil {
		return nil
	}
	return m
}
