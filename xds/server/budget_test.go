package server

import (
	"testing"
	"time"
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
// held more than ConnectionHeap beyond what the server wrote to it, at two
// decisions in a row with no request taken between them, the most first,
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
	acking := open("proxy-acking", connection(20<<10, 0), true, time.Second)
	answering := open("proxy-answering", connection(100<<10, 100<<10), true, time.Second)
	small := open("proxy-small", connection(2<<20, 0), true, time.Minute)
	large := open("proxy-large", connection(4<<20, 0), true, time.Hour)
	stranger := open("stranger", connection(4<<20, 0), false, 0)
	check := func(when string, want map[*holder]bool) {
		t.Helper()
		names := map[*holder]string{stranger: "stranger", greedy[0]: "greedy's oldest", greedy[1]: "greedy's second", greedy[2]: "greedy's newest",
			shared[0]: "the shared connection's oldest", shared[1]: "the shared connection's newest", idle: "proxy-idle", acking: "proxy-acking",
			answering: "proxy-answering", small: "proxy-small", large: "proxy-large"}
		for h, name := range names {
			if ended(h) != want[h] {
				t.Errorf("%s, %s ended: %v, want %v", when, name, ended(h), want[h])
			}
		}
	}
	want := map[*holder]bool{stranger: true, greedy[1]: true, greedy[2]: true, shared[1]: true}
	b.shed(1)
	check("after the first shedding", want)
	// Every client holds one stream, alone on its connection, now: the
	// first weighing of the proxies ends none of them.
	b.shed(1 << 20)
	check("after the first weighing", want)
	// proxy-acking's request arrived and was taken, and another is on its
	// way: the second weighing finds the proxy holding the most that held
	// at the first, its 4 MiB covering the 1 MiB over.
	acking.conn.taken()
	acking.conn.unread.Store(20 << 10)
	b.shed(1 << 20)
	want[large] = true
	check("after the second weighing", want)
	// However far over, the proxies that send nothing, whose request was
	// taken since, or whose bytes answer what the server wrote stay:
	// ending them frees nothing.
	acking.conn.taken()
	b.shed(1 << 40)
	want[small] = true
	check("after the third weighing, 1 TiB over", want)
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
	// took the connections' heap for its clients' would end it at its
	// second decision.
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
	step(world + 5000*ConnectionHeap + budget/2)
	step(world + 5000*ConnectionHeap + budget/2 + budget/4)
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
