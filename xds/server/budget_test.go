package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/scopeplane/scopeplane/internal/testkit"
)

// ended reports whether the budget ended h's stream.
func ended(h *holder) bool {
	select {
	case <-h.shed:
		return true
	default:
		return false
	}
}

// TestMemoryBudgetShedsTheLeastProvenFirst checks the order in which the
// budget ends streams: every stream not yet admitted, then all but the
// oldest stream of each client holding more than one and of each
// connection carrying several clients' streams; proxies holding one
// stream only once nothing else is left, and only those whose connection
// held more than ConnectionHeap (less the window updates for what the
// server wrote) at most of their samples, the most on average first,
// however far over the heap is.
func TestMemoryBudgetShedsTheLeastProvenFirst(t *testing.T) {
	b := newMemoryBudget(1<<20, func() int { return 0 })
	base := time.Now()
	open := func(client string, c *conn, admitted bool, age time.Duration) *holder {
		h, err := b.take(client, c)
		if err != nil {
			t.Fatal(err)
		}
		h.opened = base.Add(-age)
		if admitted {
			b.admit(h)
		}
		return h
	}
	// connection is one of its own, which read unread and wrote written
	// since a handler last took a request from it.
	connection := func(unread, written int64) *conn {
		c := &conn{}
		c.unread.Store(unread)
		c.written.Store(written)
		return c
	}
	greedyConn, sharedConn := connection(0, 0), connection(0, 0)
	greedy := []*holder{open("greedy", greedyConn, true, 3*time.Minute), open("greedy", greedyConn, true, 2*time.Minute), open("greedy", greedyConn, true, time.Minute)}
	shared := []*holder{open("token-x", sharedConn, true, 2*time.Minute), open("anonymous-y", sharedConn, true, time.Minute)}
	idle := open("proxy-idle", connection(0, 0), true, time.Hour)
	acking := open("proxy-acking", connection(0, 0), true, time.Second)
	cycling := open("proxy-cycling", connection(0, 0), true, time.Second)
	answered := open("proxy-answered", connection(20<<10, 1<<20), true, time.Second)
	small := open("proxy-small", connection(2<<20, 0), true, time.Minute)
	large := open("proxy-large", connection(4<<20, 0), true, time.Hour)
	stranger := open("stranger", connection(4<<20, 0), false, 0)
	names := map[*holder]string{stranger: "stranger", greedy[0]: "greedy's oldest", greedy[1]: "greedy's second", greedy[2]: "greedy's newest",
		shared[0]: "the shared connection's oldest", shared[1]: "the shared connection's newest", idle: "proxy-idle", acking: "proxy-acking",
		cycling: "proxy-cycling", answered: "proxy-answered", small: "proxy-small", large: "proxy-large"}
	check := func(when string, want map[*holder]bool) {
		t.Helper()
		for h, name := range names {
			if ended(h) != want[h] {
				t.Errorf("%s, %s ended: %v, want %v", when, name, ended(h), want[h])
			}
		}
	}
	// samples has the ticks of a second sample the connections: proxy-acking
	// has a 20 KiB ACK arriving at two of them; proxy-cycling sends 4 MB
	// requests, each taken once whole, one after the other.
	samples := func() {
		for i := range 2 * minSamples {
			acking.conn.unread.Store(0)
			if i < 2 {
				acking.conn.unread.Store(20 << 10)
			}
			cycling.conn.unread.Store(int64(i%10) * 400 << 10)
			b.sample()
		}
	}
	want := map[*holder]bool{stranger: true, greedy[1]: true, greedy[2]: true, shared[1]: true}
	if ended, weighed := b.shed(1); !ended || weighed {
		t.Errorf("the first shedding: ended %v (want true), weighed the proxies %v (want false)", ended, weighed)
	}
	check("after the first shedding", want)
	// Every client holds one stream, alone on its connection, now: with
	// too few samples, weighing the proxies ends none of them.
	b.sample()
	if ended, weighed := b.shed(1 << 20); ended || !weighed {
		t.Errorf("the weighing without samples: ended %v (want false), weighed %v (want true)", ended, weighed)
	}
	check("after the weighing without samples", want)
	// A second's samples: the proxy holding the most on average goes, its
	// 4 MiB covering the 1 MiB over.
	samples()
	b.shed(1 << 20)
	want[large] = true
	check("after the first weighing", want)
	// However far over, the proxies that send nothing, whose ACK arrived,
	// or whose bytes are the window updates for what the server wrote
	// stay: ending them frees nothing. The one cycling requests goes.
	samples()
	b.shed(1 << 40)
	want[small], want[cycling] = true, true
	check("after the second weighing, 1 TiB over", want)
	b.over.Store(true)
	if _, err := b.take("late", nil); err == nil {
		t.Error("a new stream was taken while the heap is over the budget")
	}
}

