package shardwatch

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// lease is a Lease held by holder (none when empty), renewed at renew, for
// 15 s.
func lease(holder string, renew time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &metav1.MicroTime{Time: renew}}}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
	}
	return l
}

// TestPresence judges shards by their Leases as they are seen, on this
// replica's clock: a renewed Lease is a leader; a Lease no longer renewed
// is one for the duration its holder promised, and the shard is absent
// only once it has had none for the wait; a Lease given up or missing is
// none; while a Lease cannot be read its shard is not judged. The holder's
// clock (renewTime) is only compared with itself.
func TestPresence(t *testing.T) {
	const after = 30 * time.Second
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	skewed := t0.Add(-time.Hour) // the holder's clock, an hour behind
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	renewedEvery := func(from, to, step int, holder string) map[int]*coordinationv1.Lease {
		m := map[int]*coordinationv1.Lease{}
		for s := from; s <= to; s += step {
			m[s] = lease(holder, skewed.Add(time.Duration(s)*time.Second))
		}
		return m
	}
	for _, tc := range []struct {
		name string
		// seen holds shard 1's Lease as read at each second (nil:
		// missing), and unread the seconds it could not be read.
		seen   map[int]*coordinationv1.Lease
		unread []int
		// absent are the seconds, of 0 to 120, when shard 1 is absent.
		absent [][2]int
	}{
		{name: "renewed every 2 s", seen: renewedEvery(0, 120, 2, "a")},
		// Read at 0, 10 and 40, renewed at 10 only: held until 10+15,
		// absent from 25+30.
		{name: "its holder crashed", seen: map[int]*coordinationv1.Lease{0: lease("a", skewed), 10: lease("a", skewed.Add(2*time.Second)), 40: lease("a", skewed.Add(2*time.Second))},
			absent: [][2]int{{55, 120}}},
		// Held for its duration from 0, given up at 5: absent from
		// 5+30.
		{name: "given up", seen: map[int]*coordinationv1.Lease{0: lease("a", skewed), 5: lease("", skewed.Add(5*time.Second))}, absent: [][2]int{{35, 120}}},
		{name: "given up, and taken by a new replica within the wait", seen: func() map[int]*coordinationv1.Lease {
			m := renewedEvery(20, 120, 10, "b")
			m[0], m[5] = lease("a", skewed), lease("", skewed.Add(5*time.Second))
			return m
		}()},
		{name: "never created: counted from this replica's start", seen: map[int]*coordinationv1.Lease{0: nil, 60: nil}, absent: [][2]int{{30, 120}}},
		// Given up before 0; unreadable at 40: not judged until read again
		// at 50, and absent since 0 all along.
		{name: "unreadable for a while: not judged then", seen: map[int]*coordinationv1.Lease{0: lease("", skewed), 50: lease("", skewed)}, unread: []int{40},
			absent: [][2]int{{30, 39}, {50, 120}}},
		// A holder that promised no duration holds it for none past the
		// renewal seen.
		{name: "no duration", seen: func() map[int]*coordinationv1.Lease {
			l := lease("a", skewed)
			l.Spec.LeaseDurationSeconds = nil
			return map[int]*coordinationv1.Lease{0: l, 10: l, 60: l}
		}(), absent: [][2]int{{30, 120}}},
		// Deleted while held: none from then.
		{name: "deleted while held", seen: map[int]*coordinationv1.Lease{0: lease("a", skewed), 2: lease("a", skewed.Add(2*time.Second)), 4: nil}, absent: [][2]int{{34, 120}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPresence(t0, 2)
			for s := 0; s <= 120; s++ {
				if l, ok := tc.seen[s]; ok {
					p.saw(1, l, at(s), false)
				}
				for _, u := range tc.unread {
					if u == s {
						p.saw(1, nil, at(s), true)
					}
				}
				want := false
				for _, r := range tc.absent {
					want = want || r[0] <= s && s <= r[1]
				}
				if got := p.absent(1, at(s), after); got != want {
					t.Fatalf("at %d s shard 1 absent: %v, want %v", s, got, want)
				}
			}
		})
	}
}
