package capability

import (
	"github.com/stockade-sh/stockade/engine"
)

// reserveMemory holds req's memory from its admission to its run's end,
// so that invocations admitted at once cannot all pass a check that only
// some of them fit, to end launch_failed later. It holds nothing (nil)
// for a request a ready pool sandbox serves. The reservation travels on the
// execution's ticket (ticket.mem): the run hands it to the runner, and
// every path that does not run releases it with the ticket.
func (s *gate) reserveMemory(req engine.Request) (*engine.Reservation, error) {
	return s.runner.Reserve(req)
}
