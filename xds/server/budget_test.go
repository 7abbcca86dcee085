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
// oldest stream of each client holding more than one; proxies holding one
// stream only once no client holds more, and only those whose connection
// holds more than ConnectionHeap of a request in assembly, the most first,
// however far over the heap is.
func TestMemoryBudgetShedsTheLeastProvenFirst(t *testing.T) {
	b := newMemoryBudget(1<<20, func() int { return 0 })
	base := time.Now()
	open := func(client string, admitted bool, age time.Duration, unread int64) *holder {
		c := &conn{}
		c.unread.Store(unread)
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
	greedy := []*holder{open("greedy", true, 3*time.Minute, 0), open("greedy", true, 2*time.Minute, 0), open("greedy", true, time.Minute, 0)}
	idle := open("proxy-idle", true, time.Hour, 0)
	acking := open("proxy-acking", true, time.Second, ConnectionHeap)
	small := open("proxy-small", true, time.Minute, 2<<20)
	large := open("proxy-large", true, time.Hour, 4<<20)
	stranger := open("stranger", false, 0, 0)
	b.shed(1)
	for name, want := range map[string][]bool{
		"stranger (not admitted)": {ended(stranger), true},
		"greedy's oldest":         {ended(greedy[0]), false},
		"greedy's second":         {ended(greedy[1]), true},
		"greedy's newest":         {ended(greedy[2]), true},
		"proxy-large":             {ended(large), false},
		"proxy-small":             {ended(small), false},
	} {
		if want[0] != want[1] {
			t.Errorf("after the first shedding, %s ended: %v, want %v", name, want[0], want[1])
		}
	}
	// Every client holds one stream now: the proxy holding the most goes,
	// its 4 MiB covering the 1 MiB over, whatever its age.
	b.shed(1 << 20)
	if !ended(large) || ended(small) || ended(idle) || ended(acking) || ended(greedy[0]) {
		t.Errorf("after the second shedding: proxy-large ended %v (want true), proxy-small %v, proxy-idle %v, proxy-acking %v, greedy's oldest %v (want false)",
			ended(large), ended(small), ended(idle), ended(acking), ended(greedy[0]))
	}
	// However far over, the proxies that hold no request in assembly
	// larger than a connection's own stay: ending them frees nothing.
	b.shed(1 << 40)
	if !ended(small) || ended(idle) || ended(acking) || ended(greedy[0]) {
		t.Errorf("after the third shedding, 1 TiB over: proxy-small ended %v (want true), proxy-idle %v, proxy-acking %v, greedy's oldest %v (want false)",
			ended(small), ended(idle), ended(acking), ended(greedy[0]))
	}
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

	proxy, err := b.take("proxy", nil)
	if err != nil {
		t.Fatal(err)
	}
	b.admit(proxy)
	// 5,000 connections: the heap grows by what they hold, beyond the
	// budget, and the proxy's stream stays.
	conns = 5000
	step(world + 5000*ConnectionHeap + budget/2)
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
