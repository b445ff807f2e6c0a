package vercel

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeLine feeds the decoder of a command's NDJSON lines what a
// provider (or whatever answers in its place) might send: it never
// panics, and what it accepts is within its bounds.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range []string{
		`{"command":{"id":"cmd_1","name":"/bin/sh","args":[],"cwd":"/","sessionId":"s","exitCode":null,"startedAt":1}}`,
		`{"command":{"id":"cmd_1","exitCode":3}}`,
		`{"stream":"stdout","data":"hello\n"}`,
		`{"stream":"stderr","data":"\u0000\ufffd"}`,
		`{"stream":"error","data":{"code":"sandbox_stopped","message":"gone"}}`,
		`{"stream":"stdout","data":1}`, `{"command":{"id":"a/b","exitCode":1}}`, `{"command":{"id":"x","exitCode":999}}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := decodeLine(line)
		if err != nil {
			return
		}
		switch ev.kind {
		case kindStarted, kindExit:
			if checkID("command id", ev.cmdID) != nil {
				t.Errorf("accepted command id %q", ev.cmdID)
			}
			if ev.exitCode < -1 || ev.exitCode > 255 {
				t.Errorf("accepted exit code %d", ev.exitCode)
			}
		case kindStdout, kindStderr:
			if len(ev.data) > len(line) {
				t.Errorf("%d bytes of data from a line of %d", len(ev.data), len(line))
			}
		case kindError:
			if len(ev.errCode) > maxString+3 || len(ev.errMsg) > maxString+3 || !utf8.ValidString(ev.errMsg) {
				t.Errorf("an error of %d and %d bytes", len(ev.errCode), len(ev.errMsg))
			}
		default:
			t.Errorf("accepted a line of no kind: %q", line)
		}
	})
}

// FuzzLineReader checks that the stream's splitter returns each line of
// at most maxLine bytes, and nothing else.
func FuzzLineReader(f *testing.F) {
	f.Add([]byte("a\nb\n\n  \nc"))
	f.Add(bytes.Repeat([]byte("x"), 70<<10))
	f.Fuzz(func(t *testing.T, data []byte) {
		lr := newLineReader(bytes.NewReader(data))
		var got []string
		for range len(data) + 1 {
			line, err := lr.next()
			if err != nil {
				if err != io.EOF && len(data) <= maxLine {
					t.Fatalf("a stream of %d bytes: %v", len(data), err)
				}
				break
			}
			if len(line) > maxLine || len(line) == 0 {
				t.Fatalf("a line of %d bytes", len(line))
			}
			got = append(got, string(line))
		}
		var want []string
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				want = append(want, l)
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("got lines %q, want %q", got, want)
		}
	})
}

// FuzzDecodeAnswers feeds the decoders of the API's JSON answers.
func FuzzDecodeAnswers(f *testing.F) {
	for _, s := range []string{
		`{"sandbox":{"name":"stockade-sbx-1","status":"running"},"session":{"id":"sbx_1","status":"running"},"routes":[]}`,
		`{"sandboxes":[{"name":"stockade-a","status":"running","tags":{"k":"v"}}],"pagination":{"count":1,"next":null}}`,
		`{"error":{"message":"nope"}}`, `{"sandbox":{"name":"../x"}}`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if a, err := decodeCreate(body); err == nil && (checkID("", a.Session.ID) != nil || checkID("", a.Sandbox.Name) != nil) {
			t.Errorf("accepted ids %q %q", a.Session.ID, a.Sandbox.Name)
		}
		if a, err := decodeSandbox(body); err == nil && (checkID("", a.Sandbox.Name) != nil || len(a.Sandbox.Status) > maxString+3) {
			t.Errorf("accepted sandbox %+v", a.Sandbox)
		}
		if a, err := decodeList(body); err == nil {
			for _, s := range a.Sandboxes {
				if checkID("", s.Name) != nil {
					t.Errorf("accepted name %q", s.Name)
				}
			}
		}
		if msg := decodeError(500, body); len(msg) > maxString+64 {
			t.Errorf("an error message of %d bytes", len(msg))
		}
	})
}

// TestTagsOf checks the provider's bound of five tags, the owner's kept.
func TestTagsOf(t *testing.T) {
	labels := map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "stockade.owner": "me", "z": "9"}
	tags := tagsOf(labels)
	if len(tags) != maxTags || tags["stockade.owner"] != "me" || tags["a"] != "1" || tags["z"] != "" {
		t.Errorf("got %v, want five with the owner's and the first by key", tags)
	}
	if got := tagsOf(map[string]string{"k": "v"}); len(got) != 1 || got["k"] != "v" {
		t.Errorf("got %v, want the one label", got)
	}
}
