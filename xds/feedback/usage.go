package feedback

import (
	"math"
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
	// index numbers the Services streams ask for, and keys lists them by
	// number, so that a stream counts its asks in a slice, 2 bytes per
	// Service, rather than in a map of its own (Proxy.asks).
	index map[model.Key]int
	keys  []model.Key
}

// Usage is which Services a scope's proxies asked for during the cost window.
type Usage struct {
	// All is set when a proxy subscribed with a wildcard: it asks for
	// every Service the scope selects.
	All bool
	// Services holds the Services some proxy asked for by name.
	Services map[model.Key]bool
}

// Asks records how a stream's subscriptions changed: the Service of each
// resource name it subscribed to (added) and dropped (removed), a Service
// once per name, and whether it gained (+1) or lost (-1) a wildcard
// subscription.
func (t *Tracker) Asks(key model.Key, id uint64, added, removed []model.Key, wildcard int) {
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
	count := func(svc model.Key, n int) {
		i := s.usage.number(svc)
		if i >= len(p.asks) {
			p.asks = append(p.asks, make([]uint16, i+1-len(p.asks))...)
		}
		before := int(p.asks[i])
		after := max(before+n, 0)
		if before == math.MaxUint16 {
			after = before // saturated: counted until the stream ends
		}
		p.asks[i] = uint16(after)
		s.usage.change(svc, before, after, now)
	}
	// Added first: a Service one of whose names replaces another stays
	// asked for throughout.
	for _, svc := range added {
		count(svc, 1)
	}
	for _, svc := range removed {
		count(svc, -1)
	}
	if len(s.usage.keys) > 2*len(s.usage.streams)+renumberSlack {
		s.renumber()
	}
	if wildcard != 0 {
		before := p.wildcards
		p.wildcards = max(before+wildcard, 0)
		s.usage.changeWildcard(before, p.wildcards, now)
	}
}

// renumberSlack is how many more Services than twice those asked for now
// the usage numbers before it numbers them again (renumber).
const renumberSlack = 1024

// number returns the number of svc, giving it the next one if it has none.
func (u *usage) number(svc model.Key) int {
	i, ok := u.index[svc]
	if !ok {
		if u.index == nil {
			u.index = map[model.Key]int{}
		}
		i = len(u.keys)
		u.index[svc] = i
		u.keys = append(u.keys, svc)
	}
	return i
}

// renumber numbers only the Services streams ask for now, and moves every
// stream's counts to the new numbers: the numbering follows the Services
// in use, not every Service the scope's proxies ever asked for.
func (r *Report) renumber() {
	old := r.usage.keys
	r.usage.index, r.usage.keys = nil, nil
	for svc := range r.usage.streams {
		r.usage.number(svc)
	}
	for _, p := range r.Proxies {
		var asks []uint16
		for i, n := range p.asks {
			if n == 0 {
				continue
			}
			j := r.usage.index[old[i]]
			if j >= len(asks) {
				asks = append(asks, make([]uint16, j+1-len(asks))...)
			}
			asks[j] = n
		}
		p.asks = asks
	}
}

// forget takes a disconnected stream's subscriptions out of the usage.
func (u *usage) forget(p *Proxy, now time.Time) {
	for i, n := range p.asks {
		if n > 0 {
			u.change(u.keys[i], int(n), 0, now)
		}
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
