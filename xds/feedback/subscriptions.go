package feedback

import (
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
	names    Names
}

// Names is the names a stream subscribes to of one type, handed to the
// tracker whole and never changed after: the ADS server shares one set
// among the streams subscribed to exactly what their scope serves, so the
// tracker keeps it by reference rather than a copy per stream.
type Names interface {
	Len() int
	All(fn func(name string))
}

// Subscribed records a stream's subscription to a type: the names it
// subscribes to now, and whether it is a wildcard subscription. It is what
// the client status service reports per proxy, so that a by-name client
// (gRPC's, which asks only for the targets it dials) is not taken to hold
// every resource of a type it is in sync on.
func (t *Tracker) Subscribed(key model.Key, id uint64, typeURL string, names Names, wildcard bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(key, id)
	if p == nil {
		return
	}
	if p.subs == nil {
		p.subs = map[string]*subscription{}
	}
	if !wildcard && (names == nil || names.Len() == 0) {
		delete(p.subs, typeURL)
		return
	}
	p.subs[typeURL] = &subscription{wildcard: wildcard, names: names}
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
		var names []string
		if sub.names != nil && sub.names.Len() > 0 {
			names = make([]string, 0, sub.names.Len())
			sub.names.All(func(name string) { names = append(names, name) })
			slices.Sort(names)
		}
		subs[u] = Subscription{Wildcard: sub.wildcard, Names: names}
	}
	return subs, true
}
