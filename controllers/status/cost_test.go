package status

import (
	"strings"
	"testing"
	"time"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

func window(span time.Duration, pushes, sent, other int64) feedback.CostWindow {
	return feedback.CostWindow{Span: span, Bucket: time.Minute, Cost: feedback.Cost{Pushes: pushes, Bytes: sent, OtherBytes: other}}
}

func TestAdvice(t *testing.T) {
	hour := time.Hour
	cases := []struct {
		name   string
		before xdsv1alpha1.Recommendation
		w      feedback.CostWindow
		p      model.Protocol
		mode   model.ListenerMode
		want   xdsv1alpha1.Recommendation
		says   string
	}{
		{"young window", "", window(3*time.Minute, 100, 1e6, 1e4), model.SotW, model.ListenerEnvoy,
			xdsv1alpha1.RecommendationNotEnoughData, "100 pushes (1 MB) over 3m0s so far: the advice needs 5m0s and 10 pushes"},
		{"quiet window", "", window(hour, 3, 1e6, 1e4), model.SotW, model.ListenerEnvoy, xdsv1alpha1.RecommendationNotEnoughData, "3 pushes"},
		{"delta much cheaper", "", window(hour, 2280, 412e6, 16e6), model.SotW, model.ListenerEnvoy, xdsv1alpha1.RecommendationSwitch,
			"over the last 1h0m0s Delta would have sent 96% fewer bytes (412 MB → 16 MB at 38.0 pushes/min); switching needs api_type DELTA_GRPC in the proxies' bootstrap: set spec.protocol: Delta"},
		{"SotW a little dearer", "", window(hour, 600, 1030e3, 1000e3), model.SotW, model.ListenerEnvoy, xdsv1alpha1.RecommendationKeep,
			"Delta would have sent 3% fewer bytes (1.03 MB → 1 MB at 10.0 pushes/min): not enough to be worth a switch; keep SotW"},
		{"SotW cheaper than delta", "", window(hour, 600, 1000e3, 1080e3), model.Delta, model.ListenerEnvoy, xdsv1alpha1.RecommendationKeep,
			"SotW would have sent 8% more bytes (1 MB → 1.08 MB at 10.0 pushes/min); keep Delta"},
		{"a switch stays advised above the lower threshold", xdsv1alpha1.RecommendationSwitch, window(hour, 600, 1e6, 0.85e6), model.SotW, model.ListenerEnvoy,
			xdsv1alpha1.RecommendationSwitch, "15% fewer"},
		{"and is not advised at the same saving from Keep", xdsv1alpha1.RecommendationKeep, window(hour, 600, 1e6, 0.85e6), model.SotW, model.ListenerEnvoy,
			xdsv1alpha1.RecommendationKeep, "not enough"},
		{"gRPC clients cannot switch to delta", "", window(hour, 600, 1e6, 0.1e6), model.SotW, model.ListenerProxylessGRPC,
			xdsv1alpha1.RecommendationKeep, "but gRPC's xDS clients speak SotW only; keep SotW"},
		{"connects and NACKs are named", "", feedback.CostWindow{Span: hour, Bucket: time.Minute, Cost: feedback.Cost{Pushes: 600, Bytes: 1e6, OtherBytes: 0.5e6,
			Connects: 8, ConnectBytes: 400e3, ConnectOtherBytes: 20e3, HeldBack: 40, OtherHeldBack: 4}}, model.SotW, model.ListenerEnvoy,
			xdsv1alpha1.RecommendationSwitch, "; connects 400 kB → 20 kB; NACKs held back 40 resources (4 in Delta)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, says := advise(c.before, c.w, c.p, c.mode)
			if got != c.want || !strings.Contains(says, c.says) {
				t.Errorf("advise: %s %q\nwant %s containing %q", got, says, c.want, c.says)
			}
		})
	}
}

