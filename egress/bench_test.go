package egress

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkDownload10MiB downloads 10 MiB from the loopback upstream
// directly and through the proxy (plain HTTP, transparent TLS, CONNECT), in
// one run, so that the MB/s columns compare like with like. The "ratio"
// sub-benchmark alternates a direct and a proxied HTTP download in each
// iteration and reports proxied/direct throughput.
func BenchmarkDownload10MiB(b *testing.B) {
	e := newEnv(b)
	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.up.roots}, DisableKeepAlives: true}}
	httpURL := fmt.Sprintf("http://%s:%d/big", allowedName, e.up.httpPort)
	httpsURL := fmt.Sprintf("https://%s:%d/big", allowedName, e.up.httpsPort)
	directURL := fmt.Sprintf("http://127.0.0.1:%d/big", e.up.httpPort)
	directTLS := fmt.Sprintf("https://127.0.0.1:%d/big", e.up.httpsPort)
	// The direct TLS client must accept the certificate for 127.0.0.1.
	directTLSClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.up.roots, ServerName: allowedName}, DisableKeepAlives: true}}

	fetch := func(b *testing.B, c *http.Client, url string) {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != bigSize {
			b.Fatalf("got %d bytes, %v; want %d", n, err, bigSize)
		}
	}
	for _, bc := range []struct {
		name string
		c    *http.Client
		url  string
	}{
		{"direct-http", direct, directURL},
		{"proxy-http", e.transparentClient(), httpURL},
		{"direct-https", directTLSClient, directTLS},
		{"proxy-tls-sni", e.transparentClient(), httpsURL},
		{"proxy-connect", e.proxyClient(), httpsURL},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(bigSize)
			for b.Loop() {
				fetch(b, bc.c, bc.url)
			}
		})
	}
	b.Run("ratio", func(b *testing.B) {
		var d, p time.Duration
		pc := e.transparentClient()
		for b.Loop() {
			t0 := time.Now()
			fetch(b, direct, directURL)
			t1 := time.Now()
			fetch(b, pc, httpURL)
			d, p = d+t1.Sub(t0), p+time.Since(t1)
		}
		mb := float64(bigSize) / (1 << 20)
		b.ReportMetric(mb*float64(b.N)/d.Seconds(), "direct-MiB/s")
		b.ReportMetric(mb*float64(b.N)/p.Seconds(), "proxy-MiB/s")
		b.ReportMetric(d.Seconds()/p.Seconds(), "proxy/direct")
	})
}
