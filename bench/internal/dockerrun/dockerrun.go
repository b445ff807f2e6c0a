// Package dockerrun builds the `docker run` that the benchmarks compare
// Stockade with: python started directly as PID 1 of the image the docker
// driver imports, under the flags that express the driver's profile
// (driver/docker/profile.go): read-only root, /tmp tmpfs, no capabilities,
// no-new-privileges, Stockade's seccomp profile, pids, memory without swap,
// half a CPU, nobody:nogroup, no network. No guest agent, no code
// delivery.
//
//	argv, cleanup, err := dockerrun.Argv(ctx, "docker", host, dataDir, "-c", "print(1)")
package dockerrun

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// Argv imports the python image into the Docker Engine at host (as the
// docker driver does) and returns the argv of a `docker run` of python
// with args under the driver's profile; cleanup removes its files.
func Argv(ctx context.Context, dockerCLI, host, dataDir string, args ...string) (argv []string, cleanup func(), err error) {
	cfg := config.Default()
	cfg.DataDir, cfg.DockerHost = dataDir, host
	img, err := image.Open(cfg.ImageDir()).Resolve("python")
	if err != nil {
		return nil, nil, err
	}
	// The image `docker run` starts is the one the driver imports, tagged
	// by its digest and the guest's.
	guest, err := guestbin.Install(cfg.BinDir())
	if err != nil {
		return nil, nil, err
	}
	dk, err := docker.New(docker.Config{Host: host, GuestPath: guest})
	if err != nil {
		return nil, nil, err
	}
	defer dk.Close()
	if err := dk.Health(ctx); err != nil {
		return nil, nil, err
	}
	tag, err := dk.ImportImage(ctx, img)
	if err != nil {
		return nil, nil, err
	}
	sc, err := oci.Seccomp()
	if err != nil {
		return nil, nil, err
	}
	filter, err := json.Marshal(sc)
	if err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-docker-")
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	seccompFile := filepath.Join(tmp, "seccomp.json")
	if err := os.WriteFile(seccompFile, filter, 0o644); err != nil {
		cleanup()
		return nil, nil, err
	}
	l := sandbox.DefaultLimits()
	l.CPU = docker.DefaultCPU
	user := profile.Default().User
	argv = []string{dockerCLI, "--host", host, "run", "--rm",
		"--network=none", "--read-only",
		"--tmpfs", "/tmp:rw,exec,nosuid,nodev,mode=1777,size=" + strconv.FormatInt(l.TmpSize, 10),
		"--cap-drop=ALL",
		"--security-opt", "no-new-privileges",
		"--security-opt", "seccomp=" + seccompFile,
		"--pids-limit", strconv.FormatInt(l.Pids, 10),
		"--memory", strconv.FormatInt(l.Memory, 10), "--memory-swap", strconv.FormatInt(l.Memory, 10), "--memory-swappiness", "0",
		"--cpus", strconv.FormatFloat(l.CPU, 'f', -1, 64),
		"--user", fmt.Sprintf("%d:%d", user.UID, user.GID),
		"--ipc", "private", "--cgroupns", "private",
		"--dns", "127.0.0.1", "--dns-search", ".",
		"--ulimit", "nofile=1024:1024", "--ulimit", "core=0:0",
		"--log-driver", "none",
		"--hostname", "sandbox", "--workdir", "/",
		"--entrypoint", "/usr/bin/python3", tag,
	}
	return append(argv, args...), cleanup, nil
}
