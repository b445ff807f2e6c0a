package api_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/wire"
)

// schemaOf pairs openapi.json's schemas with the wire types they describe.
var schemaOf = map[string]reflect.Type{
	"Health":               reflect.TypeFor[wire.Health](),
	"Error":                reflect.TypeFor[wire.ErrorBody](),
	"InvokeRequest":        reflect.TypeFor[wire.ExecutionRequest](),
	"Result":               reflect.TypeFor[wire.Result](),
	"ApprovalCard":         reflect.TypeFor[wire.ApprovalCard](),
	"Execution":            reflect.TypeFor[wire.Execution](),
	"Approval":             reflect.TypeFor[wire.Approval](),
	"ApprovalPage":         reflect.TypeFor[wire.Page[wire.Approval]](),
	"DecisionRequest":      reflect.TypeFor[wire.DecisionRequest](),
	"DecisionResult":       reflect.TypeFor[wire.Decision](),
	"Event":                reflect.TypeFor[wire.AuditEvent](),
	"EventPage":            reflect.TypeFor[wire.Page[wire.AuditEvent]](),
	"ToolCall":             reflect.TypeFor[wire.ToolCall](),
	"ToolCallPage":         reflect.TypeFor[wire.Page[wire.ToolCall]](),
	"Workspace":            reflect.TypeFor[wire.Workspace](),
	"Tool":                 reflect.TypeFor[wire.Tool](),
	"ToolPage":             reflect.TypeFor[wire.Page[wire.Tool]](),
	"CreateSessionRequest": reflect.TypeFor[wire.SessionRequest](),
	"Session":              reflect.TypeFor[wire.Session](),
	"SessionPage":          reflect.TypeFor[wire.Page[wire.Session]](),
	"CellRequest":          reflect.TypeFor[wire.CellRequest](),
	"Cell":                 reflect.TypeFor[wire.Cell](),
	"CellOutput":           reflect.TypeFor[wire.CellOutput](),
	"CellError":            reflect.TypeFor[wire.CellError](),
	"FileInfo":             reflect.TypeFor[wire.FileInfo](),
	"FileList":             reflect.TypeFor[wire.FileList](),
	"Started":              reflect.TypeFor[wire.Started](),
	"Output":               reflect.TypeFor[wire.Output](),
	"Interrupted":          reflect.TypeFor[wire.Interrupted](),
	"Template":             reflect.TypeFor[wire.Template](),
	"TemplatePage":         reflect.TypeFor[wire.Page[wire.Template]](),
	"TemplateBuild":        reflect.TypeFor[wire.TemplateBuild](),
	"SBOM":                 reflect.TypeFor[wire.SBOM](),
	"TemplateBuildJob":     reflect.TypeFor[wire.TemplateBuildJob](),
	"TemplateProgress":     reflect.TypeFor[wire.TemplateProgress](),
	"BuildRequest":         reflect.TypeFor[wire.BuildRequest](),
	"SnapshotRequest":      reflect.TypeFor[wire.SnapshotRequest](),
	"Snapshot":             reflect.TypeFor[wire.Snapshot](),
	"SnapshotList":         reflect.TypeFor[wire.SnapshotList](),
	"ForkRequest":          reflect.TypeFor[wire.ForkRequest](),
	"Fork":                 reflect.TypeFor[wire.Fork](),
}

// codecFields are the JSON fields a type's own codec writes besides its
// tagged fields: a Result's "error" is a sentence or a cell's exception.
var codecFields = map[reflect.Type][]string{
	reflect.TypeFor[wire.Result](): {"error"},
}

// TestOpenAPIDescribesTheWireTypes checks openapi.json against package
// wire: each schema names exactly the JSON fields of its wire type, the
// objects nested in it too, every schema has its type, and every struct
// type of package wire is described by one.
func TestOpenAPIDescribesTheWireTypes(t *testing.T) {
	raw, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	for name := range schemas {
		if _, ok := schemaOf[name]; !ok {
			t.Errorf("schema %s describes no wire type (add it to schemaOf)", name)
		}
	}
	seen := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(schemaOf)) {
		s, ok := schemas[name]
		if !ok {
			t.Errorf("openapi.json has no schema %s", name)
			continue
		}
		compare(t, name, s, schemaOf[name], schemas, seen)
	}
	for _, typ := range wireStructs(t) {
		if !seen[typ] {
			t.Errorf("wire.%s is in no schema of openapi.json", typ)
		}
	}
	if len(seen) < 20 {
		t.Fatalf("compared %d wire types, want them all: %v", len(seen), seen)
	}
}

// schema is what the check reads of a JSON schema.
type schema struct {
	Ref        string            `json:"$ref"`
	Properties map[string]schema `json:"properties"`
	Items      *schema           `json:"items"`
	OneOf      []schema          `json:"oneOf"`
}

// resolve follows s's $ref, its array's items and its oneOf to the
// object schema it stands for; nil when it is none.
func resolve(s schema, schemas map[string]schema) *schema {
	switch {
	case s.Ref != "":
		r, ok := schemas[strings.TrimPrefix(s.Ref, "#/components/schemas/")]
		if !ok {
			return nil
		}
		return resolve(r, schemas)
	case s.Items != nil:
		return resolve(*s.Items, schemas)
	case s.Properties != nil:
		return &s
	}
	for _, o := range s.OneOf {
		if r := resolve(o, schemas); r != nil {
			return r
		}
	}
	return nil
}

// compare checks that s names exactly the JSON fields of typ, and
// recurses into the fields that are objects.
func compare(t *testing.T, path string, s schema, typ reflect.Type, schemas map[string]schema, seen map[string]bool) {
	t.Helper()
	obj := resolve(s, schemas)
	if obj == nil {
		t.Errorf("%s: the schema describes no object's properties, want wire.%s's", path, typ.Name())
		return
	}
	if typ.PkgPath() == reflect.TypeFor[wire.Result]().PkgPath() {
		seen[strings.SplitN(typ.Name(), "[", 2)[0]] = true
	}
	fields := jsonFields(typ, seen)
	for _, name := range codecFields[typ] {
		fields[name] = nil
	}
	for name, ft := range fields {
		ps, ok := obj.Properties[name]
		if !ok {
			t.Errorf("%s: wire.%s sends %q, which the schema does not name", path, typ.Name(), name)
			continue
		}
		if ft != nil {
			compare(t, path+"."+name, ps, ft, schemas, seen)
		}
	}
	for name := range obj.Properties {
		if _, ok := fields[name]; !ok {
			t.Errorf("%s: the schema names %q, which wire.%s does not have", path, name, typ.Name())
		}
	}
}

// jsonFields are typ's JSON field names, each with the struct type to
// compare its schema with (nil for a field that is no object of ours).
func jsonFields(typ reflect.Type, seen map[string]bool) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			seen[f.Type.Name()] = true
			maps.Copy(out, jsonFields(f.Type, seen))
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() != reflect.Struct || ft == reflect.TypeFor[time.Time]() {
			ft = nil
		}
		out[name] = ft
	}
	return out
}

// wireStructs are the names of package wire's struct types.
func wireStructs(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../wire/*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, sp := range g.Specs {
				ts := sp.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() {
					out = append(out, ts.Name.Name)
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("found no struct types in ../wire")
	}
	return out
}
