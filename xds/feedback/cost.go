package feedback

import "time"

// The cost window: what a scope's proxies were sent, and what the other
// protocol would have sent them, over the last CostBuckets complete
// buckets (by default of DefaultCostBucket: one hour in minutes). Only
// complete buckets are reported, so the figures move once a bucket, not
// with every push.
const (
	DefaultCostBucket = time.Minute
	CostBuckets       = 60
)

// Push is one response sent to a proxy, priced in both protocols.
type Push struct {
	// Resources and Bytes are what the response carried; both are zero for
	// a change only the other protocol sends (a SotW by-name removal).
	Resources, Bytes int
	// OtherBytes is what the other protocol would have sent the same proxy
	// for the same change (zero when it would have sent nothing).
	OtherBytes int
	// Connect marks a stream's first response of a type: an initial sync or
	// a reconnect.
	Connect bool
}

// Cost sums what was sent to a scope's proxies and what the other protocol
// would have sent.
type Cost struct {
	// Pushes counts responses sent; Bytes and OtherBytes include connects.
	Pushes, Bytes, OtherBytes int64
	// Connects counts streams' first responses per type, and ConnectBytes
	// and ConnectOtherBytes are their part of the bytes.
	Connects, ConnectBytes, ConnectOtherBytes int64
	// NACKs counts rejected responses; HeldBack and OtherHeldBack the
	// resources they kept from proxies, here and in the other protocol.
	NACKs, HeldBack, OtherHeldBack int64
}

func (c *Cost) add(o *Cost) {
	c.Pushes += o.Pushes
	c.Bytes += o.Bytes
	c.OtherBytes += o.OtherBytes
	c.Connects += o.Connects
	c.ConnectBytes += o.ConnectBytes
	c.ConnectOtherBytes += o.ConnectOtherBytes
	c.NACKs += o.NACKs
	c.HeldBack += o.HeldBack
	c.OtherHeldBack += o.OtherHeldBack
}

// CostWindow is a scope's cost over its window.
type CostWindow struct {
	Cost
	// Span is how much time the figures cover: complete buckets since the
	// scope was first served to a proxy, at most CostBuckets of them.
	Span time.Duration
	// Bucket is the width of one bucket: the figures move once a Bucket.
	Bucket time.Duration
	// Pending is set when the current bucket, not complete yet, holds
	// something: the figures change when it completes, even if nothing
	// else happens by then.
	Pending bool
}

// costRing is a scope's buckets, indexed by bucket number modulo their count.
type costRing struct {
	width   time.Duration
	buckets [CostBuckets]struct {
		n int64 // the bucket's number (time / CostBucket); 0: unused
		Cost
	}
	first int64 // the first bucket anything was recorded in
}

func (r *costRing) bucketOf(t time.Time) int64 { return t.UnixNano() / int64(r.width) }

// at returns the bucket of time t, emptied when it last held an older one.
func (r *costRing) at(t time.Time) *Cost {
	n := r.bucketOf(t)
	b := &r.buckets[n%CostBuckets]
	if b.n != n {
		b.n, b.Cost = n, Cost{}
	}
	if r.first == 0 {
		r.first = n
	}
	return &b.Cost
}

// window sums the complete buckets of the last CostBuckets before now.
func (r *costRing) window(now time.Time) CostWindow {
	w := CostWindow{Bucket: r.width}
	if r.first == 0 {
		return w
	}
	cur := r.bucketOf(now)
	if b := &r.buckets[cur%CostBuckets]; b.n == cur && b.Cost != (Cost{}) {
		w.Pending = true
	}
	for i := range r.buckets {
		if b := &r.buckets[i]; b.n >= cur-CostBuckets && b.n < cur {
			w.add(&b.Cost)
		}
	}
	w.Span = time.Duration(min(cur-r.first, CostBuckets)) * r.width
	return w
}
