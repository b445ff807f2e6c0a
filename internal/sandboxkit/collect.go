package sandboxkit

import (
	"fmt"
	"io"

	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// collect reads the guest's frames of one Exec from frames until the
// program's end. It keeps at most outputCap bytes of each stream in res
// (setting the truncation flags) and passes what it keeps to onOutput, if
// set. It returns the validated exit report, or the guest's error report when
// the program could not be started, or an error when the stream ended or the
// guest broke the protocol (the sandbox must then not be used again).
func collect(frames io.Reader, outputCap int64, res *sandbox.Result, onOutput func(sandbox.Stream, []byte)) (*guest.ExitReport, *guest.ErrorReport, error) {
	limit := outputCap
	for {
		t, p, err := guest.ReadFrame(frames, 0)
		if err != nil {
			return nil, nil, err
		}
		switch t {
		case guest.FrameStdout, guest.FrameStderr:
			if len(p) > guest.MaxChunk {
				return nil, nil, fmt.Errorf("output chunk of %d bytes: %w", len(p), guest.ErrProtocol)
			}
			buf, trunc, stream := &res.Stdout, &res.StdoutTruncated, sandbox.Stdout
			if t == guest.FrameStderr {
				buf, trunc, stream = &res.Stderr, &res.StderrTruncated, sandbox.Stderr
			}
			room := limit - int64(len(*buf))
			if int64(len(p)) > room {
				p = p[:max(room, 0)]
				*trunc = true
			}
			if len(p) > 0 {
				*buf = append(*buf, p...)
				if onOutput != nil {
					onOutput(stream, p)
				}
			}
		case guest.FrameExit:
			var r guest.ExitReport
			if err := guest.DecodeJSON(p, &r); err != nil {
				return nil, nil, err
			}
			if err := r.Validate(); err != nil {
				return nil, nil, err
			}
			return &r, nil, nil
		case guest.FrameError:
			// The guest reports a start failure before any output; one
			// after output is forged (the program ran) and must not turn
			// a run into an uncharged "could not start".
			if len(res.Stdout) > 0 || len(res.Stderr) > 0 || res.StdoutTruncated || res.StderrTruncated {
				return nil, nil, fmt.Errorf("error report after output: %w", guest.ErrProtocol)
			}
			var r guest.ErrorReport
			if err := guest.DecodeJSON(p, &r); err != nil {
				return nil, nil, err
			}
			if len(r.Message) > 1024 {
				r.Message = r.Message[:1024]
			}
			return nil, &r, nil
		default:
			return nil, nil, fmt.Errorf("unexpected frame %q: %w", t, guest.ErrProtocol)
		}
	}
}
