package snapshot

import (
	"testing"
	"time"
)

func TestNextWaitWidensUnderChurnOnly(t *testing.T) {
	const base = 10 * time.Millisecond
	// Changes every 20 ms, each within the widest window of the build
	// before: the wait doubles up to ten times base and stays there.
	wait := nextWait(0, base, time.Hour)
	var got []time.Duration
	for range 6 {
		got = append(got, wait)
		wait = nextWait(wait, base, 20*time.Millisecond)
	}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits under churn %v, want %v ms", got, want)
		}
	}
	// A quiet spell as long as the widest window: back to base.
	if w := nextWait(100*time.Millisecond, base, 100*time.Millisecond); w != base {
		t.Errorf("after a quiet spell the wait is %v, want %v", w, base)
	}
	// No window: never wait.
	if w := nextWait(0, 0, 0); w != 0 {
		t.Errorf("with no window the wait is %v", w)
	}
}
