// Package peerrate paces what each network peer (a client IPv4 address, or
// IPv6 prefix: Key) may spend, under an optional ceiling shared by all of them. A budget shared by
// everyone alone lets one client spend it for all the others; a budget per
// peer keeps a client without credentials from exhausting what the proxies
// that have them need.
package peerrate

import (
	"net"
	"net/netip"
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

// DefaultIPv6PrefixLength is how many leading bits of an IPv6 address name
// its peer unless told otherwise: a host is commonly given a whole /64 (by
// SLAAC, or a cloud's prefix delegation), so one client may send from 2^64
// addresses of it, and a budget kept per address would be one per packet.
const DefaultIPv6PrefixLength = 64

// Of is Key with DefaultIPv6PrefixLength.
func Of(addr net.Addr) string { return Key(addr, DefaultIPv6PrefixLength) }

// Key is the peer an address names: its IPv4 address, or the network of
// the first ipv6Prefix bits of its IPv6 address (ipv6Prefix outside 1–128
// takes 128: the whole address), without the port, so that the
// connections of one client share a budget; the whole address when it has
// no IP (a Unix socket). An IPv4 address carried in IPv6 (::ffff:a.b.c.d,
// how a dual-stack listener reports it) is the IPv4 address.
func Key(addr net.Addr, ipv6Prefix int) string {
	if addr == nil {
		return ""
	}
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return addr.String()
		}
		ipa, err := netip.ParseAddr(host)
		if err != nil {
			return host
		}
		ip = ipa.AsSlice()
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return ip.String()
	}
	return KeyOf(a, ipv6Prefix)
}

// KeyOf is Key of an IP address.
func KeyOf(a netip.Addr, ipv6Prefix int) string {
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	if ipv6Prefix <= 0 || ipv6Prefix >= 128 {
		return a.String()
	}
	return netip.PrefixFrom(a, ipv6Prefix).Masked().String()
}