// TestMemoryBudgetCountsItsFloor checks what the budget is room above:
// the world as measured once the first build is served, and each open
// connection as ConnectionHeap. A heap that grows by what connections hold
// ends no stream (ending one frees none of it), and neither does a world
// that grew while no stream was open; what streams add beyond the budget
// does.
func TestMemoryBudgetCountsItsFloor(t *testing.T) {
	const (
		world  = 50 << 20
		budget = 100 << 20
	)
	conns := 0
	var live, cycles uint64 = world, 1
	b := newMemoryBudget(budget, func() int { return conns })
	b.read = func() (uint64, uint64, uint64) { return live, live, cycles }
	b.gc = func() { cycles++ }
	b.measureWorld()
	if got := b.world.Load(); got != world {
		t.Fatalf("the world measured %d bytes, want %d", got, world)
	}
	var d decisions
	now := time.Now()
	step := func(heap uint64) {
		live = heap
		now = now.Add(2 * memoryBudgetSettle)
		b.tick(&d, now)
	}

	// A connection open, no stream: what grew may be its handshake, and is
	// not taken for the world.
	conns = 1
	step(world + 2*budget)
	if !b.over.Load() || b.world.Load() != world {
		t.Fatalf("a heap grown with a connection open: over %v (want true), world %d MiB (want %d)", b.over.Load(), b.world.Load()>>20, world>>20)
	}
	conns = 0
	d = decisions{}

	// No stream or connection open: a world that grew is measured again,
	// not shed.
	step(world + 2*budget)
	if b.over.Load() || b.world.Load() != world+2*budget {
		t.Fatalf("a world grown with no stream open: over %v, world %d MiB, want not over and %d MiB", b.over.Load(), b.world.Load()>>20, (world+2*budget)>>20)
	}
	step(world)
	b.measureWorld()

	// A proxy whose connection holds a request of 8 MiB: a budget that
	// took the connections' heap for its clients' would end it once it
	// sampled it enough.
	pc := &conn{}
	pc.unread.Store(8 << 20)
	proxy, err := b.take("proxy", pc)
	if err != nil {
		t.Fatal(err)
	}
	b.admit(proxy)
	// 5,000 connections: the heap grows by what they hold, beyond the
	// budget, and the proxy's stream stays.
	conns = 5000
	live = world + 5000*ConnectionHeap + budget/2
	for range 4 * minSamples {
		now = now.Add(memoryBudgetTick)
		b.tick(&d, now)
	}
	if b.over.Load() || ended(proxy) {
		t.Fatalf("with 5,000 connections open the budget is over: %v, the proxy's stream ended: %v", b.over.Load(), ended(proxy))
	}
	// What streams add beyond the budget is refused, and shed.
	stranger, err := b.take("stranger", nil)
	if err != nil {
		t.Fatal(err)
	}
	step(world + 5000*ConnectionHeap + budget + 1<<20)
	if !b.over.Load() || !ended(stranger) || ended(proxy) {
		t.Fatalf("1 MiB over the budget: over %v (want true), the unadmitted stream ended %v (want true), the proxy's %v (want false)", b.over.Load(), ended(stranger), ended(proxy))
	}
	if _, err := b.take("late", nil); err == nil {
		t.Error("a new stream was taken while the heap is over the budget")
	}
}

// oneRequest is a stream that receives one request, then blocks until
// its context ends.
type oneRequest struct {
	ctx  context.Context
	sent bool
}

func (s *oneRequest) Recv() (int, error) {
	if !s.sent {
		s.sent = true
		return 1, nil
	}
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

// TestRecvCountsARequestUntilTheHandlerTakesIt checks that what the
// budget counts a connection holding ends only once the handler took the
// request, not once it was decoded: a decoded request waiting for a
// handler that does not take it (one blocked on a proxy that does not
// read) is held as much as one in assembly.
func TestRecvCountsARequestUntilTheHandlerTakesIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &conn{}
	c.unread.Store(4 << 20)
	reqs, _ := recv[int](ctx, &oneRequest{ctx: ctx}, func(error) {}, c.taken)
	time.Sleep(100 * time.Millisecond) // the request decoded, and waiting
	if got := c.held(); got != 4<<20 {
		t.Fatalf("before the handler took the request, the connection holds %d bytes, want %d", got, 4<<20)
	}
	<-reqs
	testkit.Eventually(t, "the count ended once the handler took the request", func() (bool, string) {
		return c.held() == 0, fmt.Sprint(c.held())
	})
}

// TestMemoryBudgetWeighsUnderFrequentCollections checks that the budget
// ends a proxy holding a stalled request while the runtime collects more
// often than the budget weighs (an allocating replica near its Go limit,
// or the attack's own garbage): every collection is a decision, and none
// may throw away the samples the weighing needs.
func TestMemoryBudgetWeighsUnderFrequentCollections(t *testing.T) {
	const budget = 100 << 20
	var live, cycles uint64 = 50 << 20, 1
	b := newMemoryBudget(budget, func() int { return 1 })
	b.read = func() (uint64, uint64, uint64) { return live, live, cycles }
	b.gc = func() { cycles++ }
	b.measureWorld()
	stalled := &conn{}
	stalled.unread.Store(8 << 20)
	proxy, err := b.take("proxy", stalled)
	if err != nil {
		t.Fatal(err)
	}
	b.admit(proxy)
	live += budget + 8<<20
	var d decisions
	now := time.Now()
	for i := range 20 * minSamples {
		if i%4 == 0 {
			cycles++ // the runtime collects every 200 ms
		}
		now = now.Add(memoryBudgetTick)
		b.tick(&d, now)
		if ended(proxy) {
			return
		}
	}
	t.Fatalf("the proxy holding a stalled 8 MiB request was not ended in %d ticks of a heap 8 MiB over, collected every 4 ticks", 20*minSamples)
}
