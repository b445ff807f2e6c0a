package tools

import (
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

func TestDiff(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Tool)
		review bool
		growth []string
		fields []string // FieldChange.String() of each changed field
	}{
		{
			name:   "domain added",
			change: func(t *Tool) { t.Egress.Allow = append(t.Egress.Allow, "files.pythonhosted.org") },
			review: true,
			growth: []string{"egress.allow +files.pythonhosted.org"},
			fields: []string{"egress.allow: [*.pythonhosted.org, pypi.org] -> [*.pythonhosted.org, files.pythonhosted.org, pypi.org] (+files.pythonhosted.org)"},
		},
		{
			name:   "domain swapped",
			change: func(t *Tool) { t.Egress.Allow = []string{"pypi.org", "test.pypi.org"} },
			review: true,
			growth: []string{"egress.allow +test.pypi.org"},
			fields: []string{"egress.allow: [*.pythonhosted.org, pypi.org] -> [pypi.org, test.pypi.org] (+test.pypi.org, -*.pythonhosted.org)"},
		},
		{
			name:   "port added",
			change: func(t *Tool) { t.Egress.Ports = []int{80, 443} },
			review: true,
			growth: []string{"egress.ports +80"},
			fields: []string{"egress.ports: [443] -> [80, 443] (+80)"},
		},
		{
			name:   "credential added",
			change: func(t *Tool) { t.Credentials = append(t.Credentials, "pypi.yank") },
			review: true,
			growth: []string{"credentials +pypi.yank"},
			fields: []string{"credentials: [pypi.upload] -> [pypi.upload, pypi.yank] (+pypi.yank)"},
		},
		{
			name:   "allowlist shrinks",
			change: func(t *Tool) { t.Egress.Allow = []string{"pypi.org"} },
			fields: []string{"egress.allow: [*.pythonhosted.org, pypi.org] -> [pypi.org] (-*.pythonhosted.org)"},
		},
		{
			name:   "egress and credentials removed",
			change: func(t *Tool) { t.Egress = Egress{}; t.Credentials = nil },
			fields: []string{
				"egress.allow: [*.pythonhosted.org, pypi.org] -> none (-*.pythonhosted.org, -pypi.org)",
				"egress.ports: [443] -> none (-443)",
				"credentials: [pypi.upload] -> none (-pypi.upload)",
			},
		},
		{
			name:   "tier and limits",
			change: func(t *Tool) { t.Tier = sandbox.TierContainer; t.Limits.Memory = 2 << 30; t.Limits.CPU = 0 },
			fields: []string{"tier: gvisor -> container", "limits.memory: 1GiB -> 2GiB", "limits.cpu: 1 -> 0.5"},
		},
		{
			name: "mount added and risk reworded",
			change: func(t *Tool) {
				t.Filesystem.Mounts = append(t.Filesystem.Mounts, sandbox.Mount{Source: "/var/lib/stockade/data/extra", Target: "/data/extra"})
				t.AcceptRisk = &AcceptRisk{By: "carol@example.com", Reason: "re-reviewed"}
			},
			fields: []string{
				"filesystem.mounts: [/var/lib/stockade/data/wheels:/data/wheels] -> [/var/lib/stockade/data/extra:/data/extra, /var/lib/stockade/data/wheels:/data/wheels] (+/var/lib/stockade/data/extra:/data/extra)",
				"accept_risk: by bob@example.com: uploads only to our own project; reviewed in SEC-12 -> by carol@example.com: re-reviewed",
			},
		},
		{
			name: "reordered and defaults made explicit",
			change: func(t *Tool) {
				slices.Reverse(t.Egress.Allow)
				t.Limits.Timeout = t.EffectiveLimits().Timeout
				t.Limits.Pids = 128
				t.Filesystem.ScratchLifetime = LifetimeInvocation
				t.Source = "moved.yaml:1"
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := fetcher()
			nw := fetcher()
			tt.change(&nw)
			c := Diff(old, nw)
			if c.ReviewRequired != tt.review {
				t.Errorf("got ReviewRequired %v, want %v", c.ReviewRequired, tt.review)
			}
			if !slices.Equal(c.Growth, tt.growth) {
				t.Errorf("got growth %q, want %q", c.Growth, tt.growth)
			}
			var got []string
			for _, f := range c.Fields {
				got = append(got, f.String())
			}
			if !slices.Equal(got, tt.fields) {
				t.Errorf("got fields\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.fields, "\n  "))
			}
			if c.Changed() != (len(tt.fields) > 0) {
				t.Errorf("got Changed %v with fields %q", c.Changed(), got)
			}
			if c.Tool != "pypi-fetcher" {
				t.Errorf("got tool %q", c.Tool)
			}
		})
	}
}

