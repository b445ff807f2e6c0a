package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
)

// inline finds what the Content-Security-Policy would refuse to run or
// apply, were it loosened: inline scripts, event handler attributes,
// style attributes and elements, javascript: URLs.
var inline = regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>[^<]|<script>|\son[a-z]+\s*=|\sstyle\s*=|<style|javascript:`)

// TestPages checks every page of the console for a signed-in approver:
// it answers 200 with the security headers, and holds no inline script
// or style, and never the key.
func TestPages(t *testing.T) {
	e := newEnv(t, Options{})
	exec, approval := e.ask(capability.InvokeRequest{Runtime: "python", Code: "print(6*7)", Stdin: "some input"})
	c := e.newClient()
	c.signedIn(e.approver)
	for _, path := range []string{
		"/ui/sign-in", "/ui/approvals", "/ui/approvals/" + approval, "/ui/fragments/card/" + approval, "/ui/fragments/pending",
		"/ui/executions", "/ui/executions?status=awaiting_approval", "/ui/executions/" + exec, "/ui/fragments/executions",
		"/ui/workspace", "/ui/audit",
	} {
		t.Run(path, func(t *testing.T) {
			resp, body := c.request("GET", path, nil, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("got %d, want 200\n%s", resp.StatusCode, body)
			}
			for h, want := range map[string]string{
				"Content-Security-Policy": contentSecurityPolicy, "X-Frame-Options": "DENY",
				"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
			} {
				if got := resp.Header.Get(h); got != want {
					t.Errorf("%s: got %q, want %q", h, got, want)
				}
			}
			if m := inline.FindString(body); m != "" {
				t.Errorf("inline script or style %q in\n%s", m, body)
			}
			if strings.Contains(body, e.approver) || strings.Contains(body, e.agent) {
				t.Error("the page holds a key")
			}
		})
	}
	for _, csp := range []string{"'unsafe-inline'", "'unsafe-eval'", "frame-ancestors 'none'"} {
		if strings.Contains(contentSecurityPolicy, csp) != (csp == "frame-ancestors 'none'") {
			t.Errorf("Content-Security-Policy %q: %s is wrong there", contentSecurityPolicy, csp)
		}
	}
}

// TestSignIn checks the sign-in form: an agent's key, an unknown key and
// a form without its token are refused, none of them rendered back; an
// approver's key gets a session cookie that is HttpOnly, SameSite=Strict,
// limited to /ui/ and expiring, and Secure when the daemon says it is
// behind TLS; signing out ends the session.
func TestSignIn(t *testing.T) {
	e := newEnv(t, Options{SessionTTL: time.Hour})
	t.Run("agent key", func(t *testing.T) {
		c := e.newClient()
		resp, body := c.signIn(e.agent)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "Only approver and admin keys can sign in") {
			t.Errorf("got %d, want 403 saying only approvers and admins sign in\n%s", resp.StatusCode, body)
		}
		if strings.Contains(body, e.agent) {
			t.Error("the answer holds the key")
		}
		if ck := cookie(resp, sessionCookie); ck != nil && ck.MaxAge >= 0 {
			t.Errorf("got a session cookie %v", ck)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		resp, body := e.newClient().signIn("sk_not_a_key_at_all")
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "sk_not_a_key_at_all") {
			t.Errorf("got %d (key rendered back: %v), want 401 without the key", resp.StatusCode, strings.Contains(body, "sk_not_a_key_at_all"))
		}
	})
	t.Run("no form token", func(t *testing.T) {
		c := e.newClient()
		c.request("GET", "/ui/sign-in", nil, nil)
		resp, _ := c.request("POST", "/ui/sign-in", url.Values{"key": {e.approver}}, nil)
		if resp.StatusCode != http.StatusForbidden || cookie(resp, sessionCookie) != nil {
			t.Errorf("got %d, want 403 and no session", resp.StatusCode)
		}
	})
	t.Run("approver", func(t *testing.T) {
		c := e.newClient()
		resp, _ := c.signIn(e.approver)
		ck := cookie(resp, sessionCookie)
		if resp.StatusCode != http.StatusSeeOther || ck == nil {
			t.Fatalf("got %d, cookie %v; want 303 with a session cookie", resp.StatusCode, ck)
		}
		if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/ui/" || ck.MaxAge != 3600 || ck.Secure {
			t.Errorf("session cookie: got %+v, want HttpOnly, SameSite=Strict, Path=/ui/, Max-Age=3600, not Secure on plain HTTP", ck)
		}
		if resp, _ := c.request("GET", "/ui/approvals", nil, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("approvals after signing in: got %d", resp.StatusCode)
		}
		_, page := c.request("GET", "/ui/approvals", nil, nil)
		resp, _ = c.request("POST", "/ui/sign-out", url.Values{"csrf": {formToken(t, page)}}, nil)
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("sign-out: got %d, want 303", resp.StatusCode)
		}
		if resp, _ := c.request("GET", "/ui/approvals", nil, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("approvals after signing out: got %d, want 401 (the sign-in page)", resp.StatusCode)
		}
	})
	t.Run("behind TLS", func(t *testing.T) {
		e.console.opts.SecureCookies = true
		defer func() { e.console.opts.SecureCookies = false }()
		resp, _ := e.newClient().signIn(e.approver)
		if ck := cookie(resp, sessionCookie); ck == nil || !ck.Secure {
			t.Errorf("session cookie: got %+v, want Secure", ck)
		}
	})
}

func cookie(resp *http.Response, name string) *http.Cookie {
	for _, ck := range resp.Cookies() {
		if ck.Name == name {
			return ck
		}
	}
	return nil
}

// TestDecisionsGoThroughTheService checks that the console decides
// nothing itself: what the service refuses (an admin approving its own
// request, a request the policy no longer allows) is refused on the page
// too, with the service's reason, and a form without the session's token,
// or sent from another site, changes nothing.
func TestDecisionsGoThroughTheService(t *testing.T) {
	e := newEnv(t, Options{})
	admin := e.newClient()
	admin.signedIn(e.admin)
	fragment := http.Header{"X-Stockade-Fragment": {"1"}}

	code, b := e.do("POST", "/v1/executions", e.admin, capability.InvokeRequest{Runtime: "shell", Code: "echo mine"})
	if code != http.StatusAccepted {
		t.Fatalf("admin invoking: got %d %s", code, b)
	}
	own := approvalID(t, b)
	resp, body := admin.request("POST", "/ui/approvals/"+own+"/approve", url.Values{"csrf": {admin.csrf}}, fragment)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `class="flash"`) || !strings.Contains(body, `data-status="pending"`) {
		t.Errorf("approving its own request: got %d, want 403 with the card still pending and why\n%s", resp.StatusCode, body)
	}

	_, other := e.ask(capability.InvokeRequest{Runtime: "shell", Code: "echo policy"})
	approver := e.newClient()
	approver.signedIn(e.approver)
	for _, tc := range []struct {
		name   string
		form   url.Values
		header http.Header
	}{
		{"no token", url.Values{}, nil},
		{"another session's token", url.Values{"csrf": {admin.csrf}}, nil},
		{"from another site", url.Values{"csrf": {approver.csrf}}, http.Header{"Origin": {"https://evil.example"}}},
		{"from another site, by fetch metadata", url.Values{"csrf": {approver.csrf}}, http.Header{"Sec-Fetch-Site": {"cross-site"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := approver.request("POST", "/ui/approvals/"+other+"/approve", tc.form, tc.header)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("got %d, want 403", resp.StatusCode)
			}
		})
	}

	pol, err := e.st.GetPolicy(t.Context(), e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	pol.Runtimes = []string{"python"}
	if _, err := e.st.SetPolicy(t.Context(), e.ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	resp, body = approver.request("POST", "/ui/approvals/"+other+"/approve", url.Values{"csrf": {approver.csrf}}, fragment)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "policy no longer allows") {
		t.Errorf("approving what the policy no longer allows: got %d, want 409 naming the policy\n%s", resp.StatusCode, body)
	}
	resp, body = approver.request("POST", "/ui/approvals/"+other+"/deny", url.Values{"csrf": {approver.csrf}, "reason": {"policy changed"}}, fragment)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-status="denied"`) || !strings.Contains(body, "policy changed") {
		t.Errorf("denying it: got %d, want the denied card with the reason\n%s", resp.StatusCode, body)
	}
	// Without the script the form answers with a redirect back.
	_, third := e.ask(capability.InvokeRequest{Runtime: "python", Code: "print(3)"})
	resp, _ = approver.request("POST", "/ui/approvals/"+third+"/deny", url.Values{"csrf": {approver.csrf}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/approvals#card-"+third {
		t.Errorf("denying by a plain form: got %d to %q, want 303 to the card", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func approvalID(t *testing.T, b []byte) string {
	t.Helper()
	var v struct {
		ApprovalID string `json:"approval_id"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.ApprovalID == "" {
		t.Fatalf("no approval in %s", b)
	}
	return v.ApprovalID
}

// TestSignInRateLimit checks that sign-in attempts from one address are
// limited, with Retry-After, whether the key is right or wrong.
func TestSignInRateLimit(t *testing.T) {
	e := newEnv(t, Options{})
	c := e.newClient()
	for i := range int(signinPerAddr.burst) {
		if resp, _ := c.signIn("sk_wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: got %d, want 401", i+1, resp.StatusCode)
		}
	}
	resp, body := c.signIn(e.approver)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "Too many sign-in attempts") {
		t.Errorf("attempt past the limit: got %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestExecutionsPaged checks the executions list's filter and pages.
func TestExecutionsPaged(t *testing.T) {
	e := newEnv(t, Options{})
	for i := range pageSize + 3 {
		e.ask(capability.InvokeRequest{Runtime: "python", Code: fmt.Sprintf("print(%d)", i)})
	}
	c := e.newClient()
	c.signedIn(e.approver)
	_, first := c.request("GET", "/ui/executions?status=awaiting_approval", nil, nil)
	if n := strings.Count(first, `<tr id="exec-`); n != pageSize {
		t.Errorf("first page: got %d rows, want %d", n, pageSize)
	}
	next := regexp.MustCompile(`href="/ui/executions\?([^"]+)">Older`).FindStringSubmatch(first)
	if next == nil {
		t.Fatalf("first page: no link to the older executions")
	}
	_, second := c.request("GET", "/ui/executions?"+strings.ReplaceAll(next[1], "&amp;", "&"), nil, nil)
	if n := strings.Count(second, `<tr id="exec-`); n != 3 || strings.Contains(second, ">Older<") {
		t.Errorf("second page: got %d rows, want 3 and no older page", n)
	}
	_, none := c.request("GET", "/ui/executions?status=succeeded", nil, nil)
	if strings.Contains(none, `<tr id="exec-`) {
		t.Error("status=succeeded: got rows, want none")
	}
	if resp, _ := c.request("GET", "/ui/executions?status=bogus", nil, nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status=bogus: got %d, want 400", resp.StatusCode)
	}
}

// TestAuditPage checks the chain's verdict on the audit page: ok, a
// warning without a witness, and broken at the row changed under the
// daemon.
func TestAuditPage(t *testing.T) {
	t.Run("no witness", func(t *testing.T) {
		e := newEnvWith(t, Options{}, envConfig{noWitness: true})
		c := e.newClient()
		c.signedIn(e.approver)
		_, page := c.request("GET", "/ui/audit", nil, nil)
		if !strings.Contains(page, "OK:") || !strings.Contains(page, "has no audit witness") {
			t.Errorf("got no OK with the warning of no witness\n%s", page)
		}
	})
	t.Run("broken", func(t *testing.T) {
		e := newEnv(t, Options{})
		e.ask(capability.InvokeRequest{Runtime: "python", Code: "print(1)"})
		c := e.newClient()
		c.signedIn(e.approver)
		_, page := c.request("GET", "/ui/audit", nil, nil)
		if !strings.Contains(page, "OK: 2 events verify") {
			t.Fatalf("before tampering: got no OK for 2 events\n%s", page)
		}
		unsafe, ok := e.st.(interface {
			UnsafeExec(context.Context, string, ...any) error
		})
		if !ok {
			t.Fatalf("the SQLite store has no UnsafeExec")
		}
		if err := unsafe.UnsafeExec(t.Context(), `UPDATE audit_events SET reason = 'nothing to see' WHERE workspace_id = ? AND seq = 1`, e.ws.ID); err != nil {
			t.Fatal(err)
		}
		_, page = c.request("GET", "/ui/audit", nil, nil)
		if !regexp.MustCompile(`BROKEN at seq 1 \(event <code>evt_[^<]+</code>\): [^.]+`).MatchString(page) {
			t.Errorf("after tampering: got no BROKEN at seq 1\n%s", page)
		}
	})
}

// TestToolReview checks the workspace page of a workspace whose policy
// requires review of changed tools: a tool whose egress allowlist grew
// shows the diff and a re-approve button, which re-approves it through the
// service.
func TestToolReview(t *testing.T) {
	tool := func(domains string) string {
		return "tools:\n  - name: fetch\n    input_trust: trusted\n    tier: container\n    egress: {allow: [" + domains + "], ports: [443]}\n"
	}
	e := newEnvWith(t, Options{}, envConfig{toolsBefore: tool("api.example.com"), tools: tool("api.example.com, evil.example.net")})
	pol, err := e.st.GetPolicy(t.Context(), e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	pol.ToolChanges = model.ToolChangesRequireReview
	if _, err := e.st.SetPolicy(t.Context(), e.ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	c := e.newClient()
	c.signedIn(e.approver)
	_, page := c.request("GET", "/ui/workspace", nil, nil)
	page = html.UnescapeString(page)
	for _, want := range []string{"review required", "egress.allow +evil.example.net", "Re-approve", "<code>evil.example.net</code>"} {
		if !strings.Contains(page, want) {
			t.Errorf("workspace page: %q missing\n%s", want, page)
		}
	}
	resp, _ := c.request("POST", "/ui/tools/fetch/approve", url.Values{"csrf": {c.csrf}, "reason": {"checked the new host"}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("re-approving: got %d, want 303", resp.StatusCode)
	}
	_, page = c.request("GET", "/ui/workspace", nil, nil)
	if strings.Contains(page, "review required") {
		t.Error("after re-approving: the tool still waits for review")
	}
	_, audit := c.request("GET", "/ui/audit", nil, nil)
	if !strings.Contains(audit, "tool.review_approved") || !strings.Contains(audit, "checked the new host") {
		t.Error("the audit page shows no tool.review_approved event with the reason")
	}
}

// TestPageWeight measures what a browser fetches for the approvals page
// with one pending card: the HTML, the script and the style sheet. It
// keeps the page within a budget that a phone on a slow link loads at
// once.
func TestPageWeight(t *testing.T) {
	const budget = 48 << 10
	e := newEnv(t, Options{})
	e.ask(capability.InvokeRequest{Runtime: "python", Code: "import json\nprint(json.dumps({'answer': 6 * 7}))\n"})
	c := e.newClient()
	c.signedIn(e.approver)
	total := 0
	for _, path := range []string{"/ui/approvals", c.e.console.asset("console.js"), c.e.console.asset("console.css")} {
		resp, body := c.request("GET", path, nil, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: got %d", path, resp.StatusCode)
		}
		t.Logf("%-40s %6d bytes", path, len(body))
		total += len(body)
	}
	t.Logf("%-40s %6d bytes", "total", total)
	if total > budget {
		t.Errorf("the approvals page weighs %d bytes, over its budget of %d", total, budget)
	}
}

// TestForkApprovalShown checks the workspace page says what the policy's
// fork_approval does: anew by default, inherit once set.
func TestForkApprovalShown(t *testing.T) {
	e := newEnvWith(t, Options{}, envConfig{})
	c := e.newClient()
	c.signedIn(e.approver)
	_, page := c.request("GET", "/ui/workspace", nil, nil)
	if page = html.UnescapeString(page); !strings.Contains(page, "approved anew") || strings.Contains(page, "(inherit)") {
		t.Fatalf("the default policy's page: want \"approved anew\" and not inherit\n%s", page)
	}
	pol, err := e.st.GetPolicy(t.Context(), e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	pol.Approval, pol.ForkApproval = model.ApprovalPerSession, model.ForkApprovalInherit
	if _, err := e.st.SetPolicy(t.Context(), e.ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	_, page = c.request("GET", "/ui/workspace", nil, nil)
	if page = html.UnescapeString(page); !strings.Contains(page, "covered by its source's approval (inherit)") {
		t.Fatalf("the page under fork_approval inherit: want it said\n%s", page)
	}
}
