package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
)

// screenshotsEnv names the directory the browser test saves its
// screenshots in (relative to the module's root); without it they go to a
// temporary directory. `STOCKADE_SCREENSHOTS=docs` refreshes the README's.
const screenshotsEnv = "STOCKADE_SCREENSHOTS"

// browser is a headless Debian chromium driven over the DevTools
// protocol, with a profile of its own.
type browser struct {
	t   *testing.T
	ctx context.Context
	// shots is where screenshots go.
	shots string
}

// chromium finds Debian's chromium (or chromium-headless-shell);
// scripts/test.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-headless-shell", "/usr/lib/chromium/chromium-headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "chromium not found (apt-get install chromium; scripts/test.sh does)")
	return ""
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// This machine's network is closed: the browser's own
		// connections would only fail, slowly.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	shots := os.Getenv(screenshotsEnv)
	switch {
	case shots == "":
		shots = t.TempDir()
	case !filepath.IsAbs(shots):
		shots = filepath.Join(testenv.ModuleRoot(), shots)
	}
	return &browser{t: t, ctx: ctx, shots: shots}
}

// step bounds one exchange with the browser.
const step = 30 * time.Second

// do runs actions, failing the test on an error.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// run runs one action and returns its value.
func run[T any](b *browser, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("browser: %v", err)
	}
	return v
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, js string) T {
	b.t.Helper()
	return run(b, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
}

func (b *browser) location() string {
	b.t.Helper()
	u, err := url.Parse(run(b, chromedp.Location()))
	if err != nil {
		b.t.Fatal(err)
	}
	return u.Path
}

// screenshot saves a PNG of the element sel as name.
func (b *browser) screenshot(sel, name string) {
	b.t.Helper()
	png := run(b, chromedp.Screenshot(chromedp.CSS(sel)))
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		b.t.Fatalf("screenshot %s: got %d bytes, not a PNG", name, len(png))
	}
	if err := os.MkdirAll(b.shots, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", filepath.Join(b.shots, name))
}

// cookies returns the browser's cookies for the console.
func (b *browser) cookies(u string) []*network.Cookie {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{u}})
	if err != nil {
		b.t.Fatalf("reading cookies: %v", err)
	}
	return res.Cookies
}

// unnamed lists the controls of the page (buttons, links, fields) that
// have no accessible name, as "role: html", and counts the controls.
func (b *browser) unnamed() (missing []string, controls int) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	res, err := chromedp.Call(ctx, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
	if err != nil {
		b.t.Fatalf("reading the accessibility tree: %v", err)
	}
	for _, n := range res.Nodes {
		if n.Ignored || n.Role == nil {
			continue
		}
		var role, name string
		_ = json.Unmarshal(n.Role.Value, &role)
		if !slices.Contains([]string{"button", "link", "textbox", "combobox", "checkbox", "radio", "searchbox"}, role) {
			continue
		}
		controls++
		if n.Name != nil {
			_ = json.Unmarshal(n.Name.Value, &name)
		}
		if strings.TrimSpace(name) == "" {
			missing = append(missing, fmt.Sprintf("%s (node %d)", role, n.BackendDOMNodeID))
		}
	}
	return missing, controls
}

// signIn signs in through the form with key.
func (b *browser) signIn(base, key string) {
	b.t.Helper()
	b.do(chromedp.Navigate(base+"/ui/sign-in"), chromedp.WaitVisible(chromedp.ID("key")), chromedp.SendKeys(chromedp.ID("key"), key))
	click(b, chromedp.CSS(`.signin button[type="submit"]`))
}

// click clicks what sel finds and waits for the page it leads to.
func click[S chromedp.Selectable](b *browser, sel S) *network.Response {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, step)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(sel))
	if err != nil {
		b.t.Fatalf("browser: clicking %v: %v", sel, err)
	}
	return resp
}

