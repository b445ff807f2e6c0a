package store

import "testing"

// TestCancelTransitions tables what a cancel does to an execution in each
// status: not started, it ends cancelled; running, killed (charged, as the
// launched run it was); ended, nothing.
func TestCancelTransitions(t *testing.T) {
	want := map[ExecutionStatus]ExecutionStatus{
		StatusAwaitingApproval: StatusCancelled,
		StatusQueued:           StatusCancelled,
		StatusRunning:          StatusKilled,
	}
	for _, s := range ExecutionStatuses {
		t.Run(string(s), func(t *testing.T) {
			to, ok := s.Cancel()
			w, live := want[s]
			switch {
			case live && (!ok || to != w):
				t.Errorf("Cancel(): got %s, %v; want %s, true", to, ok, w)
			case !live && (ok || to != s):
				t.Errorf("Cancel(): got %s, %v; want %s, false (it has ended)", to, ok, s)
			}
			if live != !s.Terminal() {
				t.Errorf("Terminal(): got %v for a status a cancel %s", s.Terminal(), map[bool]string{true: "ends", false: "leaves alone"}[live])
			}
		})
	}
	if StatusCancelled.Charged() || !StatusKilled.Charged() {
		t.Errorf("Charged: got cancelled %v, killed %v; want false, true", StatusCancelled.Charged(), StatusKilled.Charged())
	}
}
