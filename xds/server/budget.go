package server

import (
	"cmp"
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/model"
)

// RefusedMemoryBudget counts streams refused, or ended, because the
// replica's live heap was above its memory budget (Options.MemoryBudget).
const RefusedMemoryBudget = "MemoryBudget"

// memoryBudgetShare is the part of the Go memory limit (GOMEMLIMIT, which
// the binary derives from the container's limit) that Options.MemoryBudget
// takes when it is not set. The budget is room above the replica's floor
// (its world and its connections, at most --xds-max-connections ×
// ConnectionHeap), so a third leaves, with the chart's 512 MiB, 5,000
// connections and a world of 50 MiB, about 100 MiB of the Go limit for the
// garbage the collector has not yet reclaimed and for what arrives between
// two measures (docs/admission.md, the bound).
const memoryBudgetShare = 1.0 / 3

// ConnectionHeap is the live heap the budget counts for every open
// connection, in its floor: what an idle HTTP/2 connection over TLS holds
// (crypto/tls's records and cipher state, gRPC's transport with no read
// buffer of its own: GRPCOptions), 14 KiB as measured by the hostile suite
// (TestConnectionHeapIsWhatTheBudgetCounts). A plaintext connection holds
// about 2 KiB: the rest is room for clients.
const ConnectionHeap = 16 << 10

// memoryBudgetTick is how often the budget measures the live heap, and
// memoryBudgetSettle how long it waits after ending streams before it
// decides again: the streams' handlers and gRPC's transport give back what
// they held over that time, not at once.
const (
	memoryBudgetTick   = 50 * time.Millisecond
	memoryBudgetSettle = time.Second
)

// weighEvery is how much of the proxies' sampling the budget weighs them
// on, and how often it does while nothing else decides, and minSamples how
// many samples a weighing needs of a proxy: a request that arrives crosses
// ConnectionHeap for as long as it takes to, a few samples, while one held
// (stalled, or finished only to start the next) stays above it for most
// of them.
const (
	weighEvery = time.Second
	minSamples = int(weighEvery / memoryBudgetTick / 2)
)

// recollectEvery is how often, at most, a weighing due runs a collection
// of its own to see whether the heap came back: the runtime's own come as
// the replica allocates, and a replica holding over its budget that
// allocates nothing would otherwise refuse new streams on a stale reading
// until the runtime's two-minute one.
const recollectEvery = 10 * time.Second

// memoryBudget keeps what clients make the replica hold within
// Options.MemoryBudget of live heap above the replica's floor: what it
// holds whatever its streams do, its world (catalog and snapshots) and its
// open connections (bounded by their own limits, and evicted by their own
// rules: ending a stream frees none of it). gRPC assembles a request whole
// before the handler sees any of it, and offers no way to refuse the bytes
// of one stream before they are allocated, so what the budget measures is
// the live heap itself (every byte the replica holds, whoever made it), less
// the floor, and what it controls is which streams may go on holding it:
//
//   - while the live heap is above the floor plus the budget, a new stream
//     is refused before anything it sends is read (take): the newest work
//     goes first;
//   - and streams are ended, the least proven first (shed): every stream
//     not yet admitted to a scope (still waiting for or reading its first
//     request); then every stream but the oldest of each client (identity
//     at one address) holding more than one, and of each connection
//     carrying streams of more than one client. A proxy holding one
//     stream, alone on its connection, is ended only when nothing else is
//     left, and only for what it holds: what its connection read since its
//     handler last took a request, beyond the window updates for what the
//     server wrote (conn.held), sampled at every tick while the heap is
//     over; a proxy above ConnectionHeap at more than half of its samples
//     (the last second's, weighEvery, and half a second's at least) is
//     ended, the most on average first. That is a
//     request in assembly or one waiting for its handler, which ending the
//     stream gives back; a proxy that sends nothing but its ACKs holds
//     none for longer than an ACK takes to arrive (or waits for a handler
//     busy sending), and ending it would free nothing.
//
// The floor is the world measured once the first build is served (the
// live heap then, less its connections: streams are refused before it) and
// again whenever neither a stream nor a connection is open, when nothing a
// client sent is held (a connection's handshake holds more than
// ConnectionHeap, so one in progress would count as world), plus
// ConnectionHeap for each connection open now. An admitted proxy's
// push is never refused: the budget only ends streams and refuses new ones.
type memoryBudget struct {
	budget int64
	read   func() (live, objects, cycles uint64)
	gc     func()
	conns  func() int

	over  atomic.Bool
	world atomic.Int64 // the world's live heap, in the floor

	mu      sync.Mutex
	streams map[*holder]struct{}
}

