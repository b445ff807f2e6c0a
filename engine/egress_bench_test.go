package engine

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// BenchmarkOneShotEgress measures a one-shot run (engine.Run of
// print(1)) on runc without network, with network, and with network and
// the wait for the network's removal (what Destroy cost when it removed
// the network itself), interleaved, and reports each median and the added
// cost. Run it with -benchtime=10x for ten runs of each.
func BenchmarkOneShotEgress(b *testing.B) {
	up := httptest.NewServer(http.NotFoundHandler())
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	env := newEgressEnv(b, pythonFetch("container", []string{"allowed.test"}, upPort),
		map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}}, nil, nil)
	ctx := context.Background()
	run := func(network, wait bool) time.Duration {
		start := time.Now()
		res, err := env.eng.Run(ctx, Request{Tool: "fetch", Driver: "runc", Runtime: "python", Network: network, Code: []byte("print(1)")})
		if err != nil {
			b.Fatal(err)
		}
		if wait {
			if err := env.eng.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		d := time.Since(start)
		if res.Stdout != "1\n" {
			b.Fatalf("got %q %q", res.Stdout, res.Stderr)
		}
		return d
	}
	run(false, false) // warm the image cache
	run(true, true)
	var plain, withNet, netWait []time.Duration
	b.ResetTimer()
	for b.Loop() {
		plain = append(plain, run(false, false))
		withNet = append(withNet, run(true, false))
		// The next run starts with the previous network's removal done,
		// as the others do not.
		if err := env.eng.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		netWait = append(netWait, run(true, true))
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	mp, mn, mw := median(plain), median(withNet), median(netWait)
	b.ReportMetric(ms(mp), "ms-plain")
	b.ReportMetric(ms(mn), "ms-network")
	b.ReportMetric(ms(mw), "ms-network+removal")
	b.ReportMetric(ms(mn-mp), "ms-added")
	b.Logf("one-shot runc print(1), median of %d each, interleaved:\n"+
		"  without network        %7.1f ms\n"+
		"  with network           %7.1f ms  (%+.1f ms)\n"+
		"  with network, removal  %7.1f ms  (%+.1f ms; the synchronous close this replaces)",
		len(plain), ms(mp), ms(mn), ms(mn-mp), ms(mw), ms(mw-mp))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
