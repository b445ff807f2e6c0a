package ocidriver

import "maps"

// Labels returns the sandbox's labels: those it was created with, and a
// binding's (a copy).
func (s *sbx) Labels() map[string]string {
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	return maps.Clone(s.labels)
}