func TestDiffString(t *testing.T) {
	old := fetcher()
	nw := fetcher()
	nw.Egress.Allow = append(nw.Egress.Allow, "evil.example.com")
	want := `tool "pypi-fetcher" changed (review required: egress.allow +evil.example.com)
  egress.allow: [*.pythonhosted.org, pypi.org] -> [*.pythonhosted.org, evil.example.com, pypi.org] (+evil.example.com)
`
	if got := Diff(old, nw).String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestDiffSets(t *testing.T) {
	calc := Tool{Name: "calc", InputTrust: Trusted, Tier: sandbox.TierContainer}
	quiet := Tool{Name: "quiet", InputTrust: Untrusted, Tier: sandbox.TierGVisor}
	old := newSet([]Tool{calc, quiet}, Default())

	calc2 := calc
	calc2.Limits.Memory = 1 << 30
	nw := newSet([]Tool{calc2, fetcher()}, Default())

	cs := DiffSets(old, nw)
	byTool := map[string]Change{}
	for _, c := range cs {
		byTool[c.Tool] = c
	}
	if len(cs) != 3 {
		t.Fatalf("got %d changes, want 3 (calc changed, pypi-fetcher added, quiet removed): %v", len(cs), cs)
	}
	if c := byTool["calc"]; c.Added || c.Removed || c.ReviewRequired || len(c.Fields) != 1 || c.Fields[0].Field != "limits.memory" {
		t.Errorf("calc: got %+v", c)
	}
	// A new tool with egress and credentials grew from nothing.
	if c := byTool["pypi-fetcher"]; !c.Added || !c.ReviewRequired || c.OldFingerprint != "" ||
		!slices.Contains(c.Growth, "egress.allow +pypi.org") || !slices.Contains(c.Growth, "credentials +pypi.upload") {
		t.Errorf("pypi-fetcher: got %+v", c)
	}
	if c := byTool["quiet"]; !c.Removed || c.ReviewRequired || c.NewFingerprint != "" || !strings.Contains(c.String(), `tool "quiet" removed`) {
		t.Errorf("quiet: got %+v", c)
	}
	if cs := DiffSets(nw, nw); len(cs) != 0 {
		t.Errorf("same set: got %v, want no change", cs)
	}
	if cs := DiffSets(nil, nil); len(cs) != 0 {
		t.Errorf("nil sets: got %v, want no change", cs)
	}
}

func TestDiffStored(t *testing.T) {
	old := Default()
	old.Name, old.Tier, old.InputTrust = "calc", sandbox.TierGVisor, Trusted
	nw := old
	nw.Runtimes = []string{"python"}
	c, err := DiffStored(Canonical(old), nw)
	if err != nil {
		t.Fatal(err)
	}
	if c.OldFingerprint != Fingerprint(old) || c.NewFingerprint != Fingerprint(nw) {
		t.Errorf("fingerprints: got %s -> %s, want %s -> %s", c.OldFingerprint, c.NewFingerprint, Fingerprint(old), Fingerprint(nw))
	}
	if !c.Changed() || c.ReviewRequired {
		t.Errorf("got changed %t review %t, want a change without review (%s)", c.Changed(), c.ReviewRequired, c)
	}
	if _, err := DiffStored([]byte("{not json"), nw); err == nil {
		t.Error("a corrupt stored record: got no error")
	}
}
