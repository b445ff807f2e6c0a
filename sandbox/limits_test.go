package sandbox

import (
	"math"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestLimitsCheck(t *testing.T) {
	ceiling := Limits{Memory: 1 << 30, CPU: 2, Pids: 256, Timeout: time.Minute, TmpSize: 256 << 20, OutputCap: 4 << 20}
	for _, ok := range []Limits{{}, DefaultLimits(), ceiling, {CPU: 0.25}} {
		if err := ok.Check(ceiling); err != nil {
			t.Errorf("Check(%+v): %v, want nil", ok, err)
		}
	}
	for name, bad := range map[string]Limits{
		"negative cpu":     {CPU: -1},
		"NaN cpu":          {CPU: math.NaN()},
		"infinite cpu":     {CPU: math.Inf(1)},
		"cpu over ceiling": {CPU: 3},
		"memory too small": {Memory: 1 << 20},
		"memory over":      {Memory: 2 << 30},
		"pids too few":     {Pids: 4},
		"negative timeout": {Timeout: -time.Second},
		"timeout over":     {Timeout: time.Hour},
		"tmp too small":    {TmpSize: 1 << 10},
		"negative out cap": {OutputCap: -1},
		"output cap over":  {OutputCap: 8 << 20},
	} {
		if err := bad.Check(ceiling); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Check(%+v) = %v, want ErrInvalidArgument", name, bad, err)
		}
	}
}
