// Package strictyaml decodes a YAML document into Go structs strictly and
// says what is wrong in the file's words: each problem names the key path
// (broker.operations[0].params[1].max_length) and the form the key takes
// (an integer, a duration such as 30s, a list of strings), never a Go type.
// Unknown and repeated keys are problems too, and every problem of a
// document is reported, not only the first.
//
//	var doc yaml.Node
//	if err := yaml.Unmarshal(data, &doc); err != nil { ... }  // syntax
//	for _, p := range strictyaml.Decode(&doc, &cfg) {
//		fmt.Printf("line %d: %v\n", p.Line, p)
//	}
//
// Struct fields are named by their yaml tags as go.yaml.in/yaml/v3 names
// them (",inline" and "-" included). A time.Duration reads with
// sandbox.ParseDuration. A type that implements yaml.Unmarshaler decodes
// itself; an error it returns is a problem at its key, and its message
// should name the form the key takes. Such a type may also implement Former
// to name that form where a list of it is described.
package strictyaml

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/sandbox"
)

// Kind classifies a Problem.
type Kind int

const (
	// BadValue is a value of the wrong form: a list where a string
	// belongs, a word where a number belongs, a duration without a unit.
	BadValue Kind = iota
	// UnknownKey is a key the mapping does not have.
	UnknownKey
	// RepeatedKey is a key given twice in one mapping.
	RepeatedKey
)

// Problem is one mistake in a document.
type Problem struct {
	// Line is the line of the value (or, for key problems, of the key),
	// counted from 1.
	Line int
	// Path is the key path of the value at fault, or for UnknownKey and
	// RepeatedKey of the mapping holding the key; "" is the document.
	Path string
	// Key is the unknown or repeated key; empty for BadValue.
	Key  string
	Kind Kind
	// Hint, for an unknown key, names the known keys or the one meant
	// ("known: a, b", "did you mean listen?"); Message ends with it.
	Hint string
	// Message says what is wrong and what the key takes, without the path.
	Message string
}

// Error is the path and the message: "listen: want a string, got a list".
func (p Problem) Error() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Former is implemented by types that decode themselves (yaml.Unmarshaler)
// to name the form they take, e.g. "none or a list of broker operation names".
type Former interface {
	YAMLForm() string
}

// Decode decodes n (a document or any node) into the value v points to,
// strictly, and returns the problems in document order. Keys the document
// leaves out, and keys whose value is null, keep what v holds.
func Decode(n *yaml.Node, v any) []Problem {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("strictyaml: Decode needs a non-nil pointer")
	}
	var d decoder
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	if n.Kind == 0 {
		return nil // an empty document
	}
	d.decode(n, rv.Elem(), "")
	return d.problems
}

type decoder struct{ problems []Problem }

