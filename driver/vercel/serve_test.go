package vercel_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestServe runs `stockade serve` with the vercel driver as its default
// (driver: vercel, the credentials and the fake's address from the
// environment) and runs python through it with `stockade run --url`:
// admission, credits and the run's record in front, the provider's API
// behind. /healthz reports the driver.
func TestServe(t *testing.T) {
	f, base := fakeAPI(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "stockade.db")
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("stockade %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	cli("workspace", "create", "v", "--db", db)
	key := cli("key", "create", "--workspace", "v", "--role", "agent", "--db", db)
	cli("credits", "grant", "v", "100", "--db", db)
	cli("policy", "set", "v", "--approval=none", "--db", db)
	cfg := filepath.Join(dir, "stockade.yaml")
	conf := fmt.Sprintf("driver: vercel\npools: []\ndocker_host: unix://%s\n", filepath.Join(dir, "no-docker.sock"))
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfg, "--db", db, "--state-dir", filepath.Join(dir, "state"),
		"--guest", testenv.Guest(t), "--data-dir", testenv.DataDir(), "--listen", "127.0.0.1:0", "--egress=false")
	cmd.Env = append(os.Environ(), "STOCKADE_VERCEL_API="+base, "VERCEL_TOKEN="+token, "VERCEL_TEAM_ID="+team, "VERCEL_PROJECT_ID="+project)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	listening := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		re := regexp.MustCompile(`msg="stockade serving" listen=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				listening <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGUSR2)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("stockade serve:\n%s", logs.String())
		}
	}()
	var url string
	select {
	case addr := <-listening:
		url = "http://" + addr
	case <-done:
		t.Fatalf("stockade serve exited:\n%s", logs.String())
	case <-time.After(90 * time.Second):
		t.Fatal("stockade serve did not listen within 90 s")
	}

	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		DefaultDriver string            `json:"default_driver"`
		Drivers       map[string]string `json:"drivers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if err != nil || h.DefaultDriver != "vercel" || h.Drivers["vercel"] != "ok" {
		t.Errorf("healthz: got %+v, %v; want vercel the default and ok", h, err)
	}
	out, err := exec.Command(bin, "run", "--url", url, "--key", key, "--runtime", "python", "-c", "print(6 * 7)").CombinedOutput()
	if err != nil || string(out) != "42\n" {
		t.Errorf("stockade run through the daemon: got %q, %v; want 42", out, err)
	}
	ran := 0
	for _, s := range f.Shapes() {
		if s.Method == "POST" && s.Route == "/v2/sandboxes/sessions/{session}/cmd" {
			ran++
		}
	}
	if ran != 1 {
		t.Errorf("the fake ran %d commands, want the run's one", ran)
	}
	if left := f.Running(); len(left) > 0 {
		t.Errorf("sandboxes left running on the fake: %v", left)
	}
}
