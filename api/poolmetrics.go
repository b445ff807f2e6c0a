package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/engine"
)

var _ engine.PoolObserver = (*Metrics)(nil)

// poolMetrics are the warm pools' series, by pool (tool/runtime, and
// tool/runtime/session for a session pool).
type poolMetrics struct {
	size   *prometheus.GaugeVec
	hits   *prometheus.CounterVec
	misses *prometheus.CounterVec
	refill *prometheus.HistogramVec
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
	}
}

func (p poolMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.size, p.hits, p.misses, p.refill}
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
