package console

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Token is a piece of code of one class, within one line. Highlighting is
// lossless: the texts of a line's tokens, and the lines joined by "\n",
// are the code.
type Token struct {
	// Class is "" for plain text, or kw (keyword), bi (builtin), str,
	// com (comment), num, var (a shell variable) or ctl.
	Class string
	Text  string
}

// Ctl reports whether the token is one character that would be invisible
// or would reorder the text around it (a control, format or bidi
// character); pages show its name instead of the character itself.
func (t Token) Ctl() bool { return t.Class == "ctl" }

// Label is how a ctl token is shown: its name in brackets.
func (t Token) Label() string {
	r, _ := utf8.DecodeRuneInString(t.Text)
	if n, ok := ctlNames[r]; ok {
		return "[" + n + "]"
	}
	return fmt.Sprintf("[U+%04X]", r)
}

// Title is the long name of a ctl token, for its tooltip.
func (t Token) Title() string {
	r, _ := utf8.DecodeRuneInString(t.Text)
	return fmt.Sprintf("U+%04X, an invisible or direction-changing character", r)
}

// ctlNames are the short names of the characters Trojan Source attacks
// use, and of the common invisible ones.
var ctlNames = map[rune]string{
	'\r': "CR", '\x00': "NUL", '\x1b': "ESC", '\u00ad': "SHY", '\u061c': "ALM",
	'\u200b': "ZWSP", '\u200c': "ZWNJ", '\u200d': "ZWJ", '\u200e': "LRM", '\u200f': "RLM",
	'\u2028': "LSEP", '\u2029': "PSEP",
	'\u202a': "LRE", '\u202b': "RLE", '\u202c': "PDF", '\u202d': "LRO", '\u202e': "RLO",
	'\u2060': "WJ", '\u2066': "LRI", '\u2067': "RLI", '\u2068': "FSI", '\u2069': "PDI", '\ufeff': "BOM",
}

// hidden reports whether r is shown by name: controls but tab and newline,
// format characters (bidi embeddings, overrides and isolates, zero-width
// characters), line and paragraph separators, private use characters and
// the replacement of invalid UTF-8.
func hidden(r rune) bool {
	if r == '\t' || r == '\n' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Co) || r == utf8.RuneError
}

// Code is highlighted code, line by line.
type Code struct {
	Lines [][]Token
	// Hidden counts the ctl tokens: characters a reader would not see.
	Hidden int
}

// Highlight splits code into lines of tokens for runtime ("python",
// "node", "shell"; any other is plain text). It never fails: code it does
// not understand is plain text, and every character is kept.
func Highlight(runtime, code string) Code {
	var toks []Token
	switch runtime {
	case "python":
		toks = scan(code, python)
	case "node":
		toks = scan(code, node)
	case "shell":
		toks = scan(code, shell)
	default:
		toks = []Token{{Text: code}}
	}
	var c Code
	line := []Token{}
	add := func(class, text string) {
		if text != "" {
			line = append(line, Token{Class: class, Text: text})
		}
	}
	for _, t := range toks {
		start := 0
		for i, r := range t.Text {
			switch {
			case r == '\n':
				add(t.Class, t.Text[start:i])
				c.Lines = append(c.Lines, line)
				line = []Token{}
				start = i + 1
			case hidden(r):
				add(t.Class, t.Text[start:i])
				// Invalid UTF-8 is one byte at a time.
				_, n := utf8.DecodeRuneInString(t.Text[i:])
				add("ctl", t.Text[i:i+n])
				c.Hidden++
				start = i + n
			}
		}
		add(t.Class, t.Text[start:])
	}
	c.Lines = append(c.Lines, line)
	return c
}

// lang describes a language to scan.
type lang struct {
	keywords, builtins map[string]bool
	// lineComment starts a comment to the end of the line; blockComment,
	// when set, opens one that "*/" closes.
	lineComment  string
	blockComment bool
	// quotes are the string delimiters; triple allows Python's triple
	// quotes, backtick JavaScript's template strings (which may span lines).
	quotes       string
	triple       bool
	shellish     bool // $VAR, ${VAR}; '#' starts a comment only at a word's start; strings span lines
	stringPrefix string
}

func words(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}

