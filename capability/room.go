package capability

import (
	"github.com/stockade-sh/stockade/engine"
)

// reserver is implemented by runners that account the memory of their
// sandboxes, live and pooled (*engine.Engine): Reserve holds what req's
// sandbox will need, or is ErrResourceExhausted when it does not fit now.
type reserver interface {
	Reserve(engine.Request) (*engine.Reservation, error)
}

// reserveMemory holds req's memory from its admission to its run's end,
// so that invocations admitted at once cannot all pass a check that only
// some of them fit, to end launch_failed later. A runner without
// accounting holds nothing (nil). The reservation travels on the
// execution's ticket (ticket.mem): the run hands it to the runner, and
// every path that does not run releases it with the ticket.
func (s *Service) reserveMemory(req engine.Request) (*engine.Reservation, error) {
	if r, ok := s.runner.(reserver); ok {
		return r.Reserve(req)
	}
	return nil, nil
}
