package tools

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/templates"
)

// validateTemplate checks the template the tool names: that Options know
// it, that it is the declaration the tool was bound to, what LintTemplate
// says, and that its files lie under this validation's data root (the
// templates were validated against the configuration's, which is the same
// in the daemon and the CLI; a different one here must not let them pass).
func validateTemplate(t Tool, opts Options) Problems {
	if t.Template == "" {
		return nil
	}
	var ps Problems
	add := func(rule, format string, a ...any) {
		ps = append(ps, Problem{Source: t.Source, Tool: t.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}
	tmpl, err := opts.Templates.Get(t.Template)
	if err != nil {
		if names := opts.Templates.Names(); len(names) > 0 {
			add(RuleTemplate, "unknown template %q (known: %s)", t.Template, strings.Join(names, ", "))
		} else {
			add(RuleTemplate, "unknown template %q: no template is configured (templates: in the configuration)", t.Template)
		}
		return ps
	}
	if t.template != nil && templates.Key(*t.template) != templates.Key(tmpl) {
		add(RuleTemplate, "the tool carries a declaration of template %q other than the configured one; load the tools again", t.Template)
	}
	ps = append(ps, LintTemplate(t, tmpl)...)
	if len(tmpl.Files) > 0 {
		for _, p := range templates.Validate([]templates.Template{tmpl}, templates.Options{DataRoot: opts.DataRoot}) {
			if strings.Contains(p.Field, ".files") {
				add(RuleTemplateFiles, "template %q: %s: %s", t.Template, p.Field, p.Message)
			}
		}
	}
	return ps
}

// LintTemplate returns the problems of running tool t with template tmpl
// that the tool's record forbids; none means the record says truly what
// its sandboxes hold. Validate applies it to every tool that names a
// template. The rules:
//
//   - template-runtime: the tool's runtimes, when it lists them, include
//     the template's base; otherwise no invocation could run it.
//   - template-env-secret: the template sets no variable that holds a
//     secret, by its name (HF_TOKEN, DB_PASSWORD, AWS_SECRET_ACCESS_KEY,
//     ..._API_KEY) or by its value (a URL with a password). The record's
//     credentials line promises that no secret is in the sandbox and that
//     the tool reaches only its broker operations; a secret belongs in the
//     broker.
//
// Validate also checks the template's files against its own data root
// (template-files). Packages that are network clients (curl, requests,
// node-fetch) are fine: the egress line is enforced by the sandbox's
// network, not by which programs the image holds, and every runtime can
// open a socket already.
func LintTemplate(t Tool, tmpl templates.Template) Problems {
	var ps Problems
	add := func(rule, format string, a ...any) {
		ps = append(ps, Problem{Source: t.Source, Tool: t.Name, Rule: rule, Message: fmt.Sprintf(format, a...)})
	}
	if len(t.Runtimes) > 0 && !slices.Contains(t.Runtimes, tmpl.Base) {
		add(RuleTemplateRuntime, "template %q extends %s, which the tool's runtimes (%s) leave out; add %s to runtimes, or leave runtimes out",
			tmpl.Name, tmpl.Base, strings.Join(t.Runtimes, ", "), tmpl.Base)
	}
	for _, k := range slices.Sorted(maps.Keys(tmpl.Env)) {
		switch {
		case secretName(k):
			add(RuleTemplateEnvSecret, "template %q sets %s, which by its name holds a secret; the record promises no secret in the sandbox: give the tool a broker operation (credentials) instead", tmpl.Name, k)
		case urlPasswordRE.MatchString(tmpl.Env[k]):
			add(RuleTemplateEnvSecret, "template %q sets %s to a URL with a password; the record promises no secret in the sandbox: give the tool a broker operation (credentials) instead", tmpl.Name, k)
		}
	}
	return ps
}

var urlPasswordRE = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:]*:[^/@\s]+@`)

// secretName reports whether an environment variable's name says it holds
// a secret: one of its '_'-separated words is TOKEN, SECRET, PASSWORD,
// PASSWD, CREDENTIAL(S) or APIKEY, or two are API KEY, PRIVATE KEY or
// ACCESS KEY. TOKENIZERS_PARALLELISM and MAX_TOKENS are not.
func secretName(k string) bool {
	words := strings.Split(strings.ToUpper(k), "_")
	for i, w := range words {
		switch w {
		case "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY":
			return true
		case "KEY":
			if i > 0 && (words[i-1] == "API" || words[i-1] == "PRIVATE" || words[i-1] == "ACCESS") {
				return true
			}
		}
	}
	return false
}
