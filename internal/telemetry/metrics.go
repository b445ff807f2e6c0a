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

// refusals counts the egress proxy's refusals by reason, one of the
// egress package's Reason constants: a set bounded in code.
var refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "stockade_egress_refusals_total",
	Help: "Connections and DNS queries the egress proxy refused, by reason.",
}, []string{"reason"})

// Collectors are the telemetry package's metrics, for a registry to
// serve: the phases' durations (stockade_phase_duration_seconds) and the
// egress proxy's refusals (stockade_egress_refusals_total). They may be
// registered in several registries.
func Collectors() []prometheus.Collector { return []prometheus.Collector{phases, refusals} }

// EgressRefused counts a refusal of the egress proxy for reason.
func EgressRefused(reason string) { refusals.WithLabelValues(reason).Inc() }

func observe(phase Phase, tier, outcome string, d time.Duration) {
	phases.WithLabelValues(string(phase)[len("stockade."):], tier, outcome).Observe(d.Seconds())
}
