package conformance

import (
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// implements reports whether v implements the interface T.
func implements[T any](v any) bool {
	_, ok := v.(T)
	return ok
}

// abilities checks the driver's declaration of its optional abilities
// against what it is: each flag of Capabilities is true exactly when the
// driver (or, for Files and Kernels, its sandbox) implements the ability's
// interface, and each flag that is false says why in Lacks, which names
// nothing else.
func (s *suite) abilities(t *testing.T) {
	d := s.h.Driver
	b := s.start(t, sandbox.Limits{})
	abilities := []struct {
		name string
		flag bool
		has  bool
		what string
	}{
		{"Health", s.caps.Health, implements[sandbox.HealthChecker](d), "the driver implements sandbox.HealthChecker"},
		{"Reap", s.caps.Reap, implements[sandbox.Reaper](d), "the driver implements sandbox.Reaper"},
		{"Leftovers", s.caps.Leftovers, implements[sandbox.Leftovers](d), "the driver implements sandbox.Leftovers"},
		{"Files", s.caps.Files, implements[sandbox.Files](b.sb), "its sandbox implements sandbox.Files"},
		{"Kernels", s.caps.Kernels, implements[sandbox.Kernels](b.sb), "its sandbox implements sandbox.Kernels"},
		{"Bind", s.caps.Bind, implements[sandbox.Binder](d), "the driver implements sandbox.Binder"},
		{"Reattach", s.caps.Reattach, implements[sandbox.Reattacher](d), "the driver implements sandbox.Reattacher"},
		{"Snapshots", s.caps.Snapshots, implements[sandbox.Snapshotter](d), "the driver implements sandbox.Snapshotter"},
		// BindEgress is a detail of Bind, not an interface of its own.
		{"BindEgress", s.caps.BindEgress, s.caps.BindEgress && s.caps.Bind, "Bind is declared too"},
	}
	named := map[string]bool{}
	for _, a := range abilities {
		named[a.name] = true
		if a.flag != a.has {
			t.Errorf("Capabilities.%s is %v, but %q is %v", a.name, a.flag, a.what, a.has)
		}
		switch why := s.caps.Lacks[a.name]; {
		case !a.flag && why == "":
			t.Errorf("Capabilities.%s is false and Lacks says nothing of why", a.name)
		case a.flag && why != "":
			t.Errorf("Capabilities.%s is true and Lacks says it lacks it: %q", a.name, why)
		}
	}
	for name := range s.caps.Lacks {
		if !named[name] {
			t.Errorf("Lacks names %q, which is no ability flag", name)
		}
	}
}
