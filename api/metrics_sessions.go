package api

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
)

var _ capability.SessionObserver = (*Metrics)(nil)

// sessionMetrics are the sessions' metrics, registered by NewMetrics.
type sessionMetrics struct {
	live  prometheus.Gauge
	cells *prometheus.CounterVec
	ended *prometheus.CounterVec
}

func newSessionMetrics(reg *prometheus.Registry) sessionMetrics {
	m := sessionMetrics{
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_sessions_live", Help: "Sessions whose sandboxes this daemon serves.",
		}),
		cells: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_session_cells_total", Help: "Cells of sessions that ran, by status.",
		}, []string{"status"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_sessions_ended_total", Help: "Sessions ended, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range []model.SessionEndReason{model.EndClosed, model.EndIdle, model.EndTTL, model.EndInterrupted, model.EndFailed} {
		m.ended.WithLabelValues(string(r))
	}
	reg.MustRegister(m.live, m.cells, m.ended)
	return m
}

// SessionsLive implements capability.SessionObserver.
func (m *Metrics) SessionsLive(delta int) { m.sessions.live.Add(float64(delta)) }

// SessionCell implements capability.SessionObserver.
func (m *Metrics) SessionCell(status model.ExecutionStatus) {
	m.sessions.cells.WithLabelValues(string(status)).Inc()
}

// SessionEnded implements capability.SessionObserver.
func (m *Metrics) SessionEnded(reason model.SessionEndReason) {
	m.sessions.ended.WithLabelValues(string(reason)).Inc()
}
