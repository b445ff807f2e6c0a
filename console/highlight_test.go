package console

import (
	"strings"
	"testing"
)

// join is the code the lines of c hold.
func join(c Code) string {
	var b strings.Builder
	for i, l := range c.Lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		for _, t := range l {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// classes renders c's tokens as "class:text" pairs, plain text bare.
func classes(c Code) []string {
	var out []string
	for _, l := range c.Lines {
		for _, t := range l {
			if t.Class == "" {
				continue
			}
			out = append(out, t.Class+":"+t.Text)
		}
	}
	return out
}

func TestHighlight(t *testing.T) {
	for _, tc := range []struct {
		name, runtime, code string
		want                []string // the classified tokens, in order
		lines, hidden       int
	}{
		{"python", "python", "import os  # list\nprint(f'{os.getcwd()}', 0x1f)\n",
			[]string{"kw:import", "com:# list", "bi:print", "str:f'{os.getcwd()}'", "num:0x1f"}, 3, 0},
		{"python triple string spans lines", "python", "s = \"\"\"a\n# not a comment\n\"\"\"",
			[]string{"str:\"\"\"a", "str:# not a comment", "str:\"\"\""}, 3, 0},
		{"python unclosed string ends at its line", "python", "x = 'abc\ny = 1",
			[]string{"str:'abc", "num:1"}, 2, 0},
		{"node", "node", "const x = `a${b}` /* c */ // d\nconsole.log(\"e\\\"\")",
			[]string{"kw:const", "str:`a${b}`", "com:/* c */", "com:// d", "bi:console", "str:\"e\\\"\""}, 2, 0},
		{"shell", "shell", "echo \"$HOME\" a#b # c\nfor f in ${X}; do rm -rf $1; done",
			[]string{"bi:echo", "str:\"$HOME\"", "com:# c", "kw:for", "kw:in", "var:${X}", "kw:do", "bi:rm", "var:$1", "kw:done"}, 2, 0},
		{"bidi controls are named", "python", "s = 'user\u202e \u2066// admin\u2069'",
			[]string{"str:'user", "ctl:\u202e", "str: ", "ctl:\u2066", "str:// admin", "ctl:\u2069", "str:'"}, 1, 3},
		{"zero-width and escape", "shell", "e\u200bcho \x1b[2J",
			[]string{"ctl:\u200b", "ctl:\x1b", "num:2J"}, 1, 2},
		{"unknown runtime is plain", "cobol", "DISPLAY 'X'.", nil, 1, 0},
		{"empty", "python", "", nil, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Highlight(tc.runtime, tc.code)
			if got := join(c); got != tc.code {
				t.Errorf("joined tokens: got %q, want the code %q", got, tc.code)
			}
			if got := classes(c); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("tokens:\n got %q\nwant %q", got, tc.want)
			}
			if len(c.Lines) != tc.lines || c.Hidden != tc.hidden {
				t.Errorf("got %d lines, %d hidden; want %d, %d", len(c.Lines), c.Hidden, tc.lines, tc.hidden)
			}
		})
	}
}

func TestTokenLabel(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"\u202e", "[RLO]"}, {"\u2067", "[RLI]"}, {"\x00", "[NUL]"}, {"\u0007", "[U+0007]"}, {"\xff", "[U+FFFD]"},
	} {
		if got := (Token{Class: "ctl", Text: tc.text}).Label(); got != tc.want {
			t.Errorf("Label(%q): got %s, want %s", tc.text, got, tc.want)
		}
	}
}

// FuzzHighlight checks that highlighting keeps every byte of any code, and
// that every token of the class ctl is one hidden character and every
// hidden character is in one.
func FuzzHighlight(f *testing.F) {
	for _, s := range []string{"print('x')\n", "a = \"\"\"\n\"\"\"", "echo ${", "/* x", "'\\", "\u202e\xff\r\n", "f'"} {
		for _, rt := range []string{"python", "node", "shell"} {
			f.Add(rt, s)
		}
	}
	f.Fuzz(func(t *testing.T, runtime, code string) {
		c := Highlight(runtime, code)
		if got := join(c); got != code {
			t.Fatalf("joined tokens: got %q, want %q", got, code)
		}
		for _, l := range c.Lines {
			for _, tok := range l {
				if tok.Text == "" {
					t.Fatalf("empty token in %q", code)
				}
				for _, r := range tok.Text {
					if hidden(r) != tok.Ctl() || (tok.Ctl() && len([]rune(tok.Text)) != 1) {
						t.Fatalf("token %+v of %q: hidden characters must be ctl tokens of their own", tok, code)
					}
					if r == '\n' {
						t.Fatalf("token %+v holds a newline", tok)
					}
				}
			}
		}
	})
}
