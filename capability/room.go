package capability

import (
	"github.com/stockade-sh/stockade/engine"
)

// roomer is implemented by runners that account the memory of their
// sandboxes, live and pooled (*engine.Engine): Room is
// ErrResourceExhausted when req's sandbox would not fit now.
type roomer interface {
	Room(engine.Request) error
}

// room asks the runner whether req has room now; a runner without
// accounting always has.
func (s *Service) room(req engine.Request) error {
	if r, ok := s.runner.(roomer); ok {
		return r.Room(req)
	}
	return nil
}
