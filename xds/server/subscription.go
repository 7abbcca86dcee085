package server

import (
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// subscription is what a stream keeps per resource type in either protocol
// (go-control-plane's stream.Subscription is the anchor): what the proxy
// asked for, what the server knows it holds, and what a rejection left
// owed. The protocols differ only in how requests change it and how
// responses are framed; the steps below are shared.
type subscription struct {
	t         xdstype.Type
	requested bool
	wildcard  bool
	names     nameSet
	// namesDigest is the digest of the by-name subscription (the XOR of
	// snapshot.NameDigest over names), which a SotW by-name version covers.
	namesDigest uint64
	// held is what the proxy holds from this stream, as far as the server
	// knows: for a SotW full-state type the last full set sent (the set
	// before it again once the proxy rejected it); otherwise
	// every resource sent (in delta seeded from initial_resource_versions
	// and rolled back on a NACK). A claimed version the server does not
	// serve is held as a Resource without a body.
	held holding
	// owed holds the names a rejected response carried, each with the
	// version of what the proxy rejected under it ("" for a removal): they
	// are sent again with the next change of the type, never alone (that
	// would loop on the rejection, go-control-plane #962), and a change
	// that brings back only what was rejected is no change (rejectedAgain).
	owed map[string]string
	// rejecting is set while the proxy's last answer was a NACK, or names
	// it rejected are still owed: the proxy lacks part of the scope.
	rejecting bool
}

func newSubscription(t xdstype.Type) subscription {
	return subscription{t: t, owed: map[string]string{}}
}

// holding is what a proxy holds of one type, kept so that a proxy in step
// with its scope costs its stream a few words whatever the scope's size:
// once the stream brought the proxy to a set of the scope (whole), it keeps
// that immutable set by reference (base) and, apart, only the names where
// the proxy differs from it for the subscription (diff: a resource, or nil
// for none): a rejected change, a response in flight, a name subscribed
// since, a claimed version the scope does not serve. Without a base, diff
// is everything held. The proxy holds base's resource of a subscribed name
// that diff does not list, and nothing else.
type holding struct {
	base  snapshot.TypeSet
	whole bool
	diff  map[string]*snapshot.Resource
}

// heldRes returns what the proxy holds of that name, or nil.
func (s *subscription) heldRes(name string) *snapshot.Resource {
	if r, ok := s.held.diff[name]; ok {
		return r
	}
	return s.implied(name)
}

// implied is what the base says the proxy holds of that name.
func (s *subscription) implied(name string) *snapshot.Resource {
	if !s.held.whole || !s.subscribed(name) {
		return nil
	}
	return s.held.base.Get(name)
}

// hold records that the proxy holds r (nil: nothing) under name.
func (s *subscription) hold(name string, r *snapshot.Resource) {
	if r == s.implied(name) {
		delete(s.held.diff, name)
		return
	}
	if s.held.diff == nil {
		s.held.diff = map[string]*snapshot.Resource{}
	}
	s.held.diff[name] = r
}

// eachHeld calls fn for every resource the proxy holds.
func (s *subscription) eachHeld(fn func(*snapshot.Resource)) { s.eachIn(s.held, fn) }

// eachIn calls fn for every resource of h, as the subscription reads it.
func (s *subscription) eachIn(h holding, fn func(*snapshot.Resource)) {
	for _, r := range h.diff {
		if r != nil {
			fn(r)
		}
	}
	if !h.whole {
		return
	}
	from := func(r *snapshot.Resource) {
		if _, ok := h.diff[r.Name]; !ok {
			fn(r)
		}
	}
	if s.wildcard {
		h.base.All(from)
		return
	}
	s.names.all(func(name string) {
		if r := h.base.Get(name); r != nil {
			from(r)
		}
	})
}

// listed is every resource of h by name, as the subscription reads it.
func (s *subscription) listed(h holding) map[string]*snapshot.Resource {
	all := map[string]*snapshot.Resource{}
	s.eachIn(h, func(r *snapshot.Resource) { all[r.Name] = r })
	return all
}

// heldCount is how many resources the proxy holds.
func (s *subscription) heldCount() int {
	n := 0
	s.eachHeld(func(*snapshot.Resource) { n++ })
	return n
}

// holdsAny reports whether the proxy holds anything, without a pass over
// what it holds where the base alone tells: a wildcard subscription's base
// with more names than diff lists holds one at least.
func (s *subscription) holdsAny() bool {
	for _, r := range s.held.diff {
		if r != nil {
			return true
		}
	}
	if s.held.whole && s.wildcard && s.held.base.Len() > len(s.held.diff) {
		return true
	}
	return s.heldCount() > 0
}

// holdNothing forgets what the proxy holds: a new stream knows nothing of it.
func (s *subscription) holdNothing() { s.held = holding{} }

// holdSet records that the proxy holds exactly set's resources for its
// subscription.
func (s *subscription) holdSet(set snapshot.TypeSet) { s.held = holding{base: set, whole: true} }

// subscribing pins what the proxy holds of names about to be subscribed,
// before the subscription changes what the base says of them; a change to
// or from a wildcard, which changes it for every name, drops the base.
func (s *subscription) subscribing(names []string, wildcard bool) {
	if !s.held.whole {
		return
	}
	if wildcard != s.wildcard {
		s.unbase()
		return
	}
	for _, name := range names {
		if _, ok := s.held.diff[name]; !ok && name != "*" && !s.subscribed(name) {
			if s.held.diff == nil {
				s.held.diff = map[string]*snapshot.Resource{}
			}
			s.held.diff[name] = nil // settle drops it if the base agrees
		}
	}
}

// unbase lists everything held in diff and drops the base.
func (s *subscription) unbase() { s.held = holding{diff: s.listed(s.held)} }

// settle keeps the divergence small, without changing what is held, once
// the stream planned or sent from set, the scope's current one: a stream
// with a base moves it to set (pinning first what the proxy holds of the
// names that differ between the two, then dropping what set now implies);
// one without takes set as its base when that leaves less than half the
// divergence. It compares only when the divergence is at least a quarter
// of what it reads (the set, or the names subscribed), so the comparison
// costs no more than what it may save.
func (s *subscription) settle(set snapshot.TypeSet) {
	if s.held.whole {
		snapshot.Changes(s.held.base, set, func(name string) {
			if _, ok := s.held.diff[name]; !ok && s.subscribed(name) {
				if s.held.diff == nil {
					s.held.diff = map[string]*snapshot.Resource{}
				}
				s.held.diff[name] = s.held.base.Get(name)
			}
		})
		s.held.base = set
		for name, r := range s.held.diff {
			if r == s.implied(name) {
				delete(s.held.diff, name)
			}
		}
		return
	}
	scan := s.names.len()
	if s.wildcard {
		scan = set.Len()
	}
	if len(s.held.diff) == 0 || 4*len(s.held.diff) < scan {
		return
	}
	next := map[string]*snapshot.Resource{}
	against := func(r *snapshot.Resource) {
		if h := s.held.diff[r.Name]; h != r {
			next[r.Name] = h
		}
	}
	if s.wildcard {
		set.All(against)
	} else {
		s.names.all(func(name string) {
			if r := set.Get(name); r != nil {
				against(r)
			}
		})
	}
	for name, h := range s.held.diff {
		if h != nil && (!s.subscribed(name) || set.Get(name) == nil) {
			next[name] = h
		}
	}
	if len(next) < len(s.held.diff)/2 {
		s.held = holding{base: set, whole: true, diff: next}
	}
}

// addName adds name to a by-name subscription, keeping its digest, and
// reports whether it was not there.
func (s *subscription) addName(name string) bool {
	if !s.names.add(name) {
		return false
	}
	s.namesDigest ^= snapshot.NameDigest(name)
	return true
}

// removeName removes name from a by-name subscription, keeping its
// digest, and reports whether it was there.
func (s *subscription) removeName(name string) bool {
	if !s.names.remove(name) {
		return false
	}
	s.namesDigest ^= snapshot.NameDigest(name)
	return true
}

func (s *subscription) subscribed(name string) bool {
	if s.wildcard {
		return true
	}
	return s.names.has(name)
}

// holds reports whether the proxy holds exactly r. Versions are content
// hashes, so an equal version is the same resource.
func (s *subscription) holds(r *snapshot.Resource) bool {
	h := s.heldRes(r.Name)
	return h != nil && (h == r || h.Version == r.Version)
}

// forgetUnsubscribed drops what the proxy no longer subscribes to: it drops
// those resources itself, and they are no longer owed.
func (s *subscription) forgetUnsubscribed() {
	for name := range s.held.diff {
		if !s.subscribed(name) {
			delete(s.held.diff, name) // the base implies nothing for it either
		}
	}
	for name := range s.owed {
		if !s.subscribed(name) {
			delete(s.owed, name)
		}
	}
}

// sent records that a response carried r: the proxy holds it, and it is
// no longer owed.
func (s *subscription) sent(r *snapshot.Resource) {
	s.hold(r.Name, r)
	delete(s.owed, r.Name)
}

// sentAll is sent of every resource of a response planned from set, which
// lists each name once. A stream's first response, which brings a proxy
// that held nothing set's resource of every name it subscribes to, leaves
// it holding set: recorded as that, not name by name for settle to fold.
func (s *subscription) sentAll(res []*snapshot.Resource, set snapshot.TypeSet) {
	if len(res) > 0 && !s.held.whole && len(s.held.diff) == 0 && s.covers(res, set) {
		s.holdSet(set)
		for _, r := range res {
			delete(s.owed, r.Name)
		}
		return
	}
	for _, r := range res {
		s.sent(r)
	}
}

// covers reports whether res, which lists each name once, is set's
// resource of every name subscribed.
func (s *subscription) covers(res []*snapshot.Resource, set snapshot.TypeSet) bool {
	n := set.Len()
	if !s.wildcard {
		n = 0
		s.names.all(func(name string) {
			if set.Get(name) != nil {
				n++
			}
		})
	}
	if len(res) != n {
		return false
	}
	for _, r := range res {
		if r != set.Get(r.Name) || !s.subscribed(r.Name) {
			return false
		}
	}
	return true
}
