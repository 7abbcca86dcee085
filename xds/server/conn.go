package server

import (
	"container/list"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/peerrate"
)

// listener bounds and paces the connections the server accepts and
// registers the ones it serves. A connection beyond the paces (of the
// peer's failures, of the peer, then of the replica) or the bounds (open
// connections of the replica and of the peer) is closed at once,
// before gRPC spends a transport (buffers, goroutines, the TLS and HTTP/2
// handshakes) on it: the client sees the connection closed and reconnects
// with backoff. No gRPC status can be sent without that handshake.
//
// Where the bounds are reached, a connection that has carried no stream
// admitted to a scope makes room instead (conns.take): a replica filled
// with connections that serve no proxy would otherwise refuse every new
// proxy until they time out. A peer is a client IPv4 address or IPv6
// prefix (Options.IPv6PrefixLength).
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
		peer := peerrate.Key(c.RemoteAddr(), l.s.opts.IPv6PrefixLength)
		if !l.s.unauthenticated.Has(peer) {
			l.s.fb.Refuse(model.Key{}, RefusedConnectionPaced)
			_ = c.Close()
			continue
		}
		// Paced before any room is made: a connection the pace refuses
		// evicts nobody.
		if !l.s.connPace.Allow(peer) {
			l.s.fb.Refuse(model.Key{}, RefusedConnectionPaced)
			_ = c.Close()
			continue
		}
		victim, ok := l.s.conns.take(peer)
		if !ok {
			l.s.fb.Refuse(model.Key{}, RefusedConnectionLimit)
			_ = c.Close()
			continue
		}
		if victim != nil {
			_ = victim.Close()
			l.s.fb.Refuse(model.Key{}, RefusedConnectionEvicted)
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
// connections, and those that have not yet carried a stream admitted to a
// scope are kept by peer, oldest first, as the ones to evict; when one of
// them closes, failed spends a failure of its peer's.
type conns struct {
	max, maxPerPeer int
	failed          func(peer string)

	mu     sync.Mutex
	by     map[string]*conn
	open   int
	byPeer map[string]int
	// waiting are the connections not admitted yet, by peer, oldest
	// first: in their TLS or HTTP/2 handshake, without a stream, or whose
	// streams were all refused.
	waiting map[string]*list.List // of *conn
}

func newConns(max, maxPerPeer int, failed func(peer string)) *conns {
	return &conns{max: max, maxPerPeer: maxPerPeer, failed: failed, by: map[string]*conn{}, byPeer: map[string]int{}, waiting: map[string]*list.List{}}
}

// take counts a new connection of peer, making room when the replica or
// the peer holds as many as it may by uncounting a connection not
// admitted yet (the victim, for the caller to close), or reports false
// when there is none it may take:
//   - when peer holds as many as it may, its own oldest;
//   - when the replica does, the oldest of the peer holding the most
//     connections not admitted, if it holds more of them than peer: a peer
//     with few takes from one with many, never the reverse, so that once
//     the replica is full the connections not admitted are shared out
//     evenly between the peers that want them, however many there are.
//
// Connections in their handshake are taken as well: a proxy's handshake
// lasts milliseconds and its stream is admitted at once, while the oldest
// connection of the fullest peer is one that serves nobody.
func (cs *conns) take(peer string) (victim *conn, ok bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	switch {
	case cs.open < cs.max && cs.byPeer[peer] < cs.maxPerPeer:
	case cs.byPeer[peer] >= cs.maxPerPeer:
		if victim = cs.oldest(peer); victim == nil {
			return nil, false
		}
	default:
		if victim = cs.oldest(cs.fullest(peer)); victim == nil {
			return nil, false
		}
	}
	if victim != nil {
		cs.forget(victim)
	}
	cs.open++
	cs.byPeer[peer]++
	return victim, true
}

// fullest is the peer other than peer holding the most connections not
// admitted, more than peer holds (the one whose oldest is oldest among
// equals), or "" when none does.
func (cs *conns) fullest(peer string) string {
	most, victim := cs.waitingOf(peer), ""
	var since time.Time
	for p, l := range cs.waiting {
		n, at := l.Len(), l.Front().Value.(*conn).accepted
		if p != peer && (n > most || n == most && victim != "" && at.Before(since)) {
			most, victim, since = n, p, at
		}
	}
	return victim
}

func (cs *conns) waitingOf(peer string) int {
	if l := cs.waiting[peer]; l != nil {
		return l.Len()
	}
	return 0
}

// oldest is peer's oldest connection not admitted, nil when it has none.
func (cs *conns) oldest(peer string) *conn {
	if l := cs.waiting[peer]; l != nil {
		return l.Front().Value.(*conn)
	}
	return nil
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
	// waiting is the connection's element in its peer's list of
	// connections not admitted, nil once a stream on it was admitted to a
	// scope, once it is uncounted, or for one that is not registered;
	// admitted is set once a stream on it was; counted is set until the
	// connection is uncounted, by its Close or by take.
	waiting  *list.Element
	admitted bool
	counted  bool
	once     sync.Once
	// unread is what the connection read, and written what it wrote, since
	// a stream's handler last took a request read from it (taken). What it
	// read since is a request in assembly, which gRPC holds whole before
	// the handler sees any of it, or one decoded and waiting for the
	// handler; and the client's own frames: its window updates answer
	// what the server wrote, a small part of it, and its pings are few
	// (the server's keepalive enforcement allows one per 10 s). The memory
	// budget ends a proxy's only stream for what it holds (held).
	unread, written atomic.Int64
}

// Read reads from the connection, counting what it read as unread until
// a handler takes a request.
func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.unread.Add(int64(n))
	return n, err
}

