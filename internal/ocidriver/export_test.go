package ocidriver

import "time"

// SetReattachTimeout sets how long Reattach waits for one sandbox until
// the test ends.
func SetReattachTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	old := reattachTimeout
	reattachTimeout = d
	t.Cleanup(func() { reattachTimeout = old })
}
