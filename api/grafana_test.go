package api_test

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestGrafanaDashboardQueriesServedSeries checks that every series the
// Grafana dashboard (deploy/grafana/stockade.json) queries is one that
// /metrics serves, so that no panel stays empty for a renamed metric.
func TestGrafanaDashboardQueriesServedSeries(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "deploy", "grafana", "stockade.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}

	// A series of every family, so that /metrics names them all.
	m := api.NewMetrics()
	m.PoolSize("p", 1)
	m.PoolTarget("p", 1)
	m.SessionsLive(1)
	m.Checkpoints(1, 1)
	_, sp := telemetry.Start(t.Context(), telemetry.Exec)
	sp.End(nil)
	telemetry.EgressRefused("name not in allowlist")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	served := map[string]bool{}
	for l := range strings.Lines(string(body)) {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			served[f[2]] = true
		}
	}

	name := regexp.MustCompile(`stockade_[a-z_]+`)
	queried := 0
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				queried++
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if served[strings.TrimSuffix(n, suffix)] {
						base = strings.TrimSuffix(n, suffix)
					}
				}
				if !served[base] {
					t.Errorf("panel %q queries %s, which /metrics does not serve", p.Title, n)
				}
			}
		}
	}
	if queried == 0 || !served["stockade_phase_duration_seconds"] {
		t.Fatalf("queried %d series; /metrics served %d families", queried, len(served))
	}
}