// Write writes to the connection, counting what it wrote until a handler
// takes a request.
func (c *conn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// taken records that a stream's handler took a request read from c; c
// may be nil (a connection the server did not register). Bytes of the
// next request read before it are dropped from the count with it: at most
// a stream's receive window (streamWindow), since gRPC grants no more to
// a stream whose handler is not reading.
func (c *conn) taken() {
	if c != nil {
		c.unread.Store(0)
		c.written.Store(0)
	}
}

// windowUpdateShare is the part of what the server wrote that the
// client's window updates for it may take: an update of 13 bytes (with
// TLS's record, about 40) per 16 KiB at the least generous client, a
// four-hundredth; a thirty-second leaves room.
const windowUpdateShare = 5

// held is what c read since a handler last took a request from it, less
// the client's window updates for what it wrote meanwhile; nothing for
// nil.
func (c *conn) held() int64 {
	if c == nil {
		return 0
	}
	return c.unread.Load() - c.written.Load()>>windowUpdateShare
}

// add wraps c (counted for peer by take) so that closing it uncounts it,
// and registers it when its remote address names it alone, as a TCP
// address does (a Unix socket's peers may all be unnamed); a connection it
// cannot register is served, but neither closed for a slow stream nor
// evicted.
func (cs *conns) add(c net.Conn, peer string) net.Conn {
	_, tcp := c.RemoteAddr().(*net.TCPAddr)
	w := &conn{Conn: c, cs: cs, peer: peer, register: tcp, accepted: time.Now(), counted: true}
	if tcp {
		cs.mu.Lock()
		cs.by[c.RemoteAddr().String()] = w
		l := cs.waiting[peer]
		if l == nil {
			l = list.New()
			cs.waiting[peer] = l
		}
		w.waiting = l.PushBack(w)
		cs.mu.Unlock()
	}
	return w
}

// Close closes the connection and uncounts it; a registered one that never
// carried an admitted stream spends a failure of its peer's.
func (c *conn) Close() error {
	c.once.Do(func() {
		c.cs.mu.Lock()
		failed := c.register && !c.admitted
		if c.counted {
			c.cs.forget(c)
		}
		c.cs.mu.Unlock()
		if failed && c.cs.failed != nil {
			c.cs.failed(c.peer)
		}
	})
	return c.Conn.Close()
}

// forget uncounts c and unregisters it; cs.mu is held.
func (cs *conns) forget(c *conn) {
	if c.register && cs.by[c.RemoteAddr().String()] == c {
		delete(cs.by, c.RemoteAddr().String())
	}
	cs.admitted1(c)
	cs.release1(c.peer)
	c.counted = false
}

// admitted marks the connection of the stream whose context is ctx as one
// that carried a stream admitted to a scope: it is no longer evicted.
func (cs *conns) admitted(ctx context.Context) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c := cs.ofLocked(ctx); c != nil {
		c.admitted = true
		cs.admitted1(c)
	}
}

// of is the registered connection of the stream whose context is ctx, nil
// when it has none (a connection ServeListener did not accept, or one
// already closed).
func (cs *conns) of(ctx context.Context) *conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.ofLocked(ctx)
}

// ofLocked is of with cs.mu held.
func (cs *conns) ofLocked(ctx context.Context) *conn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	return cs.by[p.Addr.String()]
}

// admitted1 takes c off its peer's list of connections not admitted.
func (cs *conns) admitted1(c *conn) {
	if c.waiting == nil {
		return
	}
	l := cs.waiting[c.peer]
	l.Remove(c.waiting)
	c.waiting = nil
	if l.Len() == 0 {
		delete(cs.waiting, c.peer)
	}
}

// close closes the connection of the stream whose context is ctx, when the
// server registered it (a TCP connection ServeListener accepted); for any
// other the slow stream is only ended.
func (cs *conns) close(ctx context.Context) {
	if c := cs.of(ctx); c != nil {
		_ = c.Close()
	}
}
