package catalog

import (
	"iter"
	"maps"
	"slices"

	"github.com/scopeplane/scopeplane/xds/model"
)

// scopeSet is the set of scopes that select one Service. Most Services are
// selected by one scope or a few, which a short slice holds in a tenth of
// the memory of the smallest map (a hundred thousand Services each pay
// it); a Service that many scopes select (a shared one, in a world of
// tenants) moves to a map, so that removing each of thousands of scopes
// is not a scan.
type scopeSet struct {
	few  []model.Key
	many map[model.Key]struct{}
}

// scopeSetFew is how many scopes a scopeSet holds in its slice.
const scopeSetFew = 8

func (s *scopeSet) add(k model.Key) {
	switch {
	case s.many != nil:
		s.many[k] = struct{}{}
	case slices.Contains(s.few, k):
	case len(s.few) < scopeSetFew:
		s.few = append(s.few, k)
	default:
		s.many = make(map[model.Key]struct{}, 2*scopeSetFew)
		for _, f := range s.few {
			s.many[f] = struct{}{}
		}
		s.many[k] = struct{}{}
		s.few = nil
	}
}

func (s *scopeSet) remove(k model.Key) {
	if s.many != nil {
		delete(s.many, k)
		return
	}
	if i := slices.Index(s.few, k); i >= 0 {
		last := len(s.few) - 1
		s.few[i] = s.few[last]
		s.few[last] = model.Key{}
		s.few = s.few[:last]
	}
}

func (s *scopeSet) has(k model.Key) bool {
	if s.many != nil {
		_, ok := s.many[k]
		return ok
	}
	return slices.Contains(s.few, k)
}

func (s *scopeSet) len() int { return len(s.few) + len(s.many) }

// all yields every scope; the set must not change meanwhile (see keys).
func (s *scopeSet) all() iter.Seq[model.Key] {
	if s.many != nil {
		return maps.Keys(s.many)
	}
	return slices.Values(s.few)
}

// keys returns every scope, in a slice of its own: for a loop that
// removes them.
func (s *scopeSet) keys() []model.Key {
	if s.many != nil {
		return slices.Collect(maps.Keys(s.many))
	}
	return slices.Clone(s.few)
}
