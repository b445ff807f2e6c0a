package client

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		names []string
		datas []string
		end   error
	}{
		{"events and keep-alives", "event: started\ndata: {\"driver\":\"runc\"}\n\n: keep-alive\n\nevent: stdout\ndata: {\"data\":\"42\\n\"}\n\n",
			[]string{"started", "stdout"}, []string{`{"driver":"runc"}`, `{"data":"42\n"}`}, io.EOF},
		{"multi-line data and CRLF", "event: x\r\ndata: a\r\ndata: b\r\n\r\n", []string{"x"}, []string{"a\nb"}, io.EOF},
		{"no event name", "data: hi\n\n", []string{"message"}, []string{"hi"}, io.EOF},
		{"cut in the middle of an event", "event: stdout\ndata: {\"da", nil, nil, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &sseReader{r: bufio.NewReaderSize(strings.NewReader(tc.in), 16)}
			for i := range tc.names {
				name, data, err := r.next()
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if name != tc.names[i] || string(data) != tc.datas[i] {
					t.Errorf("event %d: got %q %q, want %q %q", i, name, data, tc.names[i], tc.datas[i])
				}
			}
			if _, _, err := r.next(); !errors.Is(err, tc.end) {
				t.Errorf("end: got %v, want %v", err, tc.end)
			}
		})
	}
}

// An event over MaxAnswer is refused before it is held whole.
func TestSSEReaderBoundsAnEvent(t *testing.T) {
	big := io.MultiReader(strings.NewReader("event: stdout\ndata: "), neverEnding('x'))
	r := &sseReader{r: bufio.NewReader(big)}
	if _, _, err := r.next(); !errdefs.IsTooLarge(err) {
		t.Errorf("got %v, want a too large error", err)
	}
}

func TestDecodeBounded(t *testing.T) {
	var v map[string]any
	if err := decodeBounded(io.MultiReader(strings.NewReader(`{"a":"`), io.LimitReader(neverEnding('x'), MaxAnswer)), &v); !errdefs.IsTooLarge(err) {
		t.Errorf("got %v, want a too large error", err)
	}
	if err := decodeBounded(strings.NewReader(`{"a":1}`), &v); err != nil || v["a"] != 1.0 {
		t.Errorf("got %v, %v; want {a:1}", v, err)
	}
}

func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		check      func(Event) bool
	}{
		{"approval_required", `{"approval_id":"apr_1","execution_id":"ex_1","runtime":"python"}`, func(e Event) bool {
			a, ok := e.(*ApprovalRequired)
			return ok && a.Card.ApprovalID == "apr_1" && a.Card.ExecutionID == "ex_1"
		}},
		{"started", `{"execution_id":"ex_1","driver":"runc"}`, func(e Event) bool { s, ok := e.(*Started); return ok && s.Driver == "runc" }},
		{"stderr", `{"data":"oops"}`, func(e Event) bool { o, ok := e.(*Output); return ok && o.Stream == "stderr" && o.Data == "oops" }},
		{"result", `{"id":"ex_1","status":"succeeded","result":{"status":"succeeded","exit_code":0,"stdout":"42\n"}}`, func(e Event) bool {
			d, ok := e.(*Ended)
			return ok && d.Execution.Status == StatusSucceeded && d.Execution.Result.Stdout == "42\n"
		}},
		{"denied", `{"id":"ex_1","status":"denied"}`, func(e Event) bool { d, ok := e.(*Ended); return ok && d.Execution.Status == StatusDenied }},
		{"error", `{"error":{"code":"internal","message":"reading the outcome failed"}}`, func(e Event) bool { s, ok := e.(*StreamError); return ok && s.Code == "internal" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := ParseEvent(tc.name, []byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(ev) {
				t.Errorf("got %#v, want the event of %s", ev, tc.data)
			}
		})
	}
	if _, err := ParseEvent("surprise", []byte(`{}`)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unknown event: got %v, want an invalid argument error", err)
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
