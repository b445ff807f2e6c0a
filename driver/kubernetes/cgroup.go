package kubernetes

import (
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// nodeCgroup finds the cgroup of pod p's container on this host, for a
// daemon that runs on the node of its pods (a single-node cluster, as the
// test cluster of scripts/kube): the kubelet names it after the pod's UID
// and the container's ID, both unique, under its cgroup root (cgroupfs:
// .../kubepods[/<qos>]/pod<uid>/<id>; systemd:
// .../kubepods[-<qos>].slice/kubepods-[<qos>-]pod<uid>.slice/
// cri-containerd-<id>.scope). Elsewhere (a daemon in a pod, or on another
// machine) it returns the zero cgroup, "not visible here", as driver/docker
// does for a remote engine: an OOM kill is then known only from the
// container's terminated reason, which tells PID 1's only.
func nodeCgroup(root string, p *corev1.Pod) sandboxkit.Cgroup {
	var cid string
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == containerName {
			_, cid, _ = strings.Cut(c.ContainerID, "://")
		}
	}
	uid := string(p.UID)
	if cid == "" || uid == "" || strings.ContainsAny(cid+uid, "/*?[\\") {
		return sandboxkit.Cgroup{}
	}
	if root == "" {
		root = sandboxkit.CgroupRoot
	}
	leaves := []string{
		filepath.Join("pod"+uid, cid),
		filepath.Join("kubepods-*pod"+strings.ReplaceAll(uid, "-", "_")+".slice", "cri-containerd-"+cid+".scope"),
	}
	for _, v2 := range []bool{false, true} {
		base := filepath.Join(root, "memory")
		if v2 {
			base = root
		}
		for _, prefix := range []string{"kubepods*", "*/kubepods*", "*/*/kubepods*"} {
			for _, qos := range []string{"", "*"} {
				for _, leaf := range leaves {
					m, _ := filepath.Glob(filepath.Join(base, prefix, qos, leaf))
					if len(m) != 1 {
						continue
					}
					cg := sandboxkit.Cgroup{V2: v2, Path: strings.TrimPrefix(m[0], base), Root: root}
					file := "memory.oom_control"
					if v2 {
						file = "memory.events"
					}
					if _, err := os.Stat(filepath.Join(cg.MemoryDir(), file)); err == nil {
						return cg
					}
				}
			}
		}
	}
	return sandboxkit.Cgroup{}
}
