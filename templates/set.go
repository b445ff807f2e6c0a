package templates

import (
	"maps"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Set is a validated set of templates. The nil *Set holds none. A Set is
// immutable and safe for concurrent use.
type Set struct {
	byName map[string]Template
}

func newSet(ts []Template) *Set {
	s := &Set{byName: make(map[string]Template, len(ts))}
	for _, t := range ts {
		s.byName[t.Name] = t.Clone()
	}
	return s
}

// Get returns the template called name. An unknown name is an ErrNotFound
// whose message a client may read.
func (s *Set) Get(name string) (Template, error) {
	if s != nil {
		if t, ok := s.byName[name]; ok {
			return t.Clone(), nil
		}
	}
	if s.Len() == 0 {
		return Template{}, errdefs.Publicf("unknown template %q (no template is configured): %w", name, errdefs.ErrNotFound)
	}
	return Template{}, errdefs.Publicf("unknown template %q (known: %s): %w", name, strings.Join(s.Names(), ", "), errdefs.ErrNotFound)
}

// Names returns the names of the templates, sorted.
func (s *Set) Names() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.byName))
}

// Templates returns the templates in the order of Names.
func (s *Set) Templates() []Template {
	var ts []Template
	for _, n := range s.Names() {
		ts = append(ts, s.byName[n].Clone())
	}
	return ts
}

// Len is the number of templates.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byName)
}
