package api

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
)

var (
	_ capability.SessionObserver    = (*Metrics)(nil)
	_ capability.CheckpointObserver = (*Metrics)(nil)
)

// sessionMetrics are the sessions' metrics, registered by NewMetrics.
type sessionMetrics struct {
	live  prometheus.Gauge
	cells *prometheus.CounterVec
	ended *prometheus.CounterVec
	// paused and checkpointBytes are the store's, every 10 s.
	paused          prometheus.Gauge
	checkpointBytes prometheus.Gauge
}

func newSessionMetrics(reg *prometheus.Registry) sessionMetrics {
	m := sessionMetrics{
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_sessions_live", Help: "Sessions whose sandboxes this daemon serves.",
		}),
		cells: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_session_cells_total", Help: "Cells of sessions that ran, by status.",
		}, []string{"status"}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_sessions_paused", Help: "Sessions paused to a checkpoint on disk, in the store (every 10 s).",
		}),
		checkpointBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "stockade_checkpoint_bytes", Help: "Disk the paused sessions' checkpoints and the snapshots take, in the store (every 10 s).",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stockade_sessions_ended_total", Help: "Sessions ended, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range []model.SessionEndReason{model.EndClosed, model.EndIdle, model.EndTTL, model.EndInterrupted, model.EndFailed} {
		m.ended.WithLabelValues(string(r))
	}
	reg.MustRegister(m.live, m.cells, m.ended, m.paused, m.checkpointBytes)
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

// Checkpoints implements capability.CheckpointObserver.
func (m *Metrics) Checkpoints(bytes int64, paused int) {
	m.sessions.checkpointBytes.Set(float64(bytes))
	m.sessions.paused.Set(float64(paused))
}