// holder is one stream as the budget sees it, on its connection (nil when
// the server did not register it); shed is closed to end it.
type holder struct {
	client string
	conn   *conn
	opened time.Time
	shed   chan struct{}

	// Guarded by memoryBudget.mu: admitted is set once the stream is
	// admitted to a scope; held is what its connection held at the last
	// samples ticks that sampled it, at most len(held), the latest at
	// held[(samples-1)%len(held)].
	admitted bool
	held     [2 * minSamples]int64
	samples  int
}

// newMemoryBudget returns the budget of budget bytes of live heap above
// the floor (none when budget is zero or less), counting conns() open
// connections in the floor.
func newMemoryBudget(budget int64, conns func() int) *memoryBudget {
	return &memoryBudget{budget: budget, read: readHeap, gc: runtime.GC, conns: conns, streams: map[*holder]struct{}{}}
}

// defaultMemoryBudget is memoryBudgetShare of the Go memory limit, or zero
// (no budget) when the process has none.
func defaultMemoryBudget() int64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return 0
	}
	return int64(float64(limit) * memoryBudgetShare)
}

var heapSamples = []string{"/gc/heap/live:bytes", "/memory/classes/heap/objects:bytes", "/gc/cycles/total:gc-cycles"}

// readHeap is the live heap as of the last collection, the heap's objects
// now (live and not yet collected), and how many collections ran.
func readHeap() (live, objects, cycles uint64) {
	s := make([]metrics.Sample, len(heapSamples))
	for i, name := range heapSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
}

// floor is what the replica holds whatever its streams do: its world and
// ConnectionHeap for each open connection.
func (b *memoryBudget) floor() int64 {
	return b.world.Load() + int64(b.conns())*ConnectionHeap
}

// measureWorld sets the world to the live heap less the open connections,
// after a collection.
func (b *memoryBudget) measureWorld() {
	b.gc()
	live, _, _ := b.read()
	b.world.Store(max(0, int64(live)-int64(b.conns())*ConnectionHeap))
}

// run measures the world once ready is closed (the first build is
// served), then the heap every memoryBudgetTick until ctx ends. The heap's
// objects are read first, which costs nothing: while they are within the
// floor and the budget, so is what is live. Above it, what is live is what
// counts, and it is known only after a collection: the runtime's own are
// used, and one is run only when the heap grew by an eighth of the budget
// since the last decision without one, or when a weighing of the proxies
// is due and none ran for recollectEvery, so that a heap that only holds
// garbage above the budget does not make the replica collect on every
// tick. While the objects are above, every tick samples what each proxy's
// connection holds (sample), for the weighings. After streams are ended, what they held is given back over a while
// (memoryBudgetSettle), into gRPC's buffer pools, which the runtime empties
// only over two collections: the next decision waits for both, so that the
// same bytes are not counted twice and more streams ended for them. New
// streams stay refused meanwhile. A decision that finds neither a stream
// nor a connection open measures the world again.
func (b *memoryBudget) run(ctx context.Context, ready <-chan struct{}) {
	if b.budget <= 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-ready:
	}
	b.measureWorld()
	t := time.NewTicker(memoryBudgetTick)
	defer t.Stop()
	var d decisions
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.tick(&d, time.Now())
	}
}

