package api

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
)

// Metrics are Stockade's Prometheus metrics. It implements capability.Observer.
type Metrics struct {
	reg          *prometheus.Registry
	invocations  *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	pending      prometheus.Gauge
	credits      prometheus.Counter
	connsOpen    prometheus.Gauge
	connsRefused prometheus.Counter
	unwitnessed  prometheus.Counter

	analyticsShipped  prometheus.Counter
	analyticsDropped  prometheus.Counter
	analyticsFailures *prometheus.CounterVec
	analyticsBacklog  prometheus.Gauge
	analyticsLag      prometheus.Gauge

	sessions sessionMetrics
	pools    poolMetrics
}

var (
	_ capability.Observer = (*Metrics)(nil)
	_ analytics.Observer  = (*Metrics)(nil)
)

// NewMetrics registers the metrics on a registry of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_invocations_total", Help: "Finished invocations by final status.",
		}, []string{"status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "stockade_execution_duration_seconds", Help: "Wall clock of executions that ran, from sandbox start to end.",
			Buckets: []float64{.025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"driver"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_approvals_pending", Help: "Approval requests waiting for a decision.",
		}),
		credits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockade_credits_charged_total", Help: "Credits charged for invocations.",
		}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_api_connections_open", Help: "API connections open (see max_connections).",
		}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockade_api_connections_refused_total", Help: "API connections closed as soon as accepted because max_connections were open.",
		}),
		unwitnessed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockade_audit_witness_refusals_total",
			Help: "Audit chain heads not witnessed because the chain does not link them to the head witnessed before (tampering or lost commits; run stockade audit verify).",
		}),
		analyticsShipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockade_analytics_rows_shipped_total", Help: "tool_invocations rows ClickHouse stored (a row sent again counts again).",
		}),
		analyticsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stockade_analytics_rows_dropped_total", Help: "tool_invocations rows dropped from the analytics outbox past its bound (analytics.outbox max_rows, max_age); they never reach ClickHouse.",
		}),
		analyticsFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_analytics_ship_failures_total", Help: "Rounds of shipping to ClickHouse that failed, by reason; their rows wait in the outbox.",
		}, []string{"reason"}),
		analyticsBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_analytics_outbox_rows", Help: "tool_invocations rows waiting in the analytics outbox.",
		}),
		analyticsLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_analytics_outbox_lag_seconds", Help: "How long the oldest row waiting in the analytics outbox has waited; 0 when none waits.",
		}),
		pools: newPoolMetrics(),
	}
	for _, r := range analytics.Reasons {
		m.analyticsFailures.WithLabelValues(r)
	}
	// Every final status has a series from the start, so that a fresh
	// daemon's /metrics already names them (at zero).
	for _, st := range model.ExecutionStatuses {
		if st.Terminal() {
			m.invocations.WithLabelValues(string(st))
		}
	}
	m.reg.MustRegister(m.invocations, m.duration, m.pending, m.credits, m.connsOpen, m.connsRefused, m.unwitnessed,
		m.analyticsShipped, m.analyticsDropped, m.analyticsFailures, m.analyticsBacklog, m.analyticsLag,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	m.reg.MustRegister(telemetry.Collectors()...)
	m.sessions = newSessionMetrics(m.reg)
	m.reg.MustRegister(m.pools.collectors()...)
	return m
}

// Invocation implements capability.Observer.
func (m *Metrics) Invocation(status model.ExecutionStatus, driver string, ran time.Duration, credits int64) {
	m.invocations.WithLabelValues(string(status)).Inc()
	if ran > 0 {
		m.duration.WithLabelValues(driver).Observe(ran.Seconds())
	}
	m.credits.Add(float64(credits))
}

// ApprovalsPending implements capability.Observer.
func (m *Metrics) ApprovalsPending(delta int) { m.pending.Add(float64(delta)) }

// WitnessRefused implements capability.Observer.
func (m *Metrics) WitnessRefused() { m.unwitnessed.Inc() }

// AnalyticsShipped implements analytics.Observer.
func (m *Metrics) AnalyticsShipped(rows int) { m.analyticsShipped.Add(float64(rows)) }

// AnalyticsDropped implements analytics.Observer.
func (m *Metrics) AnalyticsDropped(rows int64) { m.analyticsDropped.Add(float64(rows)) }

// AnalyticsFailed implements analytics.Observer.
func (m *Metrics) AnalyticsFailed(reason string) { m.analyticsFailures.WithLabelValues(reason).Inc() }

// AnalyticsBacklog implements analytics.Observer.
func (m *Metrics) AnalyticsBacklog(rows int64, lag time.Duration) {
	m.analyticsBacklog.Set(float64(rows))
	m.analyticsLag.Set(lag.Seconds())
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// connectionOpened counts delta API connections opened (closed, when
// negative). It does nothing on nil Metrics.
func (m *Metrics) connectionOpened(delta int) {
	if m != nil {
		m.connsOpen.Add(float64(delta))
	}
}

// connectionRefused counts an API connection refused at the cap. It does
// nothing on nil Metrics.
func (m *Metrics) connectionRefused() {
	if m != nil {
		m.connsRefused.Inc()
	}
}
