package audit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const modelImport = "github.com/stockade-sh/stockade/model"

// handBuilt lists where the module's code, tests aside, may build a
// model.NewEvent itself: package audit's NewEvent, and the store's own
// suite, which hands the store events no struct describes (invalid ones,
// and types made up to grow chains).
var handBuilt = []string{"audit", "store/storetest"}

// TestEventsOnlyFromStructs fails where code outside handBuilt builds a
// model.NewEvent by hand (a literal, new, or a variable filled in field by
// field) instead of getting it from audit.NewEvent: such an event's data is
// whatever its call site wrote, not the encoding of its struct.
func TestEventsOnlyFromStructs(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root %s has no go.mod: %v", root, err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			for _, dir := range handBuilt {
				if rel == dir {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		for _, at := range handBuiltEvents(t, path, filepath.Dir(rel) == "model") {
			t.Errorf("%s:%d builds a model.NewEvent by hand; build the event's struct in package audit and use audit.NewEvent", rel, at)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("checked %d files, want the module's (is %s its root?)", files, root)
	}
}

// TestHandBuiltEventsAreFound checks that handBuiltEvents finds every way
// of building one by hand, and nothing else.
func TestHandBuiltEventsAreFound(t *testing.T) {
	src := `package x

import m "github.com/stockade-sh/stockade/model"

func f(es []m.NewEvent, e m.NewEvent) ([]m.NewEvent, *m.NewEvent) {
	_ = m.NewEvent{Type: "a"}              // 6
	_ = []m.NewEvent{{Type: "b"}, e}       // 7
	_ = map[string]m.NewEvent{"k": {}}     // 8
	var v m.NewEvent                       // 9
	v.Type = "c"
	p := new(m.NewEvent)                   // 11
	_ = &m.NewEvent{}                      // 12
	var ok []m.NewEvent
	ok = append(ok, e)
	return append(es, v), p
}
`
	path := filepath.Join(t.TempDir(), "x.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := handBuiltEvents(t, path, false)
	want := []int{6, 7, 8, 9, 11, 12}
	if !slices.Equal(got, want) {
		t.Errorf("lines: got %v, want %v", got, want)
	}
}

// handBuiltEvents returns the lines of the file at path that build a
// model.NewEvent by hand. inModel says the file is package model's, where
// the type is plain NewEvent.
func handBuiltEvents(t *testing.T, path string, inModel bool) []int {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	pkg := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == modelImport {
			pkg = "model"
			if imp.Name != nil {
				pkg = imp.Name.Name
			}
		}
	}
	if pkg == "" && !inModel {
		return nil
	}
	isNewEvent := func(x ast.Expr) bool {
		switch x := x.(type) {
		case *ast.SelectorExpr:
			id, ok := x.X.(*ast.Ident)
			return ok && id.Name == pkg && x.Sel.Name == "NewEvent"
		case *ast.Ident:
			return inModel && x.Name == "NewEvent"
		}
		return false
	}
	var lines []int
	at := func(n ast.Node) { lines = append(lines, fset.Position(n.Pos()).Line) }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			var elem ast.Expr
			switch typ := n.Type.(type) {
			case *ast.ArrayType:
				elem = typ.Elt
			case *ast.MapType:
				elem = typ.Value
			default:
				if isNewEvent(n.Type) {
					at(n)
				}
				return true
			}
			if !isNewEvent(elem) {
				return true
			}
			// A slice or map of events whose elements are literals with
			// their type left out.
			for _, el := range n.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					el = kv.Value
				}
				if lit, ok := el.(*ast.CompositeLit); ok && lit.Type == nil {
					at(n)
					break
				}
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 && isNewEvent(n.Args[0]) {
				at(n)
			}
		case *ast.ValueSpec:
			if n.Type != nil && isNewEvent(n.Type) {
				at(n)
			}
		}
		return true
	})
	return lines
}
