package status

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Advice needs a window of at least minAdviceBuckets (five minutes, by
// default) holding minAdvicePushes responses.
const (
	minAdviceBuckets = 5
	minAdvicePushes  = 10
)

// CostRefreshBuckets paces status.cost: once a scope's figures are written,
// a change of them alone is written again at most once every
// CostRefreshBuckets buckets (ten minutes with the default minute), at a
// moment of its own within them (a hash of the scope's key), so that
// 10,000 scopes' windows rolling together cost 10,000 writes per ten
// minutes, evenly spread (17 a second), not 10,000 per bucket (167 a
// second). A status written for another reason carries its figures up to
// date; the first figures of a scope are written when its first bucket
// completes.
const CostRefreshBuckets = 10

// costDue says whether the scope's cost figures may be written on their
// own now (the refresh period they were last written in is over, or
// this leader never wrote them), and how long until the next period.
func costDue(in *Inputs) (bool, time.Duration) {
	period := int64(CostRefreshBuckets * in.Feedback.Cost.Bucket)
	if period <= 0 {
		return true, 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(in.Namespace + "/" + in.Name))
	offset := int64(h.Sum64() % uint64(period))
	slot := func(t time.Time) int64 { return (t.UnixNano() - offset) / period }
	now := slot(in.Now)
	next := time.Duration((now+1)*period + offset - in.Now.UnixNano())
	return in.CostWritten.IsZero() || slot(in.CostWritten) < now, next
}

// costHeld is how much longer a predecessor's cost figures stand while
// this process has none of the scope (0: no longer). A new leader starts
// with an empty window, and its own figures are due at the scope's refresh
// slot within one refresh period of its start if the scope's proxies came
// back; a window still empty then means none did, and the figures go.
func costHeld(in *Inputs) time.Duration {
	period := CostRefreshBuckets * in.Feedback.Cost.Bucket
	if in.Leading.IsZero() || period <= 0 {
		return 0
	}
	return max(0, period-in.Now.Sub(in.Leading))
}

// maxAdvice is status.cost.advice's length limit in the CRD.
const maxAdvice = 1024

// Hysteresis: a switch is advised once the other protocol would save
// switchAt of the bytes, and withdrawn only when the saving falls under
// keepAt, so the advice does not flap around one threshold.
const (
	switchAt = 0.20
	keepAt   = 0.10
)

// cost prices the window's traffic in both protocols and advises, from the
// previous advice (for the hysteresis). It returns nil while no bucket
// with traffic is complete, and when to look again: the next bucket
// boundary while the window holds anything or is still growing, or the
// current bucket holds what the window does not show yet. Nothing else may
// wake the status writer then: proxies that connect and go quiet within
// one bucket send no more feedback.
func cost(prev *xdsv1alpha1.ProtocolCost, in *Inputs) (*xdsv1alpha1.ProtocolCost, time.Duration) {
	w := in.Feedback.Cost
	var recheck time.Duration
	if w.Pushes > 0 || w.Pending || (w.Span > 0 && w.Span < feedback.CostBuckets*w.Bucket) {
		recheck = w.Bucket - in.Now.Sub(in.Now.Truncate(w.Bucket)) + w.Bucket/60
	}
	if w.Span == 0 && w.Pushes == 0 {
		return nil, recheck
	}
	c := &xdsv1alpha1.ProtocolCost{
		Window: metav1.Duration{Duration: w.Span}, Pushes: w.Pushes, SentBytes: w.Bytes, OtherProtocolBytes: w.OtherBytes,
		Connects: w.Connects, ConnectSentBytes: w.ConnectBytes, ConnectOtherProtocolBytes: w.ConnectOtherBytes,
		HeldBackResources: w.HeldBack, OtherProtocolHeldBackResources: w.OtherHeldBack,
	}
	if w.Bytes > 0 {
		c.OtherProtocolRatio = fmt.Sprintf("%.2f", float64(w.OtherBytes)/float64(w.Bytes))
	}
	var before xdsv1alpha1.Recommendation
	if prev != nil {
		before = prev.Recommendation
	}
	c.Recommendation, c.Advice = advise(before, w, in.Protocol, in.Mode)
	if in.Footprint != nil && !in.Feedback.Usage.All {
		unused := unusedServices(in.Footprint, in.Feedback.Usage)
		n := int32(len(unused))
		c.UnusedServices = &n
		var total int64
		for _, f := range in.Footprint {
			total += int64(f.Bytes)
		}
		for _, svc := range unused {
			c.UnusedResources += int64(in.Footprint[svc].Resources)
			c.UnusedBytes += int64(in.Footprint[svc].Bytes)
		}
		if n > 0 && c.Recommendation != xdsv1alpha1.RecommendationNotEnoughData {
			// After the protocol's numbers: see unusedServices.
			c.Advice += "; " + unusedNote(unused, len(in.Footprint), total, c, w.Span)
		}
	}
	if len(c.Advice) > maxAdvice { // the CRD's bound; far above what is written
		c.Advice = strings.ToValidUTF8(c.Advice[:maxAdvice-len("…")], "") + "…"
	}
	return c, recheck
}

// unusedServices lists the Services of the footprint no proxy asked for,
// sorted, so the advice names them in a stable order.
//
// They are counted only while no proxy subscribes with a wildcard (one
// that does asks for every Service), so every proxy of the scope subscribes
// by name, and a by-name subscriber is sent nothing it did not ask for, in
// either protocol. The unused Services therefore cost nothing on the wire:
// narrowing spec.services to the used ones spares the control plane's
// memory and work, never the proxies' traffic, so it cannot save more than
// a protocol switch. The advice leads with the protocol's numbers and
// names the unused Services after them.
func unusedServices(fp map[model.Key]Footprint, u feedback.Usage) []model.Key {
	var out []model.Key
	for svc := range fp {
		if !u.Services[svc] {
			out = append(out, svc)
		}
	}
	slices.SortFunc(out, func(a, b model.Key) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// maxNamed bounds how many unused Services the advice names.
const maxNamed = 3

// unusedNote says which selected Services no proxy asked for, their share
// of the selected Services' bytes in the snapshot, and that narrowing would
// not change the traffic.
func unusedNote(unused []model.Key, selected int, total int64, c *xdsv1alpha1.ProtocolCost, span time.Duration) string {
	names := make([]string, 0, maxNamed)
	for _, svc := range unused[:min(len(unused), maxNamed)] {
		names = append(names, svc.String())
	}
	named := strings.Join(names, ", ")
	if more := len(unused) - maxNamed; more > 0 {
		named += fmt.Sprintf(" and %d more", more)
	}
	share := 0.0
	if total > 0 {
		share = float64(c.UnusedBytes) / float64(total) * 100
	}
	return fmt.Sprintf("%d of %d selected Services (%s) were asked for by no proxy over the last %s, %d resources (%s, %.0f%% of the selected Services' bytes): "+
		"the proxies subscribe by name, so those Services cost 0 B on the wire in either protocol, and narrowing spec.services to the %d used would spare only the control plane's memory and work",
		len(unused), selected, named, span, c.UnusedResources, bytes(c.UnusedBytes), share, selected-len(unused))
}

// advise turns a window into a recommendation and the sentence that says
// it with the numbers.
func advise(before xdsv1alpha1.Recommendation, w feedback.CostWindow, p model.Protocol, mode model.ListenerMode) (xdsv1alpha1.Recommendation, string) {
	other := model.Delta
	if p == model.Delta {
		other = model.SotW
	}
	span := w.Span.String()
	if need := minAdviceBuckets * w.Bucket; w.Span < need || w.Pushes < minAdvicePushes || w.Bytes == 0 {
		return xdsv1alpha1.RecommendationNotEnoughData, fmt.Sprintf(
			"%d pushes (%s) over %s so far: the advice needs %s and %d pushes",
			w.Pushes, bytes(w.Bytes), span, need, minAdvicePushes)
	}
	saving := 1 - float64(w.OtherBytes)/float64(w.Bytes)
	extra := details(w, other)
	if saving < 0 {
		return xdsv1alpha1.RecommendationKeep, fmt.Sprintf(
			"over the last %s %s would have sent %.0f%% more bytes (%s → %s at %.1f pushes/min)%s; keep %s",
			span, other, -saving*100, bytes(w.Bytes), bytes(w.OtherBytes), perMinute(w), extra, p)
	}
	threshold := switchAt
	if before == xdsv1alpha1.RecommendationSwitch {
		threshold = keepAt
	}
	head := fmt.Sprintf("over the last %s %s would have sent %.0f%% fewer bytes (%s → %s at %.1f pushes/min)%s",
		span, other, saving*100, bytes(w.Bytes), bytes(w.OtherBytes), perMinute(w), extra)
	switch {
	case saving < threshold:
		return xdsv1alpha1.RecommendationKeep, fmt.Sprintf("%s: not enough to be worth a switch; keep %s", head, p)
	case other == model.Delta && mode == model.ListenerProxylessGRPC:
		return xdsv1alpha1.RecommendationKeep, fmt.Sprintf("%s, but gRPC's xDS clients speak SotW only; keep SotW", head)
	default:
		return xdsv1alpha1.RecommendationSwitch, fmt.Sprintf(
			"%s; switching needs api_type %s in the proxies' bootstrap: set spec.protocol: %s (the bootstrap ConfigMap follows it) and restart the proxies",
			head, other.APIType(), other)
	}
}

// details names the connects' and NACKs' part, when there is one.
func details(w feedback.CostWindow, other model.Protocol) string {
	s := ""
	if w.Connects > 0 {
		s += fmt.Sprintf("; connects %s → %s", bytes(w.ConnectBytes), bytes(w.ConnectOtherBytes))
	}
	if w.HeldBack > 0 {
		s += fmt.Sprintf("; NACKs held back %d resources (%d in %s)", w.HeldBack, w.OtherHeldBack, other)
	}
	return s
}

func perMinute(w feedback.CostWindow) float64 {
	return float64(w.Pushes) / w.Span.Minutes()
}

// bytes renders a size in SI units, as "412 MB".
func bytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), "kMGTPE"
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.3g %cB", v, suffix[i])
}