// TestBrowser drives the console in a real chromium against a daemon
// with real runc sandboxes: an approver signs in, an agent asks to run
// code through the API, the request appears on the page without a
// reload, the approver reads the code and approves, and the result
// appears; then the deny path, a request decided elsewhere and one that
// expires (both update in place), hostile code that must render inert and
// visible, the executions page and an execution's trail, a POST without
// the CSRF token, an agent's key refused at sign-in, and a revoked key's
// session ended. It saves screenshots of the pending card (phone-sized)
// and of the executions page, and checks the controls' accessible names.
func TestBrowser(t *testing.T) {
	e := newEnv(t, Options{Recheck: 300 * time.Millisecond})
	b := newBrowser(t)

	b.signIn(e.url, e.approver)
	if got := b.location(); got != "/ui/approvals" {
		t.Fatalf("after signing in: at %s, want /ui/approvals", got)
	}
	var session *network.Cookie
	for _, ck := range b.cookies(e.url + "/ui/") {
		if ck.Name == sessionCookie {
			session = ck
		}
	}
	if session == nil || !session.HTTPOnly || session.SameSite != network.CookieSameSiteStrict || session.Session || session.Path != "/ui/" {
		t.Fatalf("session cookie: got %+v, want HttpOnly, SameSite=Strict, with an expiry, path /ui/", session)
	}
	// A page that reloads loses this.
	b.do(chromedp.Evaluate[chromedp.Void](`window.stayed = true`))
	stayed := func(when string) {
		t.Helper()
		if !eval[bool](b, `window.stayed === true`) {
			t.Fatalf("%s: the page was reloaded", when)
		}
	}
	card := func(id string) string { return "#card-" + id }

	t.Run("approve", func(t *testing.T) {
		code := "total = sum(range(7))\nprint(6 * 7)  # the answer\n"
		exec, approval := e.ask(capability.InvokeRequest{Runtime: "python", Code: code})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))))
		stayed("the request appeared")
		if got := run(b, chromedp.TextContent(chromedp.CSS(card(approval)+" pre.code code"))); got != code {
			t.Errorf("code on the card: got %q, want %q", got, code)
		}
		facts := run(b, chromedp.Text(chromedp.CSS(card(approval)+" .facts")))
		for _, want := range []string{"agent (agent, key_", "risk high", "Expires", "none (no network"} {
			if !strings.Contains(facts, want) && !strings.Contains(run(b, chromedp.Text(chromedp.CSS(card(approval)))), want) {
				t.Errorf("card: %q missing from %q", want, facts)
			}
		}
		record := run(b, chromedp.Text(chromedp.CSS(card(approval)+" .record-lines")))
		for _, line := range []string{"Input trust", "Runtime tier", "Filesystem scope", "Egress allowlist", "Credentials reachable"} {
			if !strings.Contains(record, line) {
				t.Errorf("isolation record: %q missing from %q", line, record)
			}
		}

		// The phone-sized card, as the README shows it.
		b.do(chromedp.EmulateViewport(390, 844))
		if wide := eval[bool](b, `document.documentElement.scrollWidth > window.innerWidth`); wide {
			t.Error("at 390 px wide the page scrolls sideways")
		}
		b.screenshot(card(approval), "console-pending.png")
		missing, controls := b.unnamed()
		if len(missing) > 0 || controls < 5 {
			t.Errorf("controls without an accessible name: %v (of %d controls)", missing, controls)
		}
		b.do(chromedp.EmulateViewport(1280, 900))

		b.do(chromedp.Click(chromedp.CSS(card(approval) + " button.approve")))
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval) + ` .result .badge.st-succeeded`)))
		stayed("the result appeared")
		if got := run(b, chromedp.TextContent(chromedp.CSS(card(approval)+" .result pre.output"))); got != "42\n" {
			t.Errorf("stdout on the card: got %q, want 42", got)
		}
		if got := run(b, chromedp.Text(chromedp.CSS(card(approval)+" .decision"))); !strings.Contains(got, "Approved by approver") {
			t.Errorf("decision: got %q, want it to name the approver", got)
		}
		if v := e.execution(exec, 0); string(v.Status) != string(model.StatusSucceeded) {
			t.Errorf("execution: got %s, want succeeded", v.Status)
		}
	})

	t.Run("deny", func(t *testing.T) {
		exec, approval := e.ask(capability.InvokeRequest{Runtime: "shell", Code: "rm -rf /tmp/*"})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))),
			chromedp.SendKeys(chromedp.ID("reason-"+approval), "not on my watch"),
			chromedp.Click(chromedp.CSS(card(approval)+" button.deny")),
			chromedp.WaitVisible(chromedp.CSS(card(approval)+`[data-status="denied"]`)))
		if got := run(b, chromedp.Text(chromedp.CSS(card(approval)+" .decision"))); !strings.Contains(got, "Denied by approver") || !strings.Contains(got, "not on my watch") {
			t.Errorf("decision: got %q, want the approver and the reason", got)
		}
		if v := e.execution(exec, 0); string(v.Status) != string(model.StatusDenied) {
			t.Errorf("execution: got %s, want denied", v.Status)
		}
		stayed("denied")
	})

	t.Run("decided elsewhere", func(t *testing.T) {
		exec, approval := e.ask(capability.InvokeRequest{Runtime: "shell", Code: "echo elsewhere"})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))))
		if code, body := e.do("POST", "/v1/approvals/"+approval+"/approve", e.admin, map[string]string{"reason": "by curl"}); code != http.StatusOK {
			t.Fatalf("approving through the API: got %d %s", code, body)
		}
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval) + ` .result .badge.st-succeeded`)))
		if got := run(b, chromedp.Text(chromedp.CSS(card(approval)+" .decision"))); !strings.Contains(got, "Approved by admin") {
			t.Errorf("decision: got %q, want it to name the admin", got)
		}
		e.execution(exec, 0)
		stayed("decided elsewhere")
	})

	t.Run("expires", func(t *testing.T) {
		_, approval := e.ask(capability.InvokeRequest{Runtime: "python", Code: "print('too late')"})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))))
		e.clock.advance(time.Hour) // past the 10 minutes of an approval
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval) + `[data-status="expired"]`)))
		stayed("expired")
	})

	t.Run("hostile code renders inert and visible", func(t *testing.T) {
		long := strings.Repeat("x", 6000) + "END_OF_LONG_LINE"
		code := "</script><script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">\n" +
			"{{.}} {{template \"head\" .}} <b>bold</b> &amp;\n" +
			"access = 'user\u202e \u2066# admin\u2069 \u2066'\n" + long + "\n"
		_, approval := e.ask(capability.InvokeRequest{Runtime: "python", Code: code, Stdin: "</pre><script>window.pwned = 3</script>"})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))))
		if got := eval[string](b, `String(window.pwned)`); got != "undefined" {
			t.Errorf("window.pwned: got %s, want undefined (the code ran)", got)
		}
		if n := eval[int](b, `document.querySelectorAll('`+card(approval)+` img, `+card(approval)+` b, `+card(approval)+` pre script').length`); n != 0 {
			t.Errorf("got %d elements made of the code, want none", n)
		}
		text := run(b, chromedp.TextContent(chromedp.CSS(card(approval)+" pre.code code")))
		for _, want := range []string{"</script><script>", "<img src=x", "{{.}}", "<b>bold</b> &amp;", "[RLO]", "[LRI]# admin[PDI]", "END_OF_LONG_LINE"} {
			if !strings.Contains(text, want) {
				t.Errorf("code on the card: %q missing", want)
			}
		}
		if strings.ContainsAny(text, "\u202e\u2066\u2069") {
			t.Error("a bidi control reached the page as itself")
		}
		if !strings.Contains(run(b, chromedp.Text(chromedp.CSS(card(approval)+" .warn"))), "4 invisible or direction-changing characters") {
			t.Error("the card does not warn of the 4 hidden characters")
		}
		// The long line wraps: its end is on screen, not past the edge.
		right := eval[float64](b, `(() => { const r = document.createRange(); const n = [...document.querySelectorAll('`+card(approval)+` pre.code .line')][3]; r.selectNodeContents(n); const rects = r.getClientRects(); return rects[rects.length-1].right; })()`)
		if width := eval[float64](b, `window.innerWidth`); right > width {
			t.Errorf("the long line ends at x=%.0f, past the window's %.0f px", right, width)
		}
		b.do(chromedp.Click(chromedp.CSS(card(approval)+" button.deny")),
			chromedp.WaitVisible(chromedp.CSS(card(approval)+`[data-status="denied"]`)))
	})

	t.Run("csrf", func(t *testing.T) {
		_, approval := e.ask(capability.InvokeRequest{Runtime: "shell", Code: "echo csrf"})
		b.do(chromedp.WaitVisible(chromedp.CSS(card(approval))))
		// The session's cookie goes along; the token does not.
		status := eval[int](b, `fetch('/ui/approvals/`+approval+`/approve', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'reason=forged'}).then(r => r.status)`)
		if status != http.StatusForbidden {
			t.Errorf("POST without the CSRF token: got %d, want 403", status)
		}
		status = eval[int](b, `fetch('/ui/approvals/`+approval+`/approve', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'csrf=wrong'}).then(r => r.status)`)
		if status != http.StatusForbidden {
			t.Errorf("POST with a wrong CSRF token: got %d, want 403", status)
		}
		if code, body := e.do("GET", "/v1/approvals?status=pending", e.approver, nil); code != http.StatusOK || !strings.Contains(string(body), approval) {
			t.Errorf("the request is no longer pending after the forged POSTs: %d %s", code, body)
		}
		b.do(chromedp.Click(chromedp.CSS(card(approval)+" button.deny")),
			chromedp.WaitVisible(chromedp.CSS(card(approval)+`[data-status="denied"]`)))
	})

	t.Run("executions", func(t *testing.T) {
		b.do(chromedp.Navigate(e.url+"/ui/executions"), chromedp.WaitVisible(chromedp.CSS("table.list tbody tr")))
		rows := eval[int](b, `document.querySelectorAll('table.list tbody tr').length`)
		if rows != 6 {
			t.Errorf("executions listed: got %d, want 6", rows)
		}
		if got := run(b, chromedp.Text(chromedp.CSS("table.list tbody"))); !strings.Contains(got, "42") || !strings.Contains(got, "succeeded") {
			t.Errorf("executions: got %q, want the succeeded one with its output", got)
		}
		b.screenshot("main", "console-executions.png")
		b.do(chromedp.SetValue(chromedp.ID("status"), "denied"))
		click(b, chromedp.CSS(`.filter button`))
		statuses := eval[[]string](b, `[...document.querySelectorAll('table.list tbody .badge')].map(b => b.textContent)`)
		if len(statuses) != 3 || slices.ContainsFunc(statuses, func(s string) bool { return s != "denied" }) {
			t.Errorf("filtered by denied: got %q, want 3 denied", statuses)
		}
		click(b, chromedp.CSS("table.list tbody a"))
		trail := run(b, chromedp.Text(chromedp.CSS("table.list")))
		for _, want := range []string{"capability.invoke_allowed", "approval.requested", "approval.denied"} {
			if !strings.Contains(trail, want) {
				t.Errorf("the execution's trail lacks %s: %q", want, trail)
			}
		}
		missing, _ := b.unnamed()
		if len(missing) > 0 {
			t.Errorf("controls without an accessible name: %v", missing)
		}
	})

	t.Run("workspace and audit", func(t *testing.T) {
		b.do(chromedp.Navigate(e.url+"/ui/workspace"), chromedp.WaitVisible(chromedp.ID("credits-h")))
		// 100 granted, two runs charged 2 each.
		if got := run(b, chromedp.Text(chromedp.CSS(".facts .big"))); got != "96" {
			t.Errorf("credits available: got %q, want 96", got)
		}
		b.do(chromedp.Navigate(e.url+"/ui/audit"), chromedp.WaitVisible(chromedp.ID("chain-status")))
		if got := run(b, chromedp.Text(chromedp.ID("chain-status"))); !strings.HasPrefix(got, "OK:") {
			t.Errorf("chain status: got %q, want OK", got)
		}
	})

	t.Run("agent key cannot sign in", func(t *testing.T) {
		b.do(chromedp.Navigate(e.url + "/ui/approvals"))
		click(b, chromedp.CSS(".signout button"))
		b.signIn(e.url, e.agent)
		if got := run(b, chromedp.Text(chromedp.CSS(".flash"))); !strings.Contains(got, "Only approver and admin keys") {
			t.Errorf("signing in with an agent key: got %q", got)
		}
		if got := b.location(); got != "/ui/sign-in" {
			t.Errorf("at %s, want still /ui/sign-in", got)
		}
		for _, ck := range b.cookies(e.url + "/ui/") {
			if ck.Name == sessionCookie {
				t.Errorf("got a session cookie for an agent key")
			}
		}
	})

	t.Run("revoked key", func(t *testing.T) {
		b.signIn(e.url, e.approver)
		b.do(chromedp.WaitVisible(chromedp.ID("pending-h")))
		cookies := b.cookies(e.url + "/ui/")
		e.revoke(e.approverID)
		// The live page's stream sees the revocation and leaves.
		b.do(chromedp.WaitVisible(chromedp.ID("key")))
		if got := b.location(); got != "/ui/sign-in" {
			t.Errorf("after the revocation: at %s, want /ui/sign-in", got)
		}
		// The old cookie opens nothing.
		req, _ := http.NewRequestWithContext(t.Context(), "GET", e.url+"/ui/approvals", nil)
		for _, ck := range cookies {
			req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("the revoked key's cookie: got %d, want 401", resp.StatusCode)
		}
		b.signIn(e.url, e.approver)
		if got := run(b, chromedp.Text(chromedp.CSS(".flash"))); !strings.Contains(got, "not valid, or was revoked") {
			t.Errorf("signing in with the revoked key: got %q", got)
		}
	})
}
