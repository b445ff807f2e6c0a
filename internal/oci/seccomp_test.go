package oci

import (
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/stockade-sh/stockade/sandbox/profile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenKernel is the kernel version the golden profiles are built for;
// the profile does not depend on it past 4.8 (only ptrace's rule has a
// kernel condition, and ptrace is denied).
var goldenKernel = [2]uint64{6, 1}

// TestSeccompPerArchitecture builds the profile for every architecture the
// guest is built for and checks it against its golden file and its
// properties: only the native architecture (any other is killed by the
// runtime), only system calls that architecture has, the essentials
// allowed, and every denied system call the architecture has refused.
func TestSeccompPerArchitecture(t *testing.T) {
	for _, goarch := range slices.Sorted(maps.Keys(nativeArch)) {
		t.Run(goarch, func(t *testing.T) {
			p, err := buildSeccomp(profile.Default().Seccomp, goarch, goldenKernel)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("testdata", "seccomp_"+goarch+".json"), p)

			if want := []specs.Arch{nativeArch[goarch]}; !slices.Equal(p.Architectures, want) {
				t.Errorf("architectures: got %v, want %v", p.Architectures, want)
			}
			if p.DefaultAction != specs.ActErrno {
				t.Errorf("default action: got %s, want %s", p.DefaultAction, specs.ActErrno)
			}
			allowed := map[string]bool{}
			for _, r := range p.Syscalls {
				for _, n := range r.Names {
					if _, ok := slices.BinarySearch(syscallNames[goarch], n); !ok {
						t.Errorf("rule %v names %s, which %s does not have", r.Names, n, goarch)
					}
					if r.Action == specs.ActAllow {
						allowed[n] = true
					}
				}
			}
			for _, n := range []string{"read", "write", "openat", "execve", "exit_group", "mmap", "clone", "futex", "rt_sigreturn", "socket", "ioctl", "wait4"} {
				if !allowed[n] {
					t.Errorf("%s is not allowed", n)
				}
			}
			var denied []string
			for _, n := range profile.Default().Seccomp.Denied {
				if _, ok := slices.BinarySearch(syscallNames[goarch], n); !ok {
					continue
				}
				denied = append(denied, n)
				if allowed[n] {
					t.Errorf("denied system call %s is allowed", n)
				}
			}
			if len(denied) < len(profile.Default().Seccomp.Denied)-2 {
				t.Errorf("%s has only %v of the denied system calls %v", goarch, denied, profile.Default().Seccomp.Denied)
			}
			if i := slices.IndexFunc(p.Syscalls, func(r specs.LinuxSyscall) bool { return slices.Contains(r.Names, "clone3") }); i < 0 || p.Syscalls[i].Action != specs.ActErrno {
				t.Errorf("clone3 has no ENOSYS rule")
			}
		})
	}
}

// TestSeccompArchitectureSpecifics checks the system calls that exist on
// one of the architectures only.
func TestSeccompArchitectureSpecifics(t *testing.T) {
	for _, tt := range []struct {
		goarch        string
		allowed, none []string // none: not named at all
	}{
		{goarch: "amd64", allowed: []string{"open", "fork", "stat", "arch_prctl", "modify_ldt"}, none: []string{"socketcall", "mmap2", "waitpid"}},
		{goarch: "arm64", allowed: []string{"openat", "newfstatat"}, none: []string{"open", "fork", "stat", "arch_prctl", "modify_ldt", "cacheflush", "socketcall"}},
	} {
		t.Run(tt.goarch, func(t *testing.T) {
			p, err := buildSeccomp(profile.Default().Seccomp, tt.goarch, goldenKernel)
			if err != nil {
				t.Fatal(err)
			}
			named := map[string]specs.LinuxSeccompAction{}
			for _, r := range p.Syscalls {
				for _, n := range r.Names {
					named[n] = r.Action
				}
			}
			for _, n := range tt.allowed {
				if named[n] != specs.ActAllow {
					t.Errorf("%s: got %q, want allowed", n, named[n])
				}
			}
			for _, n := range tt.none {
				if a, ok := named[n]; ok {
					t.Errorf("%s: got %q, want not named", n, a)
				}
			}
		})
	}
}

func TestSeccompHost(t *testing.T) {
	got, err := Seccomp()
	if _, ok := nativeArch[runtime.GOARCH]; !ok {
		if err == nil {
			t.Fatalf("got a profile for %s, want an error", runtime.GOARCH)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	want, _ := buildSeccomp(profile.Default().Seccomp, runtime.GOARCH, hostKernel())
	if a, b := mustJSON(t, got), mustJSON(t, want); a != b {
		t.Errorf("Seccomp differs from the profile for %s", runtime.GOARCH)
	}
	if _, err := buildSeccomp(profile.Default().Seccomp, "riscv64", goldenKernel); err == nil {
		t.Errorf("riscv64: got a profile, want an error")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// golden compares v's JSON with the file, or rewrites it with -update.
func golden(t *testing.T, file string, v any) {
	t.Helper()
	got := mustJSON(t, v)
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the generated profile; review and run go test ./internal/oci -update", file)
	}
}
