package ocidriver

import "time"

// SetReattachTimeout sets how long Reattach waits for one sandbox until
// the test ends.
func SetReattachTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	old := reattachTimeout
	reattachTimeout = d
	t.Cleanup(func() { reattachTimeout = old })
}

// OnBundleMade calls f as a create has made its sandbox's bundle
// directory, before it writes anything into it, until the test ends.
func OnBundleMade(t interface{ Cleanup(func()) }, f func(id string)) {
	old := bundleMade
	bundleMade = f
	t.Cleanup(func() { bundleMade = old })
}

// SetAheadIdle sets how long a slot made ahead waits to be taken before
// it is ended, until the test ends.
func SetAheadIdle(t interface{ Cleanup(func()) }, d time.Duration) {
	old := aheadIdle
	aheadIdle = d
	t.Cleanup(func() { aheadIdle = old })
}
