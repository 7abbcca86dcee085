package shardwatch

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
)

// presence is when each shard was last seen with a leader, on this
// replica's clock: a Lease's renewTime is the holder's clock, so, as
// client-go's elector does, a Lease counts as renewed when this replica sees
// it change, and as held for the duration its holder promised from then.
type presence struct {
	shards   []seen
	observed time.Time // the last look at the Leases
}

// seen is what is known of one shard's Lease.
type seen struct {
	holder  string
	renew   time.Time // the Lease's renewTime, as its holder wrote it
	changed time.Time // when this replica saw holder or renew change
	held    time.Duration
	// aliveAt is when the shard last had a leader, or will have had at
	// least (the end of its Lease's duration); a shard never seen counts
	// from this replica's start, so that a new leader judges no shard
	// before it could have seen its Lease renewed.
	aliveAt time.Time
	// gone says the shard was last found absent (for the log).
	gone bool
	// unread says its Lease could not be read at the last look: nothing
	// is known, and the shard is not judged absent until it is read.
	unread bool
}

func newPresence(start time.Time, shards int) *presence {
	p := &presence{shards: make([]seen, shards)}
	for k := range p.shards {
		p.shards[k].aliveAt = start
	}
	return p
}

// saw records shard k's Lease l (nil when it does not exist) at now; unread
// says it could not be read: absence is judged only on what a Lease says.
func (p *presence) saw(k int, l *coordinationv1.Lease, now time.Time, unread bool) {
	s := &p.shards[k]
	s.unread = unread
	switch {
	case unread:
	case l == nil:
		// No Lease: the shard never had a leader, or its Lease was
		// deleted.
		s.holder, s.renew = "", time.Time{}
		s.aliveAt = earliest(s.aliveAt, now)
	default:
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		var renew time.Time
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.Time
		}
		if holder != s.holder || !renew.Equal(s.renew) || s.changed.IsZero() {
			s.holder, s.renew, s.changed = holder, renew, now
		}
		s.held = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
		// Held until the duration its holder promised is over, seen from
		// the change; a leader that steps down empties holderIdentity
		// (client-go's ReleaseOnCancel): from then, no one holds it.
		if s.holder == "" {
			s.aliveAt = earliest(s.aliveAt, now)
		} else {
			s.aliveAt = latest(s.aliveAt, s.changed.Add(s.held))
		}
	}
}

// earliest is the earlier of a and b, latest the later.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// absent reports whether shard k has had no leader for after, at now.
func (p *presence) absent(k int, now time.Time, after time.Duration) bool {
	s := &p.shards[k]
	if s.unread || now.Sub(s.aliveAt) < after {
		return false
	}
	s.gone = true
	return true
}