var (
	python = &lang{
		keywords: words(`False None True and as assert async await break class continue def del elif else except
			finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case`),
		builtins: words(`print len range open input int str float list dict set tuple bool bytes type isinstance
			getattr setattr hasattr eval exec compile __import__ globals locals vars dir sorted enumerate zip map filter sum min max abs`),
		lineComment: "#", quotes: `'"`, triple: true, stringPrefix: "rbfuRBFU",
	}
	node = &lang{
		keywords: words(`await break case catch class const continue debugger default delete do else export extends
			false finally for function if import in instanceof let new null return super switch this throw true try typeof
			undefined var void while with yield async of`),
		builtins: words(`console require process module exports globalThis Buffer JSON Math Object Array String Number
			Promise fetch eval Function setTimeout setInterval`),
		lineComment: "//", blockComment: true, quotes: "'\"`",
	}
	shell = &lang{
		keywords: words(`if then else elif fi for while until do done case esac in function select return exit break continue`),
		builtins: words(`echo printf read cd export local readonly unset set eval exec source trap test shift wait kill
			curl wget nc bash sh rm chmod cat base64`),
		lineComment: "#", quotes: `'"`, shellish: true,
	}
)

// scan tokenizes code. It is a scanner for highlighting, not a parser: it
// knows comments, strings, numbers and words, and anything else is plain.
func scan(code string, l *lang) []Token {
	var out []Token
	plainStart := 0
	flush := func(i int) {
		if i > plainStart {
			out = append(out, Token{Text: code[plainStart:i]})
		}
	}
	emit := func(i, j int, class string) int {
		flush(i)
		out = append(out, Token{Class: class, Text: code[i:j]})
		plainStart = j
		return j
	}
	for i := 0; i < len(code); {
		c := code[i]
		rest := code[i:]
		switch {
		case l.lineComment != "" && strings.HasPrefix(rest, l.lineComment) && (!l.shellish || wordStart(code, i)):
			i = emit(i, i+lineEnd(rest), "com")
		case l.blockComment && strings.HasPrefix(rest, "/*"):
			end := strings.Index(rest[2:], "*/")
			if end < 0 {
				i = emit(i, len(code), "com")
			} else {
				i = emit(i, i+2+end+2, "com")
			}
		case strings.IndexByte(l.quotes, c) >= 0:
			i = emit(i, i+stringEnd(rest, l), "str")
		case l.shellish && c == '$' && i+1 < len(code):
			i = emit(i, i+varEnd(rest), "var")
		case isDigit(c) && (i == 0 || !isWord(code[i-1])):
			j := i + 1
			for j < len(code) && (isWord(code[j]) || code[j] == '.') {
				j++
			}
			i = emit(i, j, "num")
		case isWord(c) && (i == 0 || !isWord(code[i-1])):
			j := i + 1
			for j < len(code) && (isWord(code[j]) || (l.shellish && code[j] == '-')) {
				j++
			}
			w := code[i:j]
			if l.stringPrefix != "" && j < len(code) && strings.IndexByte(l.quotes, code[j]) >= 0 && len(w) <= 2 && strings.Trim(w, l.stringPrefix) == "" {
				i = emit(i, j+stringEnd(code[j:], l), "str")
				continue
			}
			switch {
			case l.keywords[w]:
				i = emit(i, j, "kw")
			case l.builtins[w]:
				i = emit(i, j, "bi")
			default:
				i = j
			}
		default:
			_, n := utf8.DecodeRuneInString(rest)
			i += n
		}
	}
	flush(len(code))
	return out
}

// lineEnd is the length of s up to, not including, its first newline.
func lineEnd(s string) int {
	if n := strings.IndexByte(s, '\n'); n >= 0 {
		return n
	}
	return len(s)
}

// stringEnd is the length of the string literal at the start of s,
// closing quote included; an unclosed literal ends at the end of its line
// (or of the code, for literals that may span lines).
func stringEnd(s string, l *lang) int {
	q := s[:1]
	multi := l.shellish || q == "`"
	if l.triple && len(s) >= 3 && s[1] == s[0] && s[2] == s[0] {
		q, multi = s[:3], true
	}
	escapes := !(l.shellish && q == "'")
	for i := len(q); i < len(s); i++ {
		switch {
		case s[i] == '\\' && escapes:
			i++
		case strings.HasPrefix(s[i:], q):
			return i + len(q)
		case s[i] == '\n' && !multi:
			return i
		}
	}
	return len(s)
}

// varEnd is the length of the shell expansion at the start of s ("$x",
// "${x}", "$1", "$?").
func varEnd(s string) int {
	if s[1] == '{' {
		if n := strings.IndexByte(s, '}'); n > 0 && !strings.Contains(s[:n], "\n") {
			return n + 1
		}
		return 2
	}
	j := 1
	for j < len(s) && isWord(s[j]) {
		j++
	}
	if j == 1 && strings.IndexByte("?$!#@*-0123456789", s[1]) >= 0 {
		j = 2
	}
	return j
}

// wordStart reports whether a shell word may start at i: '#' in the middle
// of a word ("a#b") is not a comment.
func wordStart(code string, i int) bool {
	return i == 0 || strings.IndexByte(" \t\n;|&()", code[i-1]) >= 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isWord(c byte) bool {
	return c == '_' || isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z')
}
