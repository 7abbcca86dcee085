// Package keyset is how one stage of the pipeline tells the next which
// scopes changed: a set of scope keys plus a channel that is signalled when
// keys are added. Adding a key that is already in the set is free, so a
// burst of changes to one scope is handed on once: that is how the stages
// coalesce. The set holds at most one entry per scope.
package keyset

import (
	"maps"
	"slices"
	"sync"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Set is safe for concurrent use. Its zero value is not usable: call New.
type Set struct {
	mu     sync.Mutex
	keys   map[model.Key]struct{}
	notify chan struct{}
}

// New returns an empty set.
func New() *Set { return &Set{keys: map[model.Key]struct{}{}, notify: make(chan struct{}, 1)} }

// Add records that the scope changed and signals Changed.
func (s *Set) Add(k model.Key) {
	s.mu.Lock()
	s.keys[k] = struct{}{}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Changed receives a value after keys were added; several additions may be
// signalled once.
func (s *Set) Changed() <-chan struct{} { return s.notify }

// Take returns the keys added since the previous Take, and forgets them.
func (s *Set) Take() []model.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Keys(s.keys))
	clear(s.keys)
	return out
}
