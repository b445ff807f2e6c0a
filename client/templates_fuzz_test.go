package client

import (
	"testing"
)

// FuzzParseBuildEvent feeds the decoder of a build job's events (what a
// daemon sends) arbitrary names and data: it must never panic, and an
// event it accepts is a progress report or a final event.
func FuzzParseBuildEvent(f *testing.F) {
	f.Add("progress", []byte(`{"stage":"fetching","packages":3,"total":9,"bytes":1024,"elapsed_ms":5}`))
	f.Add("done", []byte(`{"id":"tb_1","template":"analytics","state":"done","build":{"digest":"sha256:1","sbom":{"debian":[{"name":"a","version":"1"}]}}}`))
	f.Add("failed", []byte(`{"id":"tb_1","state":"failed","error":{"code":"invalid_argument","message":"m"}}`))
	f.Add("cancelled", []byte(`null`))
	f.Add("other", []byte(`{}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		ev, err := ParseBuildEvent(name, data)
		if err != nil {
			return
		}
		switch ev.Name {
		case "progress", "done", "failed", "cancelled":
		default:
			t.Fatalf("accepted event %q", ev.Name)
		}
	})
}
