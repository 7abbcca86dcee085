// Package peerrate paces what each network peer (a client IP address) may
// spend, under an optional ceiling shared by all of them. A budget shared by
// everyone alone lets one client spend it for all the others; a budget per
// peer keeps a client without credentials from exhausting what the proxies
// that have them need.
package peerrate

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxPeers bounds how many peers are tracked at once: a peer whose budget
// has refilled is the same as one never seen and is forgotten, so only
// peers that spent within the last refill time are held. Beyond maxPeers
// (an attack from more addresses than that within one refill time) the
// new peers share one budget, so memory stays bounded whatever the number
// of addresses.
const maxPeers = 1 << 16

// Limiter paces events per peer, and all of them together under Ceiling
// when set.
type Limiter struct {
	every rate.Limit
	burst int
	// Ceiling, when set, is spent after a peer's own budget allowed an
	// event: one peer cannot empty it beyond its own pace.
	ceiling *rate.Limiter
	now     func() time.Time

	mu       sync.Mutex
	peers    map[string]*rate.Limiter
	overflow *rate.Limiter
	sweepAt  int
}

// New paces each peer at perSecond with burst, under ceiling (nil: none).
func New(perSecond float64, burst int, ceiling *rate.Limiter) *Limiter {
	return &Limiter{
		every: rate.Limit(perSecond), burst: burst, ceiling: ceiling, now: time.Now,
		peers: map[string]*rate.Limiter{}, overflow: rate.NewLimiter(rate.Limit(perSecond), burst), sweepAt: 1024,
	}
}

// Allow spends one event of peer's budget, and then of the ceiling, and
// reports whether both had room.
func (l *Limiter) Allow(peer string) bool {
	now := l.now()
	if !l.limiter(peer, now).AllowN(now, 1) {
		return false
	}
	return l.ceiling == nil || l.ceiling.AllowN(now, 1)
}

// Has reports whether peer's budget has room for one event, without
// spending it: for a budget spent only by what fails (Spend).
func (l *Limiter) Has(peer string) bool {
	now := l.now()
	l.mu.Lock()
	lim := l.peers[peer]
	l.mu.Unlock()
	return lim == nil || lim.TokensAt(now) >= 1
}

// Spend spends one event of peer's budget whether or not it has room.
func (l *Limiter) Spend(peer string) {
	now := l.now()
	l.limiter(peer, now).ReserveN(now, 1)
}

// Peers is how many peers are tracked now.
func (l *Limiter) Peers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.peers)
}

func (l *Limiter) limiter(peer string, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lim := l.peers[peer]; lim != nil {
		return lim
	}
	if len(l.peers) >= l.sweepAt {
		l.sweep(now)
	}
	if len(l.peers) >= maxPeers {
		return l.overflow
	}
	lim := rate.NewLimiter(l.every, l.burst)
	l.peers[peer] = lim
	return lim
}

// sweep forgets the peers whose budget refilled, and sets the size of the
// next sweep to twice what is left, so sweeping costs O(1) per new peer.
func (l *Limiter) sweep(now time.Time) {
	for p, lim := range l.peers {
		if lim.TokensAt(now) >= float64(l.burst) {
			delete(l.peers, p)
		}
	}
	l.sweepAt = max(1024, 2*len(l.peers))
}

// Of is the peer an address names: its IP, without the port, so that the
// connections of one client share a budget; the whole address when it has
// no IP (a Unix socket).
func Of(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case *net.UDPAddr:
		return a.IP.String()
	}
	if host, _, err := net.SplitHostPort(addr.String()); err == nil {
		return host
	}
	return addr.String()
}