// decisions is what run remembers between two ticks.
type decisions struct {
	seen, settled uint64    // the collections at the last decision; the one to wait for
	settling      time.Time // no decision before it
	measured      uint64    // the heap's objects at the last decision
	live          uint64    // the live heap at the last decision
	collected     time.Time // when the last decision read it
	weigh         time.Time // when set, a decision is due then, on the last live heap if it is recent
	sampled       bool      // whether the proxies hold samples of the heap's present time over
}

// tick reads the heap at now and decides (run).
func (b *memoryBudget) tick(d *decisions, now time.Time) {
	live, objects, cycles := b.read()
	if int64(objects) <= b.floor()+b.budget {
		b.over.Store(false)
		d.weigh = time.Time{}
		if d.sampled {
			b.forget()
			d.sampled = false
		}
		return
	}
	b.sample()
	d.sampled = true
	if now.Before(d.settling) {
		return
	}
	weigh := !d.weigh.IsZero() && !now.Before(d.weigh)
	fresh := cycles != d.seen || cycles < d.settled || int64(objects-min(objects, d.measured)) >= b.budget/8 ||
		weigh && now.Sub(d.collected) >= recollectEvery
	if !fresh && !weigh {
		// Nothing new to decide on: no collection since the last
		// decision, the heap grew by little since, and no weighing due.
		return
	}
	if fresh {
		d.collected = now
		for cycles == d.seen || cycles < d.settled {
			b.gc()
			live, objects, cycles = b.read()
		}
		d.seen, d.measured, d.live = cycles, objects, live
		if b.open() == 0 && b.conns() == 0 {
			b.world.Store(max(0, int64(live)-int64(b.conns())*ConnectionHeap))
		}
	} else {
		// A weighing due with nothing new: it needs the samples, not
		// another collection, and the last live heap, recent, stands.
		live = d.live
	}
	d.weigh = time.Time{}
	over := int64(live) - b.floor() - b.budget
	b.over.Store(over > 0)
	if over <= 0 {
		return
	}
	switch ended, weighed := b.shed(over); {
	case ended:
		d.settled, d.settling = cycles+2, now.Add(memoryBudgetSettle)
	case weighed:
		// Nothing to end yet: weigh again a second later, whether or not
		// the heap moves.
		d.weigh = now.Add(weighEvery)
	}
}

// forget drops the proxies' samples: the heap is back under the budget,
// and a weighing is on the samples of the time it is over.
func (b *memoryBudget) forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for h := range b.streams {
		h.samples = 0
	}
}

// sample records what the connection of each admitted stream holds (see
// holder).
func (b *memoryBudget) sample() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for h := range b.streams {
		if h.admitted {
			h.held[h.samples%len(h.held)] = h.conn.held()
			h.samples++
		}
	}
}

// open is how many streams the budget holds.
func (b *memoryBudget) open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.streams)
}

// take registers a new stream of client on c, or refuses it while the
// heap is above the budget.
func (b *memoryBudget) take(client string, c *conn) (*holder, error) {
	if b.budget > 0 && b.over.Load() {
		return nil, b.refusal()
	}
	h := &holder{client: client, conn: c, opened: time.Now(), shed: make(chan struct{})}
	b.mu.Lock()
	b.streams[h] = struct{}{}
	b.mu.Unlock()
	return h, nil
}

// admit records that h's stream was admitted to a scope.
func (b *memoryBudget) admit(h *holder) {
	b.mu.Lock()
	h.admitted = true
	b.mu.Unlock()
}

// release forgets h's stream.
func (b *memoryBudget) release(h *holder) {
	b.mu.Lock()
	delete(b.streams, h)
	b.mu.Unlock()
}

