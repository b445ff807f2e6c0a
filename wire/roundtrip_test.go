package wire

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// encodeAsAPI encodes v as the API's writeJSON does.
func encodeAsAPI(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// decodeAsClient decodes b into out as the Go client's decodeBounded
// does.
func decodeAsClient(t *testing.T, b []byte, out any) {
	t.Helper()
	if err := json.NewDecoder(io.LimitReader(bytes.NewReader(b), 64<<20)).Decode(out); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// fill sets every exported field of the value v points to, recursively,
// to a value that is not its zero, except the fields that are not sent
// (json:"-"); n makes the values of one call differ from another's.
func fill(v reflect.Value, n int) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.String:
		v.SetString("s" + strings.Repeat("x", n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(40 + n))
	case reflect.Uint32:
		v.SetUint(uint64(0o640 + n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, n)
		fill(e, n+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(`{"k":[1,"two"]}`))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		fill(s.Index(0), n)
		fill(s.Index(1), n+1)
		v.Set(s)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 7, 4, 5, 6, 7000+n, time.UTC)))
			return
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.IsExported() && f.Tag.Get("json") != "-" {
				fill(v.Field(i), n+i)
			}
		}
	}
}

// filled is a value of T with every field sent set.
func filled[T any]() T {
	var v T
	fill(reflect.ValueOf(&v).Elem(), 0)
	return v
}

// roundTrip is one wire type's check: a filled value, encoded as the API
// does and decoded as the client does, is what was sent.
func roundTrip[T any](sent T) func(t *testing.T) {
	return func(t *testing.T) {
		b := encodeAsAPI(t, sent)
		var got T
		decodeAsClient(t, b, &got)
		clearDocs(reflect.ValueOf(&got).Elem())
		if !reflect.DeepEqual(got, sent) {
			t.Errorf("got %+v\nwant %+v\n(sent %s)", got, sent, b)
		}
		if bytes.Contains(b, []byte(`""`)) || bytes.Contains(b, []byte(": 0,")) || bytes.Contains(b, []byte("false")) || bytes.Contains(b, []byte("null")) {
			t.Errorf("a field was not filled, so its trip was not checked: %s", b)
		}
	}
}

// clearDocs forgets the documents that decoded Results keep, which a
// Result made in code does not have, and compacts raw JSON, which the
// API's encoder indents.
func clearDocs(v reflect.Value) {
	if v.Type() == reflect.TypeFor[json.RawMessage]() {
		var b bytes.Buffer
		if json.Compact(&b, v.Bytes()) == nil {
			v.SetBytes(b.Bytes())
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			clearDocs(v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			clearDocs(v.Index(i))
		}
	case reflect.Struct:
		if r, ok := v.Addr().Interface().(*Result); ok {
			r.doc = nil
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				clearDocs(v.Field(i))
			}
		}
	}
}

// TestRoundTrip round-trips every wire type: the API encodes it, the Go
// client decodes it (MCP and the console read the same types), and what
// arrives is what was sent, every field of it. A Result's "error" is a
// sentence or a cell's exception, each checked.
func TestRoundTrip(t *testing.T) {
	withSentence := filled[Result]()
	withSentence.Error = "the sandbox did not launch"
	withRaised := filled[Result]()
	withRaised.Raised = &CellError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "line 1"}
	execution := filled[Execution]()
	execution.Result = &withRaised
	tests := map[string]func(*testing.T){
		"ExecutionRequest":       roundTrip(filled[ExecutionRequest]()),
		"Execution":              roundTrip(execution),
		"Result with a sentence": roundTrip(withSentence),
		"Result of a cell":       roundTrip(withRaised),
		"Run":                    roundTrip(filled[Run]()),
		"ApprovalCard":           roundTrip(filled[ApprovalCard]()),
		"Approval":               roundTrip(filled[Approval]()),
		"DecisionRequest":        roundTrip(filled[DecisionRequest]()),
		"Decision":               roundTrip(Decision{Approval: filled[Approval](), Execution: execution}),
		"Started":                roundTrip(filled[Started]()),
		"Output":                 roundTrip(filled[Output]()),
		"SessionRequest":         roundTrip(filled[SessionRequest]()),
		"Session":                roundTrip(filled[Session]()),
		"CellRequest":            roundTrip(filled[CellRequest]()),
		"Cell":                   roundTrip(filled[Cell]()),
		"CellEnd":                roundTrip(filled[CellEnd]()),
		"CellOutput":             roundTrip(filled[CellOutput]()),
		"CellError":              roundTrip(filled[CellError]()),
		"FileInfo":               roundTrip(filled[FileInfo]()),
		"FileEntry":              roundTrip(filled[FileEntry]()),
		"FileList":               roundTrip(filled[FileList]()),
		"Interrupted":            roundTrip(filled[Interrupted]()),
		"AuditEvent":             roundTrip(filled[AuditEvent]()),
		"ToolCall":               roundTrip(filled[ToolCall]()),
		"Workspace":              roundTrip(filled[Workspace]()),
		"Credits":                roundTrip(filled[Credits]()),
		"WorkspaceSessions":      roundTrip(filled[WorkspaceSessions]()),
		"Policy":                 roundTrip(filled[Policy]()),
		"Tool":                   roundTrip(filled[Tool]()),
		"Health":                 roundTrip(filled[Health]()),
		"Page":                   roundTrip(Page[Execution]{Items: []Execution{execution}, Next: "cursor"}),
		"ErrorBody":              roundTrip(filled[ErrorBody]()),
		"ErrorDetail":            roundTrip(filled[ErrorDetail]()),
		"SnapshotRequest":        roundTrip(filled[SnapshotRequest]()),
		"Snapshot":               roundTrip(filled[Snapshot]()),
		"SnapshotList":           roundTrip(filled[SnapshotList]()),
		"ForkRequest":            roundTrip(filled[ForkRequest]()),
		"Fork":                   roundTrip(filled[Fork]()),
	}
	for name, test := range tests {
		t.Run(name, test)
	}
}

// TestRoundTripSeesALostField checks that the round trip notices a field
// the client would not read back.
func TestRoundTripSeesALostField(t *testing.T) {
	type lossy struct {
		Kept int    `json:"kept"`
		Lost string `json:"-"`
	}
	sent := lossy{Kept: 1, Lost: "x"}
	var got lossy
	decodeAsClient(t, encodeAsAPI(t, sent), &got)
	if reflect.DeepEqual(got, sent) {
		t.Errorf("a field that is not sent came back: got %+v", got)
	}
}

// TestResultKeepsItsDocument checks that a Result read from the server's
// document encodes as that document, whatever fields it has that Result
// does not name.
func TestResultKeepsItsDocument(t *testing.T) {
	doc := []byte(`{"error":"the sandbox did not launch","later_field":1}`)
	r, err := ResultOf(doc)
	if err != nil || r.Error != "the sandbox did not launch" {
		t.Fatalf("ResultOf: got %+v, %v", r, err)
	}
	if got := r.String(); got != string(doc) {
		t.Errorf("encoded: got %s, want %s", got, doc)
	}
	if r, err := ResultOf(nil); r != nil || err != nil {
		t.Errorf("ResultOf(nil): got %+v, %v; want none", r, err)
	}
}
