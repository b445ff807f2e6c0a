package netns

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
)

const script = `
import socket, urllib.request, sys
print("resolv:", open("/etc/resolv.conf").read().strip().replace("\n"," | "))
try:
    print("A:", socket.gethostbyname("api.allowed.test"))
except Exception as e:
    print("A failed:", e)
try:
    print("evil:", socket.gethostbyname("evil.test"))
except Exception as e:
    print("evil refused:", e)
try:
    print("GET:", urllib.request.urlopen("http://api.allowed.test:%s/" % sys.argv[1], timeout=5).read().decode())
except Exception as e:
    print("GET failed:", e)
for addr in [("%s" % sys.argv[2], 9999), ("1.1.1.1", 443)]:
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect(addr); print("direct connect", addr, "WORKED")
    except Exception as e:
        print("direct connect", addr, "failed:", e)
`

func TestZZRuntimes(t *testing.T) {
	m := newTestManager(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "upstream saw %s", r.Host) }))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	rootfs := "/var/lib/stockade/images/sha256/102c4e427599bf0bef8f998317710b01e190a4fc2e86dbe688f3eb3e75523b64/rootfs"
	for _, rt := range []struct {
		name string
		args []string
		k    oci.Kernel
	}{
		{"runc", []string{"runc"}, oci.HostKernel},
		{"runsc", []string{"runsc", "--platform=systrap", "--network=sandbox", "--oci-seccomp", "--overlay2=none", "--host-uds=none"}, oci.UserSpaceKernel},
	} {
		t.Run(rt.name, func(t *testing.T) {
			n := create(t, m, 8080)
			p, _ := egress.New(egress.Config{TestOverride: egress.NewTestOverride(t, map[string][]netip.Addr{"api.allowed.test": {netip.MustParseAddr("127.0.0.1")}}),
				OnDecision: func(d egress.Decision) { t.Logf("decision: %+v", d) }})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l, _ := net.Listen("tcp", netip.AddrPortFrom(n.HostAddr, 8080).String())
			g, _ := p.Start(ctx, egress.Policy{Sandbox: n.Name, Allow: []string{"api.allowed.test"}, Ports: []int{upPort}}, egress.Listener{Listener: l, Port: upPort})
			defer g.Close()
			udp, _ := net.ListenPacket("udp", netip.AddrPortFrom(n.HostAddr, 53).String())
			tcp, _ := net.Listen("tcp", netip.AddrPortFrom(n.HostAddr, 53).String())
			d, _ := egress.ServeDNS(ctx, egress.DNSConfig{Sandbox: n.Name, Allow: []string{"api.allowed.test"}, Answer: n.HostAddr,
				OnDecision: func(d egress.Decision) { t.Logf("dns: %+v", d) }}, udp, tcp)
			defer d.Close()

			dir := t.TempDir()
			resolv := filepath.Join(dir, "resolv.conf")
			os.WriteFile(resolv, []byte("nameserver "+n.HostAddr.String()+"\noptions ndots:0 attempts:2 timeout:2\n"), 0o644)
			s, err := oci.Build(oci.Options{ID: "x", Spec: sandbox.Spec{Image: sandbox.Image{Rootfs: rootfs}}, Limits: sandbox.DefaultLimits(), GuestPath: "/bin/true", CgroupsPath: "/stockade/zz-" + rt.name, Kernel: rt.k})
			if err != nil {
				t.Fatal(err)
			}
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
			for i := range s.Linux.Namespaces {
				if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
					s.Linux.Namespaces[i].Path = n.Path
				}
			}
			s.Process.Args = []string{"/usr/bin/python3", "-c", script, fmt.Sprint(upPort), n.HostAddr.String()}
			s.Process.Env = []string{"PATH=/usr/bin:/bin"}
			bundle := filepath.Join(dir, "bundle")
			if err := oci.WriteBundle(bundle, s); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(dir, "state")
			args := append([]string{rt.args[0], "--root", state}, rt.args[1:]...)
			args = append(args, "run", "-b", bundle, "zz-"+rt.name)
			cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer ccancel()
			t0 := time.Now()
			out, err := exec.CommandContext(cctx, args[0], args[1:]...).CombinedOutput()
			t.Logf("%s (%v, %v):\n%s", rt.name, time.Since(t0), err, out)
			exec.Command(rt.args[0], "--root", state, "delete", "-f", "zz-"+rt.name).Run()
		})
	}
}
