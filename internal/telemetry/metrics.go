package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// phases is the histogram of the phases' durations, by phase, tier (empty
// where the phase precedes the choice of one: authentication, policy) and
// outcome. It is the process's one, recorded with tracing on or off;
// PhaseCollector registers it.
var phases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "stockade_phase_duration_seconds",
	Help:    "Duration of each phase of an invocation (span name without stockade.), by tier and outcome.",
	Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
}, []string{"phase", "tier", "outcome"})

// PhaseCollector is the histogram of the phases' durations
// (stockade_phase_duration_seconds), for a registry to serve. It may be
// registered in several registries.
func PhaseCollector() prometheus.Collector { return phases }

func observe(phase Phase, tier, outcome string, d time.Duration) {
	phases.WithLabelValues(string(phase)[len("stockade."):], tier, outcome).Observe(d.Seconds())
}
