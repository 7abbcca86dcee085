package status

import (
	"fmt"
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
	if in.Footprint != nil {
		unused := int32(0)
		for svc, f := range in.Footprint {
			if !in.Feedback.Usage.Services[svc] {
				unused++
				c.UnusedResources += int64(f.Resources)
				c.UnusedBytes += int64(f.Bytes)
			}
		}
		c.UnusedServices = &unused
		if unused > 0 && c.Recommendation != xdsv1alpha1.RecommendationNotEnoughData {
			// Scoping first: it is checked before the protocol.
			c.Advice = fmt.Sprintf("%d of %d selected Services were asked for by no proxy over the last %s: narrowing spec.services to the %d used would drop %d resources (%s) from the scope's snapshot (its proxies subscribe by name, so their traffic would not change); %s",
				unused, len(in.Footprint), w.Span, len(in.Footprint)-int(unused), c.UnusedResources, bytes(c.UnusedBytes), c.Advice)
		}
	}
	if len(c.Advice) > maxAdvice { // the CRD's bound; far above what is written
		c.Advice = strings.ToValidUTF8(c.Advice[:maxAdvice-len("…")], "") + "…"
	}
	return c, recheck
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