func TestCostStatusRollsOncePerBucket(t *testing.T) {
	in := served()
	if c, recheck := cost(nil, in); c != nil || recheck != 0 {
		t.Errorf("a scope without traffic has cost %+v, recheck %s", c, recheck)
	}
	in.Now = time.Date(2026, 12, 2, 10, 0, 20, 0, time.UTC)
	// Proxies connected in this minute and went quiet: nothing shows yet,
	// and nothing but the bucket's end would make the status show it.
	in.Feedback.Cost = feedback.CostWindow{Bucket: time.Minute, Pending: true}
	if c, recheck := cost(nil, in); c != nil || recheck != 41*time.Second {
		t.Errorf("a first bucket with traffic: cost %+v, recheck %s; want none yet, and a look at the next minute boundary and a second (41s)", c, recheck)
	}
	// So, after an hour without traffic, is a new push.
	in.Feedback.Cost = window(time.Hour, 0, 0, 0)
	if _, recheck := cost(nil, in); recheck != 0 {
		t.Errorf("a quiet hour is looked at again after %s", recheck)
	}
	in.Feedback.Cost.Pending = true
	if _, recheck := cost(nil, in); recheck != 41*time.Second {
		t.Errorf("a push after a quiet hour: recheck %s, want 41s", recheck)
	}
	in.Feedback.Cost = window(10*time.Minute, 50, 2000, 500)
	c, recheck := cost(nil, in)
	if c == nil || c.OtherProtocolRatio != "0.25" || c.Window.Duration != 10*time.Minute || c.Recommendation != xdsv1alpha1.RecommendationSwitch {
		t.Fatalf("cost %+v", c)
	}
	if recheck != 41*time.Second {
		t.Errorf("recheck after %s, want the next minute boundary and a second (41s)", recheck)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1 kB", 412e6: "412 MB", 1234567: "1.23 MB", 16e9: "16 GB"} {
		if got := bytes(n); got != want {
			t.Errorf("bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestTransitionCountsTheOldProtocolsProxies(t *testing.T) {
	old, moved := at("v1"), at("v1")
	old.Protocol, moved.Protocol = model.SotW, model.Delta
	in := served(old, moved)
	in.Protocol = model.Delta
	in.Transition = &model.Transition{From: model.SotW, Until: now.Add(90 * time.Second)}
	st, recheck := compute(&xdsv1alpha1.ProxyScopeStatus{}, in)
	tr := st.ProtocolTransition
	if tr == nil || tr.From != xdsv1alpha1.ProtocolSotW || tr.Proxies != 1 || !tr.Until.Time.Equal(now.Add(90*time.Second).Truncate(time.Second)) {
		t.Fatalf("protocolTransition %+v", tr)
	}
	if recheck != 91*time.Second {
		t.Errorf("recheck after %s, want when the transition ends (91s)", recheck)
	}
	in.Now = now.Add(90 * time.Second)
	if st, _ = compute(&st, in); st.ProtocolTransition != nil {
		t.Errorf("protocolTransition after its end: %+v", st.ProtocolTransition)
	}
}

// Scoping first: Services no proxy asked for are counted, and the advice
// names them before the protocol.
func TestUnusedServicesComeFirst(t *testing.T) {
	a, b := model.Key{Namespace: "shop", Name: "a"}, model.Key{Namespace: "shop", Name: "b"}
	in := served()
	in.Feedback.Cost = window(time.Hour, 600, 1e6, 0.98e6)
	in.Feedback.Usage = feedback.Usage{Services: map[model.Key]bool{a: true}}
	in.Footprint = map[model.Key]Footprint{a: {Resources: 4, Bytes: 900}, b: {Resources: 4, Bytes: 1200}}
	c, _ := cost(nil, in)
	if c.UnusedServices == nil || *c.UnusedServices != 1 || c.UnusedResources != 4 || c.UnusedBytes != 1200 {
		t.Fatalf("unused: %v %d %d", c.UnusedServices, c.UnusedResources, c.UnusedBytes)
	}
	want := "1 of 2 selected Services were asked for by no proxy over the last 1h0m0s: narrowing spec.services to the 1 used would drop 4 resources (1.2 kB) from the scope's snapshot"
	if !strings.HasPrefix(c.Advice, want) || !strings.Contains(c.Advice, "; over the last 1h0m0s Delta would have sent 2% fewer bytes") {
		t.Errorf("advice %q", c.Advice)
	}
	in.Footprint = nil // a wildcard subscriber asks for all: nothing to count
	if c, _ = cost(nil, in); c.UnusedServices != nil || strings.Contains(c.Advice, "narrowing") {
		t.Errorf("without a footprint: %+v", c)
	}
}
