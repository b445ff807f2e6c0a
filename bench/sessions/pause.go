package main

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// The pause/resume rows: a python session on gVisor holding a DataFrame
// of 100 MiB (frameCode) is paused and resumed, and its first cell after
// the resume uses the frame; the cold alternative opens a new session
// and builds the same frame. Issue 16's target: resume p50 at most 0.5x
// the cold rebuild.
const (
	// frameCode builds a DataFrame of 1,310,720 rows of 10 float64
	// columns: 100 MiB of data.
	frameCode = "import numpy as np\nimport pandas as pd\ndf = pd.DataFrame(np.random.default_rng(0).random((1_310_720, 10)))\nprint(int(df.memory_usage(index=False).sum()))"
	frameOut  = "104857600\n"
	// frameUse reads the frame back: its shape.
	frameUse     = "print(df.shape)"
	frameUseOut  = "(1310720, 10)\n"
	resumeTarget = 0.5
)

// pauseBench measures, on c's gVisor daemon, rounds interleaved rounds of
// a pause/resume cycle of the session holding the frame against a cold
// rebuild of it, prints their table, the target, and the checkpoints'
// sizes of an idle python session and of the frame's.
func pauseBench(c daemon.Client, rounds int) error {
	idle, err := c.Session()
	if err != nil {
		return err
	}
	defer c.Do(http.MethodDelete, "/v1/sessions/"+idle, nil, http.StatusOK, nil)
	var idleView wire.Session
	if err := c.Post("/v1/sessions/"+idle+"/pause", nil, http.StatusOK, &idleView); err != nil {
		return fmt.Errorf("pausing an idle session: %w", err)
	}
	held, err := c.Session()
	if err != nil {
		return err
	}
	defer c.Do(http.MethodDelete, "/v1/sessions/"+held, nil, http.StatusOK, nil)
	if err := c.Cell(held, frameCode, frameOut); err != nil {
		return fmt.Errorf("building the frame: %w", err)
	}

	pause := &table.Variant{Name: "pause: POST /pause (checkpoint)"}
	resume := &table.Variant{Name: "resume: POST /resume and a cell using the frame"}
	rebuild := &table.Variant{Name: "cold: a new session building the frame"}
	var frameBytes int64
	// record appends d to v's samples, except on the untimed warm-up run
	// of Interleave (the first).
	record := func(v *table.Variant, warm *bool, d time.Duration) {
		if *warm {
			v.Samples = append(v.Samples, d)
		}
		*warm = true
	}
	var cycleWarm, coldWarm bool
	cycle := &table.Variant{Name: "cycle", Run: func() error {
		var v wire.Session
		start := time.Now()
		if err := c.Post("/v1/sessions/"+held+"/pause", nil, http.StatusOK, &v); err != nil {
			return err
		}
		paused := time.Since(start)
		if v.State != "paused" {
			return fmt.Errorf("pause: got %+v", v)
		}
		frameBytes = v.CheckpointBytes
		start = time.Now()
		if err := c.Post("/v1/sessions/"+held+"/resume", nil, http.StatusOK, nil); err != nil {
			return err
		}
		if err := c.Cell(held, frameUse, frameUseOut); err != nil {
			return err
		}
		resumed := time.Since(start)
		if cycleWarm {
			pause.Samples = append(pause.Samples, paused)
		}
		record(resume, &cycleWarm, resumed)
		return nil
	}}
	cold := &table.Variant{Name: "cold", Run: func() error {
		start := time.Now()
		id, err := c.Session()
		if err != nil {
			return err
		}
		err = c.Cell(id, frameCode, frameOut)
		d := time.Since(start)
		if derr := c.Do(http.MethodDelete, "/v1/sessions/"+id, nil, http.StatusOK, nil); err == nil {
			err = derr
		}
		record(rebuild, &coldWarm, d)
		return err
	}}
	if err := table.Interleave(rounds, []*table.Variant{cycle, cold}); err != nil {
		return err
	}
	fmt.Printf("\npause and resume on gvisor, a python session holding a 100 MiB DataFrame: %d rounds, interleaved with a cold rebuild\n\n", rounds)
	t := table.New("variant", "median", "p95", "median vs cold rebuild").Labels(1)
	for _, v := range []*table.Variant{pause, resume, rebuild} {
		t.Row(v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), table.Ratio(v.Pct(50), rebuild.Pct(50)))
	}
	t.Print(os.Stdout)
	fmt.Printf("\ncheckpoint of an idle python session: %s; of the session holding the frame: %s; idle paused sessions per GiB of disk: %d\n",
		sandbox.FormatSize(idleView.CheckpointBytes), sandbox.FormatSize(frameBytes), (1<<30)/max(idleView.CheckpointBytes, 1))
	p50, base := resume.Pct(50), rebuild.Pct(50)
	fmt.Printf("- gvisor: resume %s the cold rebuild, at most %.1fx: %s\n", table.Ratio(p50, base), resumeTarget, met(float64(p50) <= resumeTarget*float64(base)))
	return nil
}