func (d *decoder) bad(n *yaml.Node, path, format string, a ...any) {
	d.problems = append(d.problems, Problem{Line: n.Line, Path: path, Kind: BadValue, Message: fmt.Sprintf(format, a...)})
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	formerType      = reflect.TypeFor[Former]()
)

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if v.CanAddr() && v.Addr().Type().Implements(unmarshalerType) {
		if err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			d.bad(n, path, "%v", err)
		}
		return
	}
	t := v.Type()
	if t == durationType {
		if n.Kind != yaml.ScalarNode {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		dur, err := sandbox.ParseDuration(n.Value)
		if err != nil {
			d.bad(n, path, "%v", err)
			return
		}
		v.SetInt(int64(dur))
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.mapping(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			d.decode(e, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(t))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := reflect.New(t.Key()).Elem()
			d.decode(n.Content[i], k, path)
			e := reflect.New(t.Elem()).Elem()
			d.decode(n.Content[i+1], e, join(path, n.Content[i].Value))
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Interface:
		var x any
		if err := n.Decode(&x); err != nil {
			d.bad(n, path, "want a value, got %s", got(n))
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	default:
		// Booleans and numbers: yaml's own scalar rules (0x10, 1_000,
		// true/false), with our words for a mistake.
		if n.Kind != yaml.ScalarNode {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		// yaml would truncate 1.5 into an integer; a number must be one.
		tag := n.ShortTag()
		isInt := t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64
		isFloat := t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64
		p := reflect.New(t)
		if (isInt && tag != "!!int") || (isFloat && tag != "!!int" && tag != "!!float") {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		if err := n.Decode(p.Interface()); err != nil {
			d.bad(n, path, "want %s, got %s", Form(t), got(n))
			return
		}
		v.Set(p.Elem())
	}
}

// mapping decodes a mapping node into the struct v.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.bad(n, path, "want %s, got %s", Form(v.Type()), got(n))
		return
	}
	fields := fieldsOf(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		key := kn.Value
		if kn.Kind != yaml.ScalarNode {
			d.bad(kn, path, "a key must be a plain word, got %s", got(kn))
			continue
		}
		if seen[key] {
			d.problems = append(d.problems, Problem{Line: kn.Line, Path: path, Key: key, Kind: RepeatedKey,
				Message: fmt.Sprintf("key %q is given twice; keep one", key)})
			continue
		}
		seen[key] = true
		f, ok := fields[key]
		if !ok {
			hint := keyHint(key, keysOf(v.Type()))
			msg := fmt.Sprintf("unknown key %q", key)
			if hint != "" {
				msg += " (" + hint + ")"
			}
			d.problems = append(d.problems, Problem{Line: kn.Line, Path: path, Key: key, Kind: UnknownKey, Hint: hint, Message: msg})
			continue
		}
		d.decode(vn, fieldByIndex(v, f), join(path, key))
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// got names what a node holds, for "want X, got Y".
func got(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// keyHint lists the known keys of a small mapping, or names the key of a
// large one that is closest to key.
func keyHint(key string, known []string) string {
	if len(known) <= 12 {
		return "known: " + strings.Join(known, ", ")
	}
	if s := closest(key, known); s != "" {
		return "did you mean " + s + "?"
	}
	return ""
}

// closest returns the known key within two edits of key, or else the
// longest known key that key starts with or that starts with key
// (runc_path: runc), or "".
func closest(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if dist := editDistance(key, k); dist < bestD {
			best, bestD = k, dist
		}
	}
	if best != "" {
		return best
	}
	for _, k := range known {
		if len(k) >= 3 && len(key) >= 3 && len(k) > len(best) && (strings.HasPrefix(key, k) || strings.HasPrefix(k, key)) {
			best = k
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// fieldsOf maps the YAML keys of struct type t to field index paths,
// descending into ",inline" fields.
func fieldsOf(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	var walk func(t reflect.Type, prefix []int)
	walk = func(t reflect.Type, prefix []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || (!f.IsExported() && !f.Anonymous) {
				continue
			}
			idx := append(slices.Clone(prefix), i)
			if slices.Contains(strings.Split(opts, ","), "inline") {
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				walk(ft, idx)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if _, dup := out[name]; !dup {
				out[name] = idx
			}
		}
	}
	walk(t, nil)
	return out
}

// Keys returns the YAML keys of struct type t in field order, descending
// into ",inline" fields.
func Keys(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return keysOf(t)
}

func keysOf(t reflect.Type) []string {
	fields := fieldsOf(t)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return slices.Compare(fields[a], fields[b]) })
	return keys
}

// fieldByIndex is reflect.Value.FieldByIndex, allocating nil embedded
// pointers on the way.
func fieldByIndex(v reflect.Value, idx []int) reflect.Value {
	for i, x := range idx {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v
}

// Form names the form a value of type t takes in a document, as problems
// state it: "an integer", "a list of strings", "a mapping (keys: a, b)".
func Form(t reflect.Type) string {
	if f, ok := former(t); ok {
		return f
	}
	switch {
	case t == durationType:
		return "a duration such as 30s or 2m"
	case t.Kind() == reflect.Pointer:
		return Form(t.Elem())
	case t.Kind() == reflect.Slice:
		return "a list of " + plural(t.Elem())
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer of at least 0"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct:
		keys := keysOf(t)
		if len(keys) > 8 {
			keys = append(keys[:8], "...")
		}
		return "a mapping (keys: " + strings.Join(keys, ", ") + ")"
	}
	return "a mapping"
}

func plural(t reflect.Type) string {
	if f, ok := former(t); ok {
		return "items that are each " + f
	}
	if t == durationType {
		return "durations"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return plural(t.Elem())
	case reflect.String:
		return "strings"
	case reflect.Bool:
		return "true or false values"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integers"
	case reflect.Float32, reflect.Float64:
		return "numbers"
	case reflect.Slice:
		return "lists"
	case reflect.Struct, reflect.Map:
		return "mappings"
	}
	return "values"
}

func former(t reflect.Type) (string, bool) {
	if t.Implements(formerType) {
		return reflect.Zero(t).Interface().(Former).YAMLForm(), true
	}
	if reflect.PointerTo(t).Implements(formerType) {
		return reflect.New(t).Interface().(Former).YAMLForm(), true
	}
	return "", false
}
