package server

import (
	"container/list"
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/peerrate"
)

// listener bounds and paces the connections the server accepts and
// registers the ones it serves. A connection beyond the bounds (open
// connections of the replica and of the peer) or the paces (of the peer,
// then of the replica) is closed at once, before gRPC spends a transport
// (buffers, goroutines, the HTTP/2 handshake) on it: the client sees the
// connection closed and reconnects with backoff. No gRPC status can be sent
// without that handshake.
//
// Where the bounds are reached by connections that never opened an
// authenticated stream, one of them makes room instead (conns.evict): a
// replica filled with idle connections would otherwise refuse every new
// proxy until they time out.
type listener struct {
	net.Listener
	s *Server
}

func (l listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerrate.Of(c.RemoteAddr())
		if !l.s.conns.reserve(peer) {
			if !l.s.conns.evict(peer, time.Now().Add(-l.s.opts.HandshakeTimeout)) || !l.s.conns.reserve(peer) {
				l.s.fb.Refuse(model.Key{}, RefusedConnectionLimit)
				_ = c.Close()
				continue
			}
			l.s.fb.Refuse(model.Key{}, RefusedConnectionEvicted)
		}
		if !l.s.connPace.Allow(peer) {
			l.s.conns.release(peer)
			l.s.fb.Refuse(model.Key{}, RefusedConnectionPaced)
			_ = c.Close()
			continue
		}
		return l.s.conns.add(c, peer), nil
	}
}

// conns are the connections being served, by remote address (what gRPC
// gives a stream as its peer), so that a stream can have its connection
// closed: that is the only way to drop what gRPC's transport buffers for a
// stream whose proxy does not read. Ending the stream is not enough: its
// final status queues behind the unread data.
// They are also counted, in all and by peer, against the bounds of open
// connections, and those that have not yet carried an authenticated
// stream are kept by peer, oldest first, as the ones to evict.
type conns struct {
	max, maxPerPeer int

	mu       sync.Mutex
	by       map[string]*conn
	open     int
	byPeer   map[string]int
	unproven map[string]*list.List // of *conn, by peer, oldest first
}

func newConns(max, maxPerPeer int) *conns {
	return &conns{max: max, maxPerPeer: maxPerPeer, by: map[string]*conn{}, byPeer: map[string]int{}, unproven: map[string]*list.List{}}
}

// reserve counts a new connection of peer, or reports false when the
// replica or the peer holds as many as it may.
func (cs *conns) reserve(peer string) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open >= cs.max || cs.byPeer[peer] >= cs.maxPerPeer {
		return false
	}
	cs.open++
	cs.byPeer[peer]++
	return true
}

// release uncounts a connection of peer.
func (cs *conns) release(peer string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.release1(peer)
}

func (cs *conns) release1(peer string) {
	cs.open--
	if cs.byPeer[peer]--; cs.byPeer[peer] <= 0 {
		delete(cs.byPeer, peer)
	}
}

// Open is how many connections are counted open now.
func (cs *conns) Open() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.open
}

type conn struct {
	net.Conn
	cs       *conns
	peer     string
	register bool
	accepted time.Time
	// unproven is the connection's element in its peer's list of
	// unproven connections, nil once a stream on it was authenticated
	// (or for one that is not registered).
	unproven *list.Element
	once     sync.Once
}

// add wraps c (reserved for peer) so that closing it uncounts it, and
// registers it when its remote address names it alone, as a TCP address
// does (a Unix socket's peers may all be unnamed); a connection it cannot
// register is served, but neither closed for a slow stream nor evicted.
func (cs *conns) add(c net.Conn, peer string) net.Conn {
	_, tcp := c.RemoteAddr().(*net.TCPAddr)
	w := &conn{Conn: c, cs: cs, peer: peer, register: tcp, accepted: time.Now()}
	if tcp {
		cs.mu.Lock()
		cs.by[c.RemoteAddr().String()] = w
		l := cs.unproven[peer]
		if l == nil {
			l = list.New()
			cs.unproven[peer] = l
		}
		w.unproven = l.PushBack(w)
		cs.mu.Unlock()
	}
	return w
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.cs.mu.Lock()
		if c.register && c.cs.by[c.RemoteAddr().String()] == c {
			delete(c.cs.by, c.RemoteAddr().String())
		}
		c.cs.proven1(c)
		c.cs.release1(c.peer)
		c.cs.mu.Unlock()
	})
	return c.Conn.Close()
}

// prove marks the connection of the stream whose context is ctx as one
// that carried an authenticated stream: it is no longer evicted.
func (cs *conns) prove(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.by[p.Addr.String()]; c != nil {
		cs.proven1(c)
	}
}

// proven1 takes c off its peer's list of unproven connections.
func (cs *conns) proven1(c *conn) {
	if c.unproven == nil {
		return
	}
	l := cs.unproven[c.peer]
	l.Remove(c.unproven)
	c.unproven = nil
	if l.Len() == 0 {
		delete(cs.unproven, c.peer)
	}
}

// evict closes one connection to make room for a new one of peer, and
// reports whether it did. Only a connection accepted before cutoff (the
// handshake timeout ago) that has carried no authenticated stream is
// evicted: a proxy opens its stream as soon as the handshake is done, so
// such a connection serves nobody. When peer holds as many connections as
// it may, its own oldest such connection goes; when the replica does, the
// oldest such connection of the peer holding the most connections, if it
// holds more than peer: a client that opened many idle connections loses
// them to one that has few, never the reverse.
func (cs *conns) evict(peer string, cutoff time.Time) bool {
	cs.mu.Lock()
	victim := peer
	if cs.byPeer[peer] < cs.maxPerPeer {
		victim = ""
		for p, l := range cs.unproven {
			if cs.byPeer[p] > cs.byPeer[victim] && l.Front().Value.(*conn).accepted.Before(cutoff) {
				victim = p
			}
		}
		if victim == "" || cs.byPeer[victim] <= cs.byPeer[peer]+1 {
			victim = ""
		}
	}
	var c *conn
	if l := cs.unproven[victim]; victim != "" && l != nil && l.Front().Value.(*conn).accepted.Before(cutoff) {
		c = l.Front().Value.(*conn)
	}
	cs.mu.Unlock()
	if c == nil {
		return false
	}
	_ = c.Close()
	return true
}

// close closes the connection of the stream whose context is ctx, when the
// server registered it (a TCP connection ServeListener accepted); for any
// other the slow stream is only ended.
func (cs *conns) close(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return
	}
	cs.mu.Lock()
	c := cs.by[p.Addr.String()]
	cs.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}
