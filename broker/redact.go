package broker

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
)

// redacted replaces the secret wherever an upstream echoes it.
const redacted = "[redacted by stockade]"

// A redactor finds a secret in what an upstream answers, as it is and in
// the encodings an upstream is likely to echo it in:
//
//   - base64, standard and URL alphabet, with and without padding, also in
//     the middle of a longer base64 text (as in a Basic authorization echoed
//     back): at each of the three alignments the characters that encode
//     only the secret's bytes are found;
//   - hex, in either case;
//   - each of those, and the secret itself, with any of its bytes
//     percent-escaped (either case of hex digits, so that escaping which
//     leaves '/' alone and lower-case %2f are found too), a space as '+',
//     or escaped in a JSON string (\/, \\, \", \uXXXX for ASCII).
//
// It cannot find a secret the upstream transforms otherwise (see the
// README): encrypted, hashed, compressed, split, base64 wrapped over lines,
// encoded twice, or in encodings not listed here.
type redactor struct {
	forms []form
	// start marks the bytes an encoding of a form can begin with.
	start [256]bool
	// cur and next are the matcher's scratch position sets.
	cur, next []int
}

// form is one encoding of the secret to look for; fold matches ASCII
// letters in either case (hex).
type form struct {
	b    []byte
	fold bool
}

// minEncoded is the shortest base64 text of a part of the secret the
// redactor looks for: shorter ones would match by chance.
const minEncoded = 8

func newRedactor(secret string) *redactor {
	r := &redactor{}
	add := func(s string, fold bool) {
		if len(s) < minEncoded && s != secret {
			return
		}
		if fold {
			s = strings.ToLower(s)
		}
		if slices.ContainsFunc(r.forms, func(f form) bool { return string(f.b) == s && f.fold == fold }) {
			return
		}
		r.forms = append(r.forms, form{b: []byte(s), fold: fold})
		r.start[s[0]] = true
		if fold {
			r.start[strings.ToUpper(s[:1])[0]] = true
		}
	}
	add(secret, false)
	// Go's JSON encoder escapes <, > and & as \u003c and so on, which the
	// matcher finds; this form also covers what it does to invalid UTF-8.
	if j, err := json.Marshal(secret); err == nil {
		add(string(j[1:len(j)-1]), false)
	}
	encs := []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding}
	for _, e := range encs {
		add(e.EncodeToString([]byte(secret)), false)
	}
	// Inside a longer base64 text the secret starts at any of three
	// offsets of a 3-byte group: from the group boundary after its start
	// on, every whole group of its bytes encodes the same four characters
	// whatever surrounds it.
	for skip := range 3 {
		part := secret[skip:]
		part = part[:len(part)/3*3]
		for _, e := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			add(e.EncodeToString([]byte(part)), false)
		}
	}
	add(hex.EncodeToString([]byte(secret)), true)
	for _, c := range []byte{'%', '+', '\\'} {
		r.start[c] = true
	}
	return r
}

// redact returns b with every match of a form replaced by redacted.
func (r *redactor) redact(b []byte) []byte {
	var out []byte
	done := 0
	for i := 0; i < len(b); {
		end := -1
		if r.start[b[i]] {
			for _, f := range r.forms {
				end = max(end, r.matchAt(b, i, f))
			}
		}
		if end < 0 {
			i++
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(b))
		}
		out = append(append(out, b[done:i]...), redacted...)
		done, i = end, end
	}
	if out == nil {
		return b
	}
	return append(out, b[done:]...)
}

// holds reports whether v holds a form of the secret.
func (r *redactor) holds(v string) bool {
	b := []byte(v)
	return !bytes.Equal(r.redact(b), b)
}

// matchAt returns the end of the longest encoding of f that starts at
// b[i], or -1. Several encodings may fit a byte of f at one place (a
// literal '%', or the escape "%25"), so it follows every position an
// encoding of the bytes so far can end at.
func (r *redactor) matchAt(b []byte, i int, f form) int {
	switch c := b[i]; {
	case c == f.b[0], f.fold && lower(c) == f.b[0], c == '%', c == '\\', c == '+' && f.b[0] == ' ':
	default:
		return -1
	}
	if !f.fold && bytes.HasPrefix(b[i:], f.b) {
		// The common case, answered without the walk below.
		return i + len(f.b)
	}
	cur := append(r.cur[:0], i)
	for _, c := range f.b {
		next := r.next[:0]
		for _, p := range cur {
			next = step(next, b, p, c, f.fold)
		}
		r.cur, r.next = next, cur
		if len(next) == 0 {
			return -1
		}
		cur = next
	}
	return slices.Max(cur)
}

// step appends to dst, once each, the positions after each encoding of
// byte c that starts at b[p]: c itself (in either case when fold), its
// percent-escape, '+' for a space, and its JSON string escapes.
func step(dst []int, b []byte, p int, c byte, fold bool) []int {
	if p >= len(b) {
		return dst
	}
	if is(b[p], c, fold) {
		dst = appendNew(dst, p+1)
	}
	switch b[p] {
	case '%':
		if p+2 < len(b) {
			if x, ok := unhex(b[p+1], b[p+2]); ok && is(x, c, fold) {
				dst = appendNew(dst, p+3)
			}
		}
	case '+':
		if c == ' ' {
			dst = appendNew(dst, p+1)
		}
	case '\\':
		if p+1 >= len(b) {
			break
		}
		switch e := b[p+1]; e {
		case '/', '\\', '"':
			if is(e, c, fold) {
				dst = appendNew(dst, p+2)
			}
		case 't':
			if c == '\t' {
				dst = appendNew(dst, p+2)
			}
		case 'u':
			if p+5 < len(b) {
				hi, ok1 := unhex(b[p+2], b[p+3])
				lo, ok2 := unhex(b[p+4], b[p+5])
				if ok1 && ok2 && hi == 0 && lo < 0x80 && is(lo, c, fold) {
					dst = appendNew(dst, p+6)
				}
			}
		}
	}
	return dst
}

// is reports whether x is c, or, with fold, c in another case.
func is(x, c byte, fold bool) bool { return x == c || fold && lower(x) == c }

func appendNew(s []int, v int) []int {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

func lower(x byte) byte {
	if 'A' <= x && x <= 'Z' {
		return x + 'a' - 'A'
	}
	return x
}

func unhex(a, b byte) (byte, bool) {
	hi, ok1 := hexDigit(a)
	lo, ok2 := hexDigit(b)
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(x byte) (byte, bool) {
	switch {
	case '0' <= x && x <= '9':
		return x - '0', true
	case 'a' <= x && x <= 'f':
		return x - 'a' + 10, true
	case 'A' <= x && x <= 'F':
		return x - 'A' + 10, true
	}
	return 0, false
}
