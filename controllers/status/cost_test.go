package status

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
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

// Unused Services are counted and named, after the protocol's numbers:
// every proxy subscribes by name, so narrowing spec.services to the used
// ones would save no traffic in either protocol and never leads the advice.
func TestUnusedServices(t *testing.T) {
	key := func(name string) model.Key { return model.Key{Namespace: "shop", Name: name} }
	fp := func(names ...string) map[model.Key]Footprint {
		out := map[model.Key]Footprint{key("a"): {Resources: 4, Bytes: 900}}
		for _, n := range names {
			out[key(n)] = Footprint{Resources: 4, Bytes: 1200}
		}
		return out
	}
	byName := feedback.Usage{Services: map[model.Key]bool{key("a"): true}}
	cases := []struct {
		name      string
		w         feedback.CostWindow
		usage     feedback.Usage
		footprint map[model.Key]Footprint
		// unused is the count expected in status (-1: unset); prefix and
		// says what the advice starts with and contains.
		unused       int32
		resources    int64
		bytes        int64
		prefix, says string
	}{
		{"a switch leads, the unused Services follow", window(time.Hour, 600, 1e6, 0.5e6), byName, fp("b"), 1, 4, 1200,
			"over the last 1h0m0s Delta would have sent 50% fewer bytes (1 MB → 500 kB at 10.0 pushes/min); switching needs api_type DELTA_GRPC",
			"and restart the proxies; 1 of 2 selected Services (shop/b) were asked for by no proxy over the last 1h0m0s, 4 resources (1.2 kB, 57% of the selected Services' bytes): " +
				"the proxies subscribe by name, so those Services cost 0 B on the wire in either protocol, and narrowing spec.services to the 1 used would spare only the control plane's memory and work"},
		{"a keep leads, the unused Services follow", window(time.Hour, 600, 1e6, 0.98e6), byName, fp("b"), 1, 4, 1200,
			"over the last 1h0m0s Delta would have sent 2% fewer bytes", "; keep SotW; 1 of 2 selected Services (shop/b) were asked for by no proxy"},
		{"more than three are counted, three named", window(time.Hour, 600, 1e6, 1.2e6), byName, fp("e", "d", "c", "b"), 4, 16, 4800,
			"over the last 1h0m0s Delta would have sent 20% more bytes", "; keep SotW; 4 of 5 selected Services (shop/b, shop/c, shop/d and 1 more) were asked for"},
		{"all used: counted, nothing to say", window(time.Hour, 600, 1e6, 0.98e6), byName, fp(), 0, 0, 0,
			"over the last 1h0m0s Delta", ""},
		{"too little data: counted, no advice", window(3*time.Minute, 600, 1e6, 0.98e6), byName, fp("b"), 1, 4, 1200,
			"600 pushes (1 MB) over 3m0s so far", ""},
		{"a wildcard subscriber asks for all", window(time.Hour, 600, 1e6, 0.98e6), feedback.Usage{All: true, Services: byName.Services}, fp("b"), -1, 0, 0,
			"over the last 1h0m0s Delta", ""},
		{"no footprint", window(time.Hour, 600, 1e6, 0.98e6), byName, nil, -1, 0, 0, "over the last 1h0m0s Delta", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := served()
			in.Feedback.Cost, in.Feedback.Usage, in.Footprint = tc.w, tc.usage, tc.footprint
			c, _ := cost(nil, in)
			switch {
			case tc.unused < 0 && c.UnusedServices != nil:
				t.Errorf("unusedServices %d, want unset", *c.UnusedServices)
			case tc.unused >= 0 && (c.UnusedServices == nil || *c.UnusedServices != tc.unused):
				t.Errorf("unusedServices %v, want %d", c.UnusedServices, tc.unused)
			}
			if c.UnusedResources != tc.resources || c.UnusedBytes != tc.bytes {
				t.Errorf("unused resources %d (%d B), want %d (%d B)", c.UnusedResources, c.UnusedBytes, tc.resources, tc.bytes)
			}
			if !strings.HasPrefix(c.Advice, tc.prefix) || !strings.Contains(c.Advice, tc.says) {
				t.Errorf("advice %q\nwant it to start with %q and contain %q", c.Advice, tc.prefix, tc.says)
			}
			if tc.says == "" && strings.Contains(c.Advice, "asked for by no proxy") {
				t.Errorf("advice %q names unused Services", c.Advice)
			}
		})
	}
}

// The cost figures change a status on their own at most once per
// CostRefreshBuckets buckets per scope, spread over the period by the
// scope's key; any other change carries them up to date.
func TestCostFiguresPaced(t *testing.T) {
	const scopes, bucket = 200, time.Minute
	start := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	clock := start
	tr := feedback.NewWithClock(bucket, func() time.Time { return clock })
	type scope struct {
		st      xdsv1alpha1.ProxyScopeStatus
		written time.Time
	}
	all := make([]scope, scopes)
	keys := make([]model.Key, scopes)
	for i := range keys {
		keys[i] = model.Key{Namespace: "shop", Name: fmt.Sprint("scope-", i)}
	}
	perBucket := map[int64]int{}
	writes := 0
	// Two hours, a push to every scope each 10 s, a look every 10 s.
	for ; clock.Before(start.Add(2 * time.Hour)); clock = clock.Add(10 * time.Second) {
		for i, key := range keys {
			tr.Sent(key, model.SotW, xdstype.Cluster.URL(), feedback.Push{Resources: 1, Bytes: 100 + i, OtherBytes: 50})
			in := &Inputs{Namespace: key.Namespace, Name: key.Name, Generation: 1, Built: true, Version: "v1", Now: clock,
				Resolution: snapshot.Resolution{Resolution: catalog.Resolution{Generation: 1, SelectedServices: 1}}, Feedback: tr.Summary(key), CostWritten: all[i].written}
			next, _ := compute(&all[i].st, in)
			if equality.Semantic.DeepEqual(next, all[i].st) {
				continue
			}
			if !equality.Semantic.DeepEqual(next.Cost, all[i].st.Cost) {
				all[i].written = clock
			}
			all[i].st = next
			writes++
			perBucket[clock.Sub(start).Nanoseconds()/int64(bucket)]++
		}
	}
	periods := int(2 * time.Hour / (CostRefreshBuckets * bucket))
	t.Logf("%d scopes over 2 h of 1-minute buckets: %d status changes (at most %d per scope per %d buckets, %d)", scopes, writes, 1, CostRefreshBuckets, scopes*(periods+2))
	if writes > scopes*(periods+2) {
		t.Errorf("%d status changes for %d scopes in %d refresh periods: more than one per scope per period", writes, scopes, periods)
	}
	busiest := 0
	for b, n := range perBucket {
		if b > 1 && n > busiest {
			busiest = n
		}
	}
	if busiest > 2*scopes/CostRefreshBuckets {
		t.Errorf("%d status changes in one bucket: the refreshes are not spread (%d scopes, a refresh each per %d buckets)", busiest, scopes, CostRefreshBuckets)
	}
}
