package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// The console's cookies. The session's is sent to every console page; the
// sign-in form's only back to the form.
const (
	sessionCookie = "stockade_console"
	signinCookie  = "stockade_signin"
	signinPath    = "/ui/sign-in"
)

// visit is a signed-in request: its session, and the key as the store
// has it now.
type visit struct {
	sess *session
	key  model.APIKey
	// labels caches the keys' labels of one request.
	labels map[string]string
}

// CSRF is the session's token for the forms of the page.
func (v *visit) CSRF() string { return v.sess.csrf }

// Who names the signed-in key: its label and role.
func (v *visit) Who() string {
	if v.key.Name != "" {
		return fmt.Sprintf("%s (%s)", v.key.Name, v.key.Role)
	}
	return fmt.Sprintf("%s (%s)", v.key.ID, v.key.Role)
}

// errSignedOut is the reason a session is no longer valid, in the words
// the sign-in page shows.
type errSignedOut string

func (e errSignedOut) Error() string { return string(e) }

// check looks the session's key up again: a key revoked, deleted or
// changed to another role or workspace ends every session of it.
func (c *Console) check(ctx context.Context, sess *session) (model.APIKey, error) {
	if !c.sessions.live(sess) {
		return model.APIKey{}, errSignedOut("Your session ended; sign in again.")
	}
	k, err := c.st.GetAPIKey(ctx, sess.p.KeyID)
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return k, fmt.Errorf("checking the signed-in key: %w", err)
	case k.RevokedAt.IsZero() && k.WorkspaceID == sess.p.WorkspaceID && k.Role == sess.p.Role:
		return k, nil
	}
	c.sessions.endKey(sess.p.KeyID)
	c.log.Info("console sessions ended: their key was revoked or changed", "key", sess.p.KeyID)
	return k, errSignedOut("Your key was revoked or changed; sign in again.")
}

// signedIn passes signed-in requests on to next. Others go to the sign-in
// page, or get 401 when the page's script asked.
func (c *Console) signedIn(next func(http.ResponseWriter, *http.Request, *visit)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sess *session
		if ck, err := r.Cookie(sessionCookie); err == nil {
			sess = c.sessions.get(ck.Value)
		}
		reason := "Sign in to continue."
		if sess != nil {
			k, err := c.check(r.Context(), sess)
			if err == nil {
				next(w, r, &visit{sess: sess, key: k, labels: map[string]string{}})
				return
			}
			if _, ok := err.(errSignedOut); !ok {
				c.failure(w, r, "checking a console session", err)
				return
			}
			reason = err.Error()
		}
		c.clearCookie(w, r, sessionCookie, "/ui/")
		if wantsFragment(r) || r.Method != http.MethodGet || r.URL.Path == "/ui/events" {
			c.errorPage(w, r, http.StatusUnauthorized, reason)
			return
		}
		c.renderSignIn(w, r, http.StatusUnauthorized, reason)
	}
}

// changes guards a state-changing request: its form (or the script's
// header) must carry the session's CSRF token.
func (c *Console) changes(next func(http.ResponseWriter, *http.Request, *visit)) func(http.ResponseWriter, *http.Request, *visit) {
	return func(w http.ResponseWriter, r *http.Request, v *visit) {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		token := r.Header.Get("X-CSRF-Token")
		if token == "" {
			token = r.PostForm.Get("csrf")
		}
		if !sameToken(token, v.sess.csrf) {
			c.errorPage(w, r, http.StatusForbidden, "This form is out of date or came from another page; reload the page and try again.")
			return
		}
		next(w, r, v)
	}
}

// secure reports whether cookies are to be marked Secure.
func (c *Console) secure(r *http.Request) bool { return r.TLS != nil || c.opts.SecureCookies }

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value, path string, ttl time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: path, MaxAge: int(ttl.Seconds()),
		Expires: c.opts.Now().Add(ttl), HttpOnly: true, Secure: c.secure(r), SameSite: http.SameSiteStrictMode})
}

func (c *Console) clearCookie(w http.ResponseWriter, r *http.Request, name, path string) {
	http.SetCookie(w, &http.Cookie{Name: name, Path: path, MaxAge: -1, HttpOnly: true, Secure: c.secure(r), SameSite: http.SameSiteStrictMode})
}

// signinForm is the sign-in page's data. The key typed is never sent back.
type signinForm struct {
	Token string
}

// signinTTL is how long a sign-in form may wait to be sent.
const signinTTL = 30 * time.Minute

// renderSignIn shows the sign-in form with a fresh form token, which the
// form sends back beside its cookie (a double submit: another site can
// neither read the cookie nor set it).
func (c *Console) renderSignIn(w http.ResponseWriter, r *http.Request, code int, flash string) {
	token := randomToken()
	c.setCookie(w, r, signinCookie, token, signinPath, signinTTL)
	c.render(w, code, "signin.html", &page{Title: "Sign in", Flash: flash, Data: signinForm{Token: token}, c: c})
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	flash := ""
	if r.URL.Query().Has("ended") {
		flash = "Your session ended; sign in again."
	}
	c.renderSignIn(w, r, http.StatusOK, flash)
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if ok, wait := c.signins.allow(clientPrefix(r.RemoteAddr), c.opts.Now()); !ok {
		secs := int(wait.Seconds()) + 1
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		c.renderSignIn(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many sign-in attempts; try again in %d seconds.", secs))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		c.renderSignIn(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	ck, err := r.Cookie(signinCookie)
	if err != nil || !sameToken(r.PostForm.Get("csrf"), ck.Value) {
		c.renderSignIn(w, r, http.StatusForbidden, "This form is out of date or came from another page; try again.")
		return
	}
	p, err := c.svc.Authenticate(r.Context(), strings.TrimSpace(r.PostForm.Get("key")))
	if err != nil {
		code, msg := c.describe(r, "signing in", err)
		if errdefs.IsUnauthenticated(err) {
			msg = "That key is not valid, or was revoked."
		}
		c.renderSignIn(w, r, code, msg)
		return
	}
	if p.Role != model.RoleApprover && p.Role != model.RoleAdmin {
		c.log.Info("console sign-in refused: not an approver or admin key", "key", p.KeyID, "role", p.Role)
		c.renderSignIn(w, r, http.StatusForbidden, "Only approver and admin keys can sign in; an agent's key cannot approve its own requests.")
		return
	}
	token, _ := c.sessions.create(p)
	c.log.Info("console sign-in", "key", p.KeyID, "workspace", p.WorkspaceID, "role", p.Role)
	c.clearCookie(w, r, signinCookie, signinPath)
	c.setCookie(w, r, sessionCookie, token, "/ui/", c.opts.SessionTTL)
	http.Redirect(w, r, "/ui/approvals", http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, v *visit) {
	c.sessions.end(v.sess)
	c.log.Info("console sign-out", "key", v.sess.p.KeyID)
	c.clearCookie(w, r, sessionCookie, "/ui/")
	http.Redirect(w, r, signinPath, http.StatusSeeOther)
}