// shed ends streams, the least proven first (see memoryBudget): every
// stream not yet admitted; then all but the oldest stream of each client
// holding more than one, and of each connection carrying streams of more
// than one client (whose bytes cannot be told apart, and which a proxy
// does not do); and only when nothing of that is left, the proxies that
// hold a request (holders), the most first, until what they hold covers
// over. Cutting whole clients and connections down rather than counting
// what each stream holds is what keeps up with streams that all fill at
// once: the next measure decides whether more must go. Proxies holding one
// stream each are what the replica is for: one is ended only for the
// bytes it sends, never for what is over because the streams already
// ended have not given theirs back yet, or because the world grew.
func (b *memoryBudget) shed(over int64) (ended, weighed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var victims, admitted []*holder
	for h := range b.streams {
		if h.admitted {
			admitted = append(admitted, h)
		} else {
			victims = append(victims, h)
		}
	}
	kept := admitted[:0]
	for _, hs := range groupBy(admitted, func(h *holder) string { return h.client }) {
		victims = append(victims, hs[:len(hs)-1]...)
		kept = append(kept, hs[len(hs)-1])
	}
	var singles []*holder
	for _, hs := range groupBy(kept, func(h *holder) *conn { return h.conn }) {
		if hs[0].conn == nil {
			singles = append(singles, hs...)
			continue
		}
		victims = append(victims, hs[:len(hs)-1]...)
		singles = append(singles, hs[len(hs)-1])
	}
	if len(victims) == 0 {
		victims, weighed = holders(singles, over), true
	}
	for _, h := range victims {
		delete(b.streams, h)
		close(h.shed)
	}
	return len(victims) > 0, weighed
}

// groupBy groups hs by key, each group the newest first.
func groupBy[K comparable](hs []*holder, key func(*holder) K) map[K][]*holder {
	groups := map[K][]*holder{}
	for _, h := range hs {
		groups[key(h)] = append(groups[key(h)], h)
	}
	for _, g := range groups {
		slices.SortFunc(g, func(x, y *holder) int { return y.opened.Compare(x.opened) })
	}
	return groups
}

// holders weighs the proxies of one stream each, alone on their
// connections, on their last samples: those sampled at least minSamples
// times, above ConnectionHeap at most of them, the most on average first,
// until what they held on average covers over. Below the threshold at
// most samples, a proxy holds at most ConnectionHeap for most of the time,
// and a request for the rest. memoryBudget.mu is held.
func holders(singles []*holder, over int64) []*holder {
	type weighed struct {
		h    *holder
		mean int64
	}
	var held []weighed
	for _, h := range singles {
		n := min(h.samples, len(h.held))
		if n < minSamples {
			continue
		}
		above, sum := 0, int64(0)
		for _, v := range h.held[:n] {
			if v > ConnectionHeap {
				above++
			}
			sum += max(v, 0)
		}
		if 2*above > n {
			held = append(held, weighed{h, sum / int64(n)})
		}
	}
	slices.SortFunc(held, func(x, y weighed) int { return cmp.Compare(y.mean, x.mean) })
	var victims []*holder
	for _, w := range held {
		if over <= 0 {
			break
		}
		victims = append(victims, w.h)
		over -= w.mean
	}
	return victims
}

// refusal is the status of a stream refused or ended by the budget.
func (b *memoryBudget) refusal() error {
	return status.Errorf(codes.ResourceExhausted,
		"this replica holds as much memory as it may for its clients (%d MiB of live heap above the %d MiB it holds for its world and its %d connections, --xds-memory-budget): the newest streams and those of the clients holding the most are refused or ended first; reconnect with backoff, or give the replica more memory",
		b.budget>>20, b.floor()>>20, b.conns())
}

// shedError counts and returns the status of a stream the budget ended.
func (s *Server) shedError() error {
	s.fb.Refuse(model.Key{}, RefusedMemoryBudget)
	return s.budget.refusal()
}
