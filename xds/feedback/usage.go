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
//
// The Services streams ask for are numbered (index, and keys by number),
// so that what is kept per Service, here and per stream (Proxy.asks, 2
// bytes a Service), is a slice rather than a map.
type usage struct {
	index map[model.Key]int
	keys  []model.Key
	// streams counts, per Service by number, the streams asking for it
	// now; asked is how many Services that is.
	streams []int32
	asked   int
	// last is when the last stream asking for a Service stopped.
	last map[model.Key]time.Time
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
	for _, svc := range added {
		s.usage.number(svc)
	}
	if n := len(s.usage.keys); len(added) > 0 && len(p.asks) < n {
		p.asks = append(make([]uint16, 0, n), p.asks...)[:n] // once, to size
	}
	count := func(svc model.Key, n int) {
		i, ok := s.usage.index[svc]
		if !ok || i >= len(p.asks) {
			return // never asked for by this stream
		}
		before := int(p.asks[i])
		after := max(before+n, 0)
		if before == math.MaxUint16 {
			after = before // saturated: counted until the stream ends
		}
		p.asks[i] = uint16(after)
		s.usage.change(i, before, after, now)
	}
	// Added first: a Service one of whose names replaces another stays
	// asked for throughout.
	for _, svc := range added {
		count(svc, 1)
	}
	for _, svc := range removed {
		count(svc, -1)
	}
	if len(s.usage.keys) > 2*s.usage.asked+renumberSlack {
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
		u.streams = append(u.streams, 0)
	}
	return i
}

// renumber numbers only the Services streams ask for now, and moves every
// count to the new numbers: the numbering follows the Services in use, not
// every Service the scope's proxies ever asked for.
func (r *Report) renumber() {
	u := &r.usage
	keys, streams := u.keys, u.streams
	u.index, u.keys, u.streams = nil, nil, nil
	for i, n := range streams {
		if n > 0 {
			u.streams[u.number(keys[i])] = n
		}
	}
	for _, p := range r.Proxies {
		var asks []uint16
		for i, n := range p.asks {
			if n == 0 {
				continue
			}
			if asks == nil {
				asks = make([]uint16, len(u.keys))
			}
			asks[u.index[keys[i]]] = n
		}
		p.asks = asks
	}
}

// forget takes a disconnected stream's subscriptions out of the usage.
func (u *usage) forget(p *Proxy, now time.Time) {
	for i, n := range p.asks {
		if n > 0 {
			u.change(i, int(n), 0, now)
		}
	}
	u.changeWildcard(p.wildcards, 0, now)
}

// change records that one stream went from asking for before names of the
// Service numbered i to after.
func (u *usage) change(i, before, after int, now time.Time) {
	switch {
	case before == 0 && after > 0:
		if u.streams[i]++; u.streams[i] == 1 {
			u.asked++
		}
	case before > 0 && after == 0:
		if u.streams[i]--; u.streams[i] == 0 {
			u.asked--
			if u.last == nil {
				u.last = map[model.Key]time.Time{}
			}
			u.last[u.keys[i]] = now
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
		Services: make(map[model.Key]bool, u.asked+len(u.last))}
	for i, n := range u.streams {
		if n > 0 {
			out.Services[u.keys[i]] = true
		}
	}
	for svc, at := range u.last {
		if now.Sub(at) < window {
			out.Services[svc] = true
		} else if i, ok := u.index[svc]; !ok || u.streams[i] == 0 {
			delete(u.last, svc)
		}
	}
	return out
}
