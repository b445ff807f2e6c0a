package strictyaml

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type inner struct {
	Max  int      `yaml:"max_length"`
	Tags []string `yaml:"tags"`
}

type base struct {
	Name string `yaml:"name"`
}

type doc struct {
	*base   `yaml:",inline"`
	Count   int            `yaml:"count"`
	Ratio   float64        `yaml:"ratio"`
	On      bool           `yaml:"on"`
	TTL     time.Duration  `yaml:"ttl"`
	Inner   inner          `yaml:"inner"`
	Items   []inner        `yaml:"items"`
	Opt     *inner         `yaml:"opt"`
	Labels  map[string]int `yaml:"labels"`
	Special special        `yaml:"special"`
	Hidden  string         `yaml:"-"`
}

// special decodes itself: "none" or a list.
type special struct{ list []string }

func (s *special) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "none" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return errors.New("want none or a list of names")
	}
	return n.Decode(&s.list)
}

func decode(t *testing.T, src string) (doc, []Problem) {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(src), &n); err != nil {
		t.Fatalf("syntax: %v", err)
	}
	d := doc{base: &base{}}
	return d, Decode(&n, &d)
}

func TestDecode(t *testing.T) {
	d, ps := decode(t, `
name: x
count: 3
ratio: 0.5
on: true
ttl: 2m
inner: {max_length: 64, tags: [a, b]}
items:
  - {max_length: 1}
opt: {tags: [c]}
labels: {a: 1}
special: [p, q]
`)
	if len(ps) != 0 {
		t.Fatalf("got problems %v, want none", ps)
	}
	if d.Name != "x" || d.Count != 3 || d.Ratio != 0.5 || !d.On || d.TTL != 2*time.Minute || d.Inner.Max != 64 ||
		strings.Join(d.Inner.Tags, ",") != "a,b" || len(d.Items) != 1 || d.Items[0].Max != 1 || d.Opt == nil ||
		d.Opt.Tags[0] != "c" || d.Labels["a"] != 1 || strings.Join(d.Special.list, ",") != "p,q" {
		t.Errorf("got %+v", d)
	}
	// Null and missing keys keep what was there.
	d = doc{base: &base{Name: "kept"}, Count: 7}
	var n yaml.Node
	_ = yaml.Unmarshal([]byte("name:\ncount: ~\n"), &n)
	if ps := Decode(&n, &d); len(ps) != 0 || d.Name != "kept" || d.Count != 7 {
		t.Errorf("null values: got %+v, %v; want the values kept", d, ps)
	}
}

// TestDecodeProblems has one case per kind of mistake: each problem names
// the key path and the form the key takes, and no Go type.
func TestDecodeProblems(t *testing.T) {
	tests := []struct {
		name, src string
		want      string
		kind      Kind
		line      int
	}{
		{"list for a string", "name: [a, b]", `name: want a string, got a list`, BadValue, 1},
		{"mapping for a string", "name: {a: b}", `name: want a string, got a mapping`, BadValue, 1},
		{"word for an integer", "count: lots", `count: want an integer, got "lots"`, BadValue, 1},
		{"fraction for an integer", "count: 1.5", `count: want an integer, got "1.5"`, BadValue, 1},
		{"word for a number", "ratio: half", `ratio: want a number, got "half"`, BadValue, 1},
		{"word for a boolean", "on: maybe", `on: want true or false, got "maybe"`, BadValue, 1},
		{"list for a boolean", "on: [true]", `on: want true or false, got a list`, BadValue, 1},
		{"duration without unit", "ttl: 10", `ttl: invalid duration "10": a number needs a unit`, BadValue, 1},
		{"duration that is a word", "ttl: soon", `ttl: invalid duration "soon"`, BadValue, 1},
		{"list for a duration", "ttl: [1s]", `ttl: want a duration such as 30s or 2m, got a list`, BadValue, 1},
		{"scalar for a mapping", "inner: yes", `inner: want a mapping (keys: max_length, tags), got "yes"`, BadValue, 1},
		{"scalar for a list", "inner:\n  tags: a", `inner.tags: want a list of strings, got "a"`, BadValue, 2},
		{"mapping for a list", "items: {a: 1}", `items: want a list of mappings, got a mapping`, BadValue, 1},
		{"bad list element", "items:\n  - {max_length: 1}\n  - {max_length: x}", `items[1].max_length: want an integer, got "x"`, BadValue, 3},
		{"scalar list element", "items: [3]", `items[0]: want a mapping (keys: max_length, tags), got "3"`, BadValue, 1},
		{"pointer target", "opt: 3", `opt: want a mapping (keys: max_length, tags), got "3"`, BadValue, 1},
		{"map value", "labels: {a: x}", `labels.a: want an integer, got "x"`, BadValue, 1},
		{"self-decoding type", "special: {a: 1}", `special: want none or a list of names`, BadValue, 1},
		{"unknown key", "nmae: x", `unknown key "nmae" (known: name, count, ratio, on, ttl, inner, items, opt, labels, special)`, UnknownKey, 1},
		{"unknown nested key", "items:\n  - {max: 1}", `items[0]: unknown key "max" (known: max_length, tags)`, UnknownKey, 2},
		{"hidden key", "hidden: x", `unknown key "hidden"`, UnknownKey, 1},
		{"repeated key", "count: 1\ncount: 2", `key "count" is given twice`, RepeatedKey, 2},
		{"document not a mapping", "- a", `want a mapping (keys: name, count, ratio, on, ttl, inner, items, opt, ...), got a list`, BadValue, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ps := decode(t, tt.src)
			if len(ps) != 1 {
				t.Fatalf("got %d problems %v, want 1", len(ps), ps)
			}
			p := ps[0]
			if !strings.Contains(p.Error(), tt.want) || p.Kind != tt.kind || p.Line != tt.line {
				t.Errorf("got %q (kind %d, line %d), want %q (kind %d, line %d)", p.Error(), p.Kind, p.Line, tt.want, tt.kind, tt.line)
			}
			for _, goWord := range []string{"!!", "unmarshal", "struct", "int64", "float64", "[]", "strictyaml.", "time.Duration"} {
				if strings.Contains(p.Error(), goWord) {
					t.Errorf("%q names a Go type (%q)", p.Error(), goWord)
				}
			}
		})
	}
}

func TestDecodeReportsEveryProblem(t *testing.T) {
	_, ps := decode(t, "count: x\nratio: y\nnope: 1\n")
	if len(ps) != 3 {
		t.Errorf("got %v, want three problems", ps)
	}
}

func TestClosestKey(t *testing.T) {
	known := []string{"data_dir", "state_dir", "driver", "listen", "db", "max_concurrent", "max_queue", "approval_ttl", "credits_per_invocation", "egress", "egress_range", "egress_prefix", "tools"}
	if got := keyHint("lisen", known); got != "did you mean listen?" {
		t.Errorf("got %q, want a suggestion of listen", got)
	}
	if got := keyHint("zzzzzz", known); got != "" {
		t.Errorf("got %q, want no suggestion", got)
	}
}
