package feedback

import (
	"maps"
	"slices"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Subscription is what a proxy subscribes to of one resource type: every
// resource (a wildcard subscription), the names it lists, or both (SotW
// allows "*" next to names).
type Subscription struct {
	Wildcard bool
	// Names are the names the proxy subscribes to, sorted.
	Names []string
}

// subscription is a stream's Subscription as the tracker keeps it.
type subscription struct {
	wildcard bool
	names    map[string]struct{}
}

// Subscribed records how a stream's subscription to a type changed: the
// names it added and removed, and whether it is a wildcard subscription
// now. It is what the client status service reports per proxy, so that a
// by-name client (gRPC's, which asks only for the targets it dials) is not
// taken to hold every resource of a type it is in sync on.
func (t *Tracker) Subscribed(key model.Key, id uint64, typeURL string, added, removed []string, wildcard bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(key, id)
	if p == nil {
		return
	}
	if p.subs == nil {
		p.subs = map[string]*subscription{}
	}
	sub := p.subs[typeURL]
	if sub == nil {
		sub = &subscription{names: map[string]struct{}{}}
		p.subs[typeURL] = sub
	}
	sub.wildcard = wildcard
	for _, n := range added {
		sub.names[n] = struct{}{}
	}
	for _, n := range removed {
		delete(sub.names, n)
	}
	if !sub.wildcard && len(sub.names) == 0 {
		delete(p.subs, typeURL)
	}
}

// Subscriptions returns what a connected stream subscribes to, by type
// URL (types it asks nothing of are absent); ok is false when the stream
// is not connected. Get leaves subscriptions out: they can hold thousands
// of names per proxy, and only the client status service reads them.
func (t *Tracker) Subscriptions(key model.Key, id uint64) (subs map[string]Subscription, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(key, id)
	if p == nil {
		return nil, false
	}
	subs = make(map[string]Subscription, len(p.subs))
	for u, sub := range p.subs {
		subs[u] = Subscription{Wildcard: sub.wildcard, Names: slices.Sorted(maps.Keys(sub.names))}
	}
	return subs, true
}
