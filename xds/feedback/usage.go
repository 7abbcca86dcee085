package feedback

import (
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

// usage is which of a scope's Services its proxies ask for: a proxy asks
// for a Service when it subscribes by name to one of its resources, and for
// all of them with a wildcard subscription. It shows which selected
// Services no proxy needs, for the scoping advice.
type usage struct {
	// streams counts, per Service, the streams asking for it now, and last
	// is when the last of them stopped.
	streams map[model.Key]int
	last    map[model.Key]time.Time
	// wildcards counts the streams with a wildcard subscription, and
	// lastWildcard is when the last of them stopped.
	wildcards    int
	lastWildcard time.Time
}

// Usage is which Services a scope's proxies asked for during the cost window.
type Usage struct {
	// All is set when a proxy subscribed with a wildcard: it asks for
	// every Service the scope selects.
	All bool
	// Services holds the Services some proxy asked for by name.
	Services map[model.Key]bool
}

// Asks records how a stream's subscriptions changed: per Service, how many
// more (or, negative, fewer) of its resource names the stream subscribes
// to, and whether it gained (+1) or lost (-1) a wildcard subscription.
func (t *Tracker) Asks(key model.Key, id uint64, names map[model.Key]int, wildcard int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scopes[key]
	if s == nil {
		return
	}
	p := s.Proxies[id]
	if p == nil {
		return
	}
	now := t.now()
	for svc, n := range names {
		before := p.asks[svc]
		after := max(before+n, 0)
		if after == 0 {
			delete(p.asks, svc)
		} else {
			p.asks[svc] = after
		}
		s.usage.change(svc, before, after, now)
	}
	if wildcard != 0 {
		before := p.wildcards
		p.wildcards = max(before+wildcard, 0)
		s.usage.changeWildcard(before, p.wildcards, now)
	}
}

// forget takes a disconnected stream's subscriptions out of the usage.
func (u *usage) forget(p *Proxy, now time.Time) {
	for svc, n := range p.asks {
		u.change(svc, n, 0, now)
	}
	u.changeWildcard(p.wildcards, 0, now)
}

// change records that one stream went from asking for before names of the
// Service to after.
func (u *usage) change(svc model.Key, before, after int, now time.Time) {
	switch {
	case before == 0 && after > 0:
		if u.streams == nil {
			u.streams, u.last = map[model.Key]int{}, map[model.Key]time.Time{}
		}
		u.streams[svc]++
	case before > 0 && after == 0:
		if u.streams[svc]--; u.streams[svc] <= 0 {
			delete(u.streams, svc)
			u.last[svc] = now
		}
	}
}

func (u *usage) changeWildcard(before, after int, now time.Time) {
	switch {
	case before == 0 && after > 0:
		u.wildcards++
	case before > 0 && after == 0:
		if u.wildcards--; u.wildcards <= 0 {
			u.wildcards, u.lastWildcard = 0, now
		}
	}
}

// within returns the usage during the window that ends at now, and drops
// what is older.
func (u *usage) within(window time.Duration, now time.Time) Usage {
	out := Usage{All: u.wildcards > 0 || (!u.lastWildcard.IsZero() && now.Sub(u.lastWildcard) < window),
		Services: make(map[model.Key]bool, len(u.streams)+len(u.last))}
	for svc := range u.streams {
		out.Services[svc] = true
	}
	for svc, at := range u.last {
		if now.Sub(at) < window {
			out.Services[svc] = true
		} else if u.streams[svc] == 0 {
			delete(u.last, svc)
		}
	}
	return out
}
