package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/engine"
)

var (
	_ engine.PoolObserver       = (*Metrics)(nil)
	_ engine.PoolDemandObserver = (*Metrics)(nil)
)

// poolMetrics are the warm pools' series, by pool (tool/runtime, and
// tool/runtime/session for a session pool).
type poolMetrics struct {
	size   *prometheus.GaugeVec
	hits   *prometheus.CounterVec
	misses *prometheus.CounterVec
	refill *prometheus.HistogramVec
	// The pools' demand (engine's pooldemand.go) and refills' CPU.
	target   *prometheus.GaugeVec
	waits    *prometheus.CounterVec
	wait     *prometheus.HistogramVec
	cpu      *prometheus.HistogramVec
	restores *prometheus.CounterVec
}

func newPoolMetrics() poolMetrics {
	return poolMetrics{
		size: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockade_pool_sandboxes", Help: "Sandboxes of a warm pool ready to serve, by pool (tool/runtime; tool/runtime/session for new sessions).",
		}, []string{"pool"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_pool_hits_total", Help: "One-shot executions, or new sessions, served by a warm pool's sandbox.",
		}, []string{"pool"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_pool_misses_total", Help: "One-shot executions, or new sessions, of a pool's tool and runtime that ran cold: the pool was empty, or could not serve the request (its limits, network, workspace size).",
		}, []string{"pool"}),
		refill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockade_pool_refill_seconds", Help: "Time to create one warm pool sandbox and start its interpreter or kernel.",
			Buckets: []float64{.025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"pool"}),
		target: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stockade_pool_target_sandboxes", Help: "The size a warm pool fills to now: between its floor (size, sessions) and its ceiling (max, sessions_max), grown by misses and waits, shrunk when idle.",
		}, []string{"pool"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_pool_waits_total", Help: "Runs, or new sessions, that found their pool empty and waited for a refill about to end; served says whether it served them (or they ran cold).",
		}, []string{"pool", "served"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockade_pool_wait_seconds", Help: "How long a run, or new session, waited for its pool's refill.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"pool"}),
		cpu: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockade_pool_refill_cpu_seconds", Help: "CPU time of one warm pool refill, read from the sandbox's cgroup once it is ready (the runtime's commands and the shim aside; a one-shot pool's interpreter goes on importing, and a restored sandbox loading its memory, after that), by how it was made: cold (started, imports run) or checkpoint (restored from the pool's checkpoint).",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 4, 8},
		}, []string{"pool", "from"}),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_pool_restore_failures_total", Help: "Refills from a pool's checkpoint that failed and started the sandbox cold instead.",
		}, []string{"pool"}),
	}
}

func (p poolMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.size, p.hits, p.misses, p.refill, p.target, p.waits, p.wait, p.cpu, p.restores}
}

// PoolSize implements engine.PoolObserver. A pool's counters have series
// from its first report on, at zero.
func (m *Metrics) PoolSize(pool string, n int) {
	m.pools.size.WithLabelValues(pool).Set(float64(n))
	m.pools.hits.WithLabelValues(pool)
	m.pools.misses.WithLabelValues(pool)
}

// PoolHit implements engine.PoolObserver.
func (m *Metrics) PoolHit(pool string) { m.pools.hits.WithLabelValues(pool).Inc() }

// PoolMiss implements engine.PoolObserver.
func (m *Metrics) PoolMiss(pool string) { m.pools.misses.WithLabelValues(pool).Inc() }

// PoolRefill implements engine.PoolObserver.
func (m *Metrics) PoolRefill(pool string, d time.Duration) {
	m.pools.refill.WithLabelValues(pool).Observe(d.Seconds())
}

// PoolTarget implements engine.PoolDemandObserver.
func (m *Metrics) PoolTarget(pool string, n int) {
	m.pools.target.WithLabelValues(pool).Set(float64(n))
}

// PoolWait implements engine.PoolDemandObserver.
func (m *Metrics) PoolWait(pool string, d time.Duration, served bool) {
	m.pools.waits.WithLabelValues(pool, strconv.FormatBool(served)).Inc()
	m.pools.wait.WithLabelValues(pool).Observe(d.Seconds())
}

// PoolRefillCPU implements engine.PoolDemandObserver.
func (m *Metrics) PoolRefillCPU(pool string, cpu time.Duration, restored bool) {
	from := "cold"
	if restored {
		from = "checkpoint"
	}
	m.pools.cpu.WithLabelValues(pool, from).Observe(cpu.Seconds())
}

// PoolRestoreFailed implements engine.PoolDemandObserver.
func (m *Metrics) PoolRestoreFailed(pool string) { m.pools.restores.WithLabelValues(pool).Inc() }
