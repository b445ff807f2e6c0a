package conformance

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of the program's identity and privileges: capability sets,
// no_new_privs, seccomp mode, uids and groups.

type valueReport struct {
	errno
	Value json.RawMessage `json:"value"`
}

type capsReport struct {
	Status map[string]string `json:"status"`
	Capget struct {
		errno
		Effective   string `json:"effective"`
		Permitted   string `json:"permitted"`
		Inheritable string `json:"inheritable"`
	} `json:"capget"`
	CapsChecked int         `json:"caps_checked"`
	Bounding    valueReport `json:"bounding"`
	Ambient     valueReport `json:"ambient"`
	NoNewPrivs  valueReport `json:"no_new_privs"`
	Seccomp     valueReport `json:"seccomp"`
	UID         int         `json:"uid"`
	EUID        int         `json:"euid"`
	GID         int         `json:"gid"`
	EGID        int         `json:"egid"`
	Groups      []int       `json:"groups"`
}

func (s *suite) credentials(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r capsReport
	b.report(t, &r, "caps")
	t.Logf("caps report: status %v, seccomp %s, no_new_privs %s", r.Status, r.Seccomp.Value, r.NoNewPrivs.Value)
	// wantCaps is every capability set of the profile; Stockade's are
	// empty.
	wantCaps, err := s.p.CapabilityMask()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Capabilities", func(t *testing.T) {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			v, ok := r.Status[k]
			if k == "CapAmb" {
				s.expect(t, "status-ambient", ok, "/proc/self/status has no %s line", k)
			} else if !ok {
				t.Errorf("/proc/self/status has no %s line", k)
			}
			if ok && v != wantCaps {
				t.Errorf("/proc/self/status %s: got %s, want %s", k, v, wantCaps)
			}
		}
		c := r.Capget
		if c.Errno != 0 {
			t.Errorf("capget: got %s, want success", c.errno)
		}
		for name, v := range map[string]string{"effective": c.Effective, "permitted": c.Permitted, "inheritable": c.Inheritable} {
			if v != wantCaps {
				t.Errorf("capget %s: got %s, want %s", name, v, wantCaps)
			}
		}
		for name, v := range map[string]valueReport{"bounding (PR_CAPBSET_READ)": r.Bounding, "ambient (PR_CAP_AMBIENT_IS_SET)": r.Ambient} {
			if strings.HasPrefix(name, "ambient") {
				s.expect(t, "status-ambient", !v.is(syscall.EINVAL), "%s: got EINVAL, want success", name)
				if _, declared := s.difference("status-ambient"); declared {
					continue
				}
			}
			if v.Errno != 0 {
				t.Errorf("%s: got %s, want success", name, v.errno)
			} else if string(v.Value) != `"`+wantCaps+`"` {
				t.Errorf("%s: got %s, want %s", name, v.Value, wantCaps)
			}
		}
		if r.CapsChecked < 32 {
			t.Errorf("the bounding set was read for %d capabilities, want at least 32", r.CapsChecked)
		}
	})

	t.Run("NoNewPrivs", func(t *testing.T) {
		want := map[bool]string{true: "1", false: "0"}[s.p.NoNewPrivs]
		if r.NoNewPrivs.Errno != 0 || string(r.NoNewPrivs.Value) != want {
			t.Errorf("PR_GET_NO_NEW_PRIVS: got %s (%s), want %s", r.NoNewPrivs.Value, r.NoNewPrivs.errno, want)
		}
		v, ok := r.Status["NoNewPrivs"]
		s.expect(t, "status-nonewprivs", ok, "/proc/self/status has no NoNewPrivs line")
		if ok && v != want {
			t.Errorf("/proc/self/status NoNewPrivs: got %q, want %s", v, want)
		}
	})

	// The mode only; what the filter refuses is asserted by Syscalls. On
	// gVisor the Sentry applies the OCI profile (--oci-seccomp) and presents
	// the mode as Linux does.
	t.Run("Seccomp", func(t *testing.T) {
		if v := r.Status["Seccomp"]; v != "2" {
			t.Errorf("/proc/self/status Seccomp: got %q, want 2 (filter)", v)
		}
		if r.Seccomp.Errno != 0 || string(r.Seccomp.Value) != "2" {
			t.Errorf("PR_GET_SECCOMP: got %s (%s), want 2", r.Seccomp.Value, r.Seccomp.errno)
		}
	})

	t.Run("User", func(t *testing.T) {
		uid, gid := int(s.p.User.UID), int(s.p.User.GID)
		for name, v := range map[string][2]int{"uid": {r.UID, uid}, "euid": {r.EUID, uid}, "gid": {r.GID, gid}, "egid": {r.EGID, gid}} {
			if v[0] != v[1] {
				t.Errorf("%s: got %d, want %d", name, v[0], v[1])
			}
		}
		for _, g := range r.Groups {
			if g != gid {
				t.Errorf("supplementary groups: got %v, want none but %d", r.Groups, gid)
				break
			}
		}
	})
}
