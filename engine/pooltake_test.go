package engine

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// TestPoolFixedLimits shows that a pool whose driver's Bind cannot change
// memory and CPU (Capabilities.BindFixedLimits, the kubernetes driver's)
// serves a run with the limits its sandboxes have and no tighter memory or
// CPU, while a pool whose driver's Bind tightens them serves those too.
func TestPoolFixedLimits(t *testing.T) {
	base := sandbox.DefaultLimits().WithDefaults(sandbox.Limits{CPU: 1})
	tool := tools.Tool{Name: "python"}
	req := Request{Tool: "python", Runtime: "python"}
	tighterMem, tighterCPU, shorter := base, base, base
	tighterMem.Memory /= 2
	tighterCPU.CPU /= 2
	shorter.Timeout = 5 * time.Second
	for _, tt := range []struct {
		fixed bool
		want  map[string]bool
	}{
		{true, map[string]bool{"equal": true, "shorter timeout": true, "tighter memory": false, "tighter CPU": false}},
		{false, map[string]bool{"equal": true, "shorter timeout": true, "tighter memory": true, "tighter CPU": true}},
	} {
		drv := &sandboxfake.Driver{ID: "fake", Tier: sandbox.TierContainer, BindFixedLimits: tt.fixed}
		p := &pool{name: "python/python", tool: tool, drv: drv, rt: image.Runtime{Name: "python"}, base: base}
		for name, l := range map[string]sandbox.Limits{"equal": base, "shorter timeout": shorter, "tighter memory": tighterMem, "tighter CPU": tighterCPU} {
			if got := p.serves(req, tool, l); got != tt.want[name] {
				t.Errorf("BindFixedLimits %v, %s limits: serves %v, want %v", tt.fixed, name, got, tt.want[name])
			}
		}
	}
}
