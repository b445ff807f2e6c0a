package kubernetes

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestNodeCgroup lays out the kubelet's cgroup trees (cgroupfs and
// systemd, v1 and v2) and finds the container's cgroup in each, and none
// for another pod's container or where the tree is not this host's.
func TestNodeCgroup(t *testing.T) {
	const uid, cid = "c85e1841-4ee9-4c28-978b-b9cb83651115", "0123abcd"
	pod := &corev1.Pod{}
	pod.UID = types.UID(uid)
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, ContainerID: "containerd://" + cid}}
	for _, tc := range []struct {
		name, dir, file string
		v2              bool
	}{
		{"v1 cgroupfs guaranteed", "memory/stockade-kube/kubepods/pod" + uid + "/" + cid, "memory.oom_control", false},
		{"v1 cgroupfs burstable", "memory/kubepods/burstable/pod" + uid + "/" + cid, "memory.oom_control", false},
		{"v2 systemd", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + "c85e1841_4ee9_4c28_978b_b9cb83651115.slice/cri-containerd-" + cid + ".scope", "memory.events", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, tc.dir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte("oom_kill 2\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cg := nodeCgroup(root, pod)
			if cg.MemoryDir() != dir || cg.V2 != tc.v2 || cg.OOMKills() != 2 {
				t.Errorf("got %+v (memory dir %q, %d OOM kills), want %s with 2", cg, cg.MemoryDir(), cg.OOMKills(), dir)
			}
			other := pod.DeepCopy()
			other.UID = "ffffffff-4ee9-4c28-978b-b9cb83651115"
			if cg := nodeCgroup(root, other); cg.Path != "" {
				t.Errorf("another pod's container: got %+v, want the zero cgroup", cg)
			}
		})
	}
	if cg := nodeCgroup(t.TempDir(), pod); cg.Path != "" {
		t.Errorf("an empty tree: got %+v, want the zero cgroup", cg)
	}
}
