package server

import (
	"testing"
	"time"
)

// TestMemoryBudgetShedsTheLeastProvenFirst checks the order in which the
// budget ends streams: every stream not yet admitted, then all but the
// oldest stream of each client holding more than one; proxies holding one
// stream only once no client holds more, the newest first.
func TestMemoryBudgetShedsTheLeastProvenFirst(t *testing.T) {
	b := newMemoryBudget(1<<20, 4<<20)
	base := time.Now()
	open := func(client string, admitted bool, age time.Duration) *holder {
		h, err := b.take(client)
		if err != nil {
			t.Fatal(err)
		}
		h.opened = base.Add(-age)
		if admitted {
			b.admit(h)
		}
		return h
	}
	greedy := []*holder{open("greedy", true, 3*time.Minute), open("greedy", true, 2*time.Minute), open("greedy", true, time.Minute)}
	older, newer := open("proxy-a", true, time.Hour), open("proxy-b", true, time.Second)
	stranger := open("stranger", false, 0)
	ended := func(h *holder) bool {
		select {
		case <-h.shed:
			return true
		default:
			return false
		}
	}
	b.shed(1)
	for name, want := range map[string][]bool{
		"stranger (not admitted)": {ended(stranger), true},
		"greedy's oldest":         {ended(greedy[0]), false},
		"greedy's second":         {ended(greedy[1]), true},
		"greedy's newest":         {ended(greedy[2]), true},
		"proxy-a":                 {ended(older), false},
		"proxy-b":                 {ended(newer), false},
	} {
		if want[0] != want[1] {
			t.Errorf("after the first shedding, %s ended: %v, want %v", name, want[0], want[1])
		}
	}
	// Every client holds one stream now: the newest goes, one stream's
	// worth (4 MiB) covering the 1 MiB over.
	b.shed(1 << 20)
	if !ended(newer) || ended(older) || ended(greedy[0]) {
		t.Errorf("after the second shedding: proxy-b ended %v (want true), proxy-a %v, greedy's oldest %v (want false)", ended(newer), ended(older), ended(greedy[0]))
	}
	b.over.Store(true)
	if _, err := b.take("late"); err == nil {
		t.Error("a new stream was taken while the heap is over the budget")
	}
}
