package status

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// served is a scope of generation 2 built and served at version v1, with
// one Service selected and the given proxies.
func served(proxies ...*feedback.Proxy) *Inputs {
	r := feedback.Report{Proxies: map[uint64]*feedback.Proxy{}, Refused: map[string]int64{}, LastRefused: map[string]time.Time{}}
	for i, p := range proxies {
		r.Proxies[uint64(i)] = p
	}
	return &Inputs{
		Name: "web", Generation: 2, Protocol: model.SotW, Built: true, Version: "v1", Now: now,
		Resolution: snapshot.Resolution{Resolution: catalog.Resolution{Generation: 2, SelectedServices: 1, Clusters: 1, Endpoints: 3}},
		Feedback:   r.Summary(),
	}
}

func at(version string) *feedback.Proxy {
	return &feedback.Proxy{Node: "p-" + version, AtVersion: version}
}

// TestConditions covers every reason in api/v1alpha1/conditions.go.
func TestConditions(t *testing.T) {
	cases := []struct {
		name   string
		in     *Inputs
		check  func(*Inputs) condition
		status metav1.ConditionStatus
		reason string
		msg    string // a part of the message
	}{
		{"resolved", served(), accepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved, "1 Services selected: 1 clusters, 3 endpoints"},
		{"delta for gRPC", func() *Inputs {
			in := served()
			in.Mode, in.Protocol = model.ListenerProxylessGRPC, model.Delta
			return in
		}(), accepted,
			metav1.ConditionTrue, xdsv1alpha1.ReasonDeltaForGRPC, "1 Services selected: 1 clusters, 3 endpoints; but no gRPC xDS client speaks Delta"},
		{"delta for Envoy", func() *Inputs { in := served(); in.Mode, in.Protocol = model.ListenerEnvoy, model.Delta; return in }(), accepted,
			metav1.ConditionTrue, xdsv1alpha1.ReasonResolved, "1 Services selected"},
		{"no matching services", func() *Inputs { in := served(); in.Resolution.SelectedServices = 0; return in }(), accepted,
			metav1.ConditionFalse, xdsv1alpha1.ReasonNoMatchingServices, "match no Service"},
		{"part of the selection refused", func() *Inputs {
			in := served()
			in.Resolution.RefusedNamespaces = []string{"team-a", "team-b"}
			return in
		}(), accepted,
			metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted, "1 Services selected: 1 clusters, 3 endpoints; not served, as no ReferenceGrant in their namespace permits this scope's namespace to select them (or the namespace does not exist): Services of team-a, team-b"},
		{"part of the selection refused: Degraded", func() *Inputs { in := served(); in.Resolution.RefusedNamespaces = []string{"team-a"}; return in }(),
			func(in *Inputs) condition { c, _ := degraded(in); return c },
			metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted, "Services of team-a"},
		{"all of the selection refused", func() *Inputs {
			in := served()
			in.Resolution.SelectedServices, in.Resolution.RefusedNamespaces = 0, []string{"team-a"}
			return in
		}(), accepted,
			metav1.ConditionFalse, xdsv1alpha1.ReasonRefNotPermitted, "Services of team-a; no other Service is selected"},
		{"refused without the ReferenceGrant API", func() *Inputs {
			in := served()
			in.Resolution.RefusedNamespaces, in.Resolution.GrantsUnavailable = []string{"team-a"}, true
			return in
		}(), accepted,
			metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted, "(the cluster does not serve ReferenceGrants: install Gateway API's ReferenceGrant CRD and restart scopeplane, or run it with --cross-namespace=allow)"},
		{"namespace not found", func() *Inputs { in := served(); in.Resolution.MissingNamespaces = []string{"a", "b"}; return in }(), accepted,
			metav1.ConditionFalse, xdsv1alpha1.ReasonNamespaceNotFound, "do not exist: a, b"},
		{"invalid selector", func() *Inputs {
			in := served()
			in.Resolution = snapshot.Resolution{Resolution: catalog.Resolution{Generation: 2, Invalid: "spec.services[1].selector: bad"}}
			return in
		}(), accepted, metav1.ConditionFalse, xdsv1alpha1.ReasonInvalidSelector, "spec.services[1].selector: bad; the scope serves nothing"},
		{"not built", &Inputs{Generation: 1}, accepted, metav1.ConditionUnknown, xdsv1alpha1.ReasonSnapshotNotBuilt, "generation 1 is not processed"},
		{"older generation served", func() *Inputs { in := served(); in.Generation = 3; return in }(), accepted,
			metav1.ConditionUnknown, xdsv1alpha1.ReasonSnapshotNotBuilt, "generation 3"},
		{"an old rejection does not describe a new generation", func() *Inputs {
			in := served()
			in.Resolution = snapshot.Resolution{Resolution: catalog.Resolution{Generation: 1, Invalid: "bad"}}
			return in
		}(), accepted, metav1.ConditionUnknown, xdsv1alpha1.ReasonSnapshotNotBuilt, "generation 2"},

		{"ready not built", &Inputs{Generation: 1}, ready, metav1.ConditionFalse, xdsv1alpha1.ReasonSnapshotNotBuilt, "generation 1 is not built"},
		{"no proxies", served(), ready, metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies, "version v1 is built and served; no proxy is connected yet"},
		{"not accepted", func() *Inputs { in := served(at("v1")); in.Resolution.SelectedServices = 0; return in }(), ready,
			metav1.ConditionFalse, xdsv1alpha1.ReasonNotAccepted, "Accepted is False (NoMatchingServices)"},
		{"rejected is not ready", func() *Inputs {
			in := served()
			in.Resolution = snapshot.Resolution{Resolution: catalog.Resolution{Generation: 2, Invalid: "bad"}}
			return in
		}(), ready, metav1.ConditionFalse, xdsv1alpha1.ReasonNotAccepted, "InvalidSelector"},
		{"synced", served(at("v1"), at("v1")), ready, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced, "2 of 2 proxies at version v1"},
		{"pending", served(at("v1"), at("v0")), ready, metav1.ConditionFalse, xdsv1alpha1.ReasonPending, "1 of 2 proxies at version v1"},

		{"as expected", served(at("v1")), first(degraded), metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected, "no proxy rejects"},
		{"nacked", func() *Inputs {
			p := at("")
			p.Nacked = map[string]bool{"t": true}
			in := served(p)
			in.Feedback.NACKs = []feedback.NACK{{Node: p.Node, TypeURL: "t", Version: "v1", Detail: "bad route"}}
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed, "proxy p- rejected t version v1: bad route"},
		{"nacked by a proxy whose id is longer than a NACK keeps", func() *Inputs {
			p := &feedback.Proxy{Node: strings.Repeat("n", 300), Nacked: map[string]bool{"t": true}}
			in := served(p, at("v1"))
			in.Feedback.NACKs = []feedback.NACK{{Node: feedback.NodeID(p.Node), TypeURL: "t", Version: "v1", Detail: "bad route"}}
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed, "proxy " + strings.Repeat("n", 253) + " rejected t version v1: bad route"},
		{"unservable resource", unservableScope(1), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonUnservableResource,
			"1 resources cannot be served and are held back (proxies keep their previous version, if they had one; the rest is served): " +
				"Service shop/web: EDS shop/web:80: string field contains invalid UTF-8"},
		{"many unservable resources", unservableScope(maxUnservableNamed + 3), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonUnservableResource,
			"; and 3 more"},
		{"a scope-wide unservable resource", func() *Inputs {
			in := served(at("v1"))
			in.Resolution.Unservable = []snapshot.Unservable{{Type: xdstype.Route, Name: "http-10080", Reason: "bad"}}
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonUnservableResource, "the scope's RDS http-10080: bad"},
		{"a NACK comes first", func() *Inputs {
			in := nacking()
			in.Resolution.Unservable = unservableScope(1).Resolution.Unservable
			return in
		}(),
			first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed, "bad route"},
		{"wrong protocol", func() *Inputs {
			in := served()
			in.Protocol = model.Delta
			in.Feedback.Refused[feedback.RefusedWrongProto] = 4
			in.Feedback.LastRefused[feedback.RefusedWrongProto] = now.Add(-time.Minute)
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonWrongProtocol, "4 streams refused so far"},
		{"bootstrap ConfigMap name taken", func() *Inputs {
			in := served(at("v1"))
			in.BootstrapConflict = "ConfigMap ns/web-xds-bootstrap already exists"
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict, "web-xds-bootstrap already exists"},
		{"a replica's feedback unwritten", func() *Inputs {
			in := served(at("v1"))
			in.Unreported = []string{"replica r2: writing ConfigMap ops/scopeplane-feedback-r2-0: exceeded quota"}
			return in
		}(), first(degraded), metav1.ConditionTrue, xdsv1alpha1.ReasonFeedbackNotReported, "replica r2: writing ConfigMap ops/scopeplane-feedback-r2-0: exceeded quota"},
		{"wrong protocol forgotten", func() *Inputs {
			in := served()
			in.Feedback.LastRefused[feedback.RefusedWrongProto] = now.Add(-wrongProtocolMemory)
			return in
		}(), first(degraded), metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.check(tc.in)
			if c.status != tc.status || c.reason != tc.reason || !strings.Contains(c.message, tc.msg) {
				t.Errorf("got %s %s %q, want %s %s containing %q", c.status, c.reason, c.message, tc.status, tc.reason, tc.msg)
			}
		})
	}
}

func first(f func(*Inputs) (condition, time.Duration)) func(*Inputs) condition {
	return func(in *Inputs) condition { c, _ := f(in); return c }
}

// TestComputeStampsOnlyWhatIsServed checks observedGeneration and the counts:
// they describe the served snapshot, never a generation not yet built.
func TestComputeStampsOnlyWhatIsServed(t *testing.T) {
	prev := &xdsv1alpha1.ProxyScopeStatus{ObservedGeneration: 1, SelectedServices: 7}
	in := served(at("v1"))
	in.Generation = 3 // generation 2 is served
	st, _ := compute(prev, in)
	if st.ObservedGeneration != 1 || st.SelectedServices != 7 {
		t.Errorf("an unbuilt generation changed observedGeneration or counts: %+v", st)
	}
	in.Generation = 2
	in.RevTime = now.Add(1500 * time.Millisecond)
	st, recheck := compute(prev, in)
	if st.ObservedGeneration != 2 || st.SelectedServices != 1 || st.Endpoints != 3 || ptr.Deref(st.ConnectedProxies, -1) != 1 || st.SyncedProxies != 1 ||
		st.Version != "v1" || st.LastPushTime == nil || !st.LastPushTime.Time.Equal(now.Add(time.Second)) || st.BootstrapConfigMap != "web-xds-bootstrap" || recheck != 0 {
		t.Errorf("served generation: %+v, recheck %v", st, recheck)
	}
	for _, c := range st.Conditions {
		if c.ObservedGeneration != 2 {
			t.Errorf("condition %s stamped with generation %d", c.Type, c.ObservedGeneration)
		}
	}
	// Without bootstrap ConfigMaps (--bootstrap-configmaps=false) the
	// status names none, and nothing else changes.
	in.NoBootstrapConfigMap = true
	if off, _ := compute(prev, in); off.BootstrapConfigMap != "" || off.Version != st.Version {
		t.Errorf("with no bootstrap ConfigMaps written, status names %q (version %q)", off.BootstrapConfigMap, off.Version)
	}
	in.NoBootstrapConfigMap = false
	in.Feedback.LastRefused[feedback.RefusedWrongProto] = now.Add(-30 * time.Second)
	if _, recheck := compute(prev, in); recheck != wrongProtocolMemory-30*time.Second {
		t.Errorf("a WrongProtocol verdict must be re-checked when it expires, got %v", recheck)
	}
}

// unservableScope is a served scope, every proxy synced, whose Service
// shop/web has n resources the builder holds back.
func unservableScope(n int) *Inputs {
	in := served(at("v1"))
	for i := range n {
		in.Resolution.Unservable = append(in.Resolution.Unservable, snapshot.Unservable{
			Type: xdstype.Endpoint, Name: fmt.Sprintf("shop/web:%d", 80+i), Service: model.Key{Namespace: "shop", Name: "web"},
			Reason: "string field contains invalid UTF-8",
		})
	}
	return in
}

// nacking is a served scope with one proxy that rejects its routes.
func nacking() *Inputs {
	p := at("")
	p.Nacked = map[string]bool{"t": true}
	in := served(p)
	in.Feedback.NACKs = []feedback.NACK{{Node: p.Node, Peer: "10.1.2.3:40000", Identity: "system:serviceaccount:shop:envoy (pod envoy-1)", TypeURL: "t", Version: "v1", Detail: "bad route"}}
	return in
}

// TestKstatus maps every state to what kstatus computes from the status the
// control plane writes: Current for a healthy scope with or without proxies,
// Failed where only an edit helps, InProgress for the rest.
func TestKstatus(t *testing.T) {
	cases := []struct {
		name string
		in   *Inputs
		want kstatus.Status
	}{
		{"not built (SnapshotNotBuilt)", &Inputs{Name: "web", Generation: 2}, kstatus.InProgressStatus},
		{"older generation served", func() *Inputs { in := served(); in.Generation = 3; return in }(), kstatus.InProgressStatus},
		{"served without proxies (NoProxiesConnected)", served(), kstatus.CurrentStatus},
		{"every proxy synced (Synced)", served(at("v1"), at("v1")), kstatus.CurrentStatus},
		{"proxies catching up (Pending)", served(at("v1"), at("v0")), kstatus.InProgressStatus},
		{"no Service selected (NoMatchingServices)", func() *Inputs { in := served(); in.Resolution.SelectedServices = 0; return in }(), kstatus.InProgressStatus},
		{"a namespace missing (NamespaceNotFound)", func() *Inputs { in := served(); in.Resolution.MissingNamespaces = []string{"x"}; return in }(), kstatus.InProgressStatus},
		{"invalid selector (InvalidSelector)", func() *Inputs {
			in := served()
			in.Resolution = snapshot.Resolution{Resolution: catalog.Resolution{Generation: 2, Invalid: "bad"}}
			return in
		}(), kstatus.FailedStatus},
		{"a proxy rejects (ProxyNACKed)", nacking(), kstatus.FailedStatus},
		{"wrong-protocol proxies knocking (WrongProtocol)", func() *Inputs {
			in := served(at("v1"))
			in.Feedback.LastRefused[feedback.RefusedWrongProto] = now
			return in
		}(), kstatus.CurrentStatus},
		{"a resource held back (UnservableResource)", unservableScope(2), kstatus.CurrentStatus},
		{"bootstrap ConfigMap name taken (BootstrapConfigMapConflict)", func() *Inputs {
			in := served(at("v1"))
			in.BootstrapConflict = "taken"
			return in
		}(), kstatus.CurrentStatus},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := compute(&xdsv1alpha1.ProxyScopeStatus{}, tc.in)
			ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Generation: tc.in.Generation}, Status: st}
			ps.SetGroupVersionKind(xdsv1alpha1.GroupVersion.WithKind("ProxyScope"))
			obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ps)
			if err != nil {
				t.Fatal(err)
			}
			res, err := kstatus.Compute(&unstructured.Unstructured{Object: obj})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tc.want {
				t.Errorf("kstatus %s (%s), want %s; conditions %+v", res.Status, res.Message, tc.want, st.Conditions)
			}
			for _, c := range st.Conditions {
				if c.Type == xdsv1alpha1.ConditionReady && c.Status == metav1.ConditionTrue {
					if a := accepted(tc.in); a.status != metav1.ConditionTrue {
						t.Errorf("Ready is True while Accepted is %s", a.status)
					}
				}
			}
		})
	}
}

// recentNACKs name the peer of the rejecting stream, which tells apart the
// gRPC clients of a scope (they share one node id).
func TestRecentNACKsNameThePeer(t *testing.T) {
	st, _ := compute(&xdsv1alpha1.ProxyScopeStatus{}, nacking())
	if len(st.RecentNACKs) != 1 || st.RecentNACKs[0].Peer != "10.1.2.3:40000" || st.RecentNACKs[0].Identity != "system:serviceaccount:shop:envoy (pod envoy-1)" {
		t.Errorf("recentNACKs %+v, want one naming peer 10.1.2.3:40000 and identity system:serviceaccount:shop:envoy (pod envoy-1)", st.RecentNACKs)
	}
	if c := meta.FindStatusCondition(st.Conditions, xdsv1alpha1.ConditionDegraded); c == nil || !strings.Contains(c.Message, "proxy p- at 10.1.2.3:40000 rejected") {
		t.Errorf("Degraded %+v does not name the rejecting peer", c)
	}
}

// The WrongProtocol advice follows the kind of client refused — a proxy
// sets api_type, a gRPC client cannot and is told the scope's protocol —
// and clears as soon as a client of the kind refused is admitted after its
// last refusal, instead of lingering for wrongProtocolMemory while the
// clients are back, connected and synced. The verdicts travel through the
// feedback tracker as the server records them.
func TestWrongProtocolAdviceFollowsTheClientKind(t *testing.T) {
	grpcNode := &corev3.Node{Id: "g", UserAgentName: "gRPC Go"}
	envoyNode := &corev3.Node{Id: "e", UserAgentName: "envoy"}
	key := model.Key{Namespace: "ns", Name: "web"}
	for _, tc := range []struct {
		name     string
		mode     model.ListenerMode
		protocol model.Protocol
		// events, in order, each a refusal ("refuse") or an admission
		// ("admit") of node.
		events  []func(tr *feedback.Tracker)
		reason  string
		want    []string
		notWant []string
	}{
		{
			name: "a gRPC client refused by a Delta ProxylessGRPC scope", mode: model.ListenerProxylessGRPC, protocol: model.Delta,
			events: []func(*feedback.Tracker){refuse(key, grpcNode)},
			reason: xdsv1alpha1.ReasonWrongProtocol, want: []string{"1 streams refused", "spec.protocol: SotW", "State of the World only"}, notWant: []string{"api_type"},
		},
		{
			name: "an Envoy refused by a Delta scope", mode: model.ListenerEnvoy, protocol: model.Delta,
			events: []func(*feedback.Tracker){refuse(key, envoyNode)},
			reason: xdsv1alpha1.ReasonWrongProtocol, want: []string{"set api_type: DELTA_GRPC"}, notWant: []string{"gRPC"},
		},
		{
			name: "gRPC clients back on SotW after the switch", mode: model.ListenerProxylessGRPC, protocol: model.SotW,
			events: []func(*feedback.Tracker){refuse(key, grpcNode), refuse(key, grpcNode), admit(key, grpcNode)},
			reason: xdsv1alpha1.ReasonAsExpected,
		},
		{
			name: "gRPC clients still refused after another was admitted", mode: model.ListenerProxylessGRPC, protocol: model.SotW,
			events: []func(*feedback.Tracker){admit(key, grpcNode), refuse(key, grpcNode)},
			reason: xdsv1alpha1.ReasonWrongProtocol, want: []string{"spec.protocol is SotW now"}, notWant: []string{"api_type"},
		},
		{
			name: "a gRPC client back, an Envoy still refused", mode: model.ListenerProxylessGRPC, protocol: model.SotW,
			events: []func(*feedback.Tracker){refuse(key, grpcNode), refuse(key, envoyNode), admit(key, grpcNode)},
			reason: xdsv1alpha1.ReasonWrongProtocol, want: []string{"set api_type: GRPC"}, notWant: []string{"gRPC clients"},
		},
		{
			name: "an Envoy admitted does not clear a gRPC client's verdict", mode: model.ListenerProxylessGRPC, protocol: model.Delta,
			events: []func(*feedback.Tracker){refuse(key, grpcNode), admit(key, envoyNode)},
			reason: xdsv1alpha1.ReasonWrongProtocol, want: []string{"spec.protocol: SotW"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := now.Add(-time.Minute)
			tr := feedback.NewWithClock(time.Minute, func() time.Time { return clock })
			for _, ev := range tc.events {
				clock = clock.Add(time.Second)
				ev(tr)
			}
			in := served()
			in.Mode, in.Protocol = tc.mode, tc.protocol
			in.Feedback = tr.Summary(key)
			c, _ := degraded(in)
			if c.reason != tc.reason {
				t.Fatalf("Degraded %s (%s), want %s", c.reason, c.message, tc.reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(c.message, w) {
					t.Errorf("message %q lacks %q", c.message, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(c.message, w) {
					t.Errorf("message %q has %q", c.message, w)
				}
			}
		})
	}
}

// refuse is the server refusing node's stream for its protocol.
func refuse(key model.Key, node *corev3.Node) func(*feedback.Tracker) {
	return func(tr *feedback.Tracker) { tr.RefuseWrongProtocol(key, feedback.ClientKind(node)) }
}

// admit is the server binding node's stream to the scope.
func admit(key model.Key, node *corev3.Node) func(*feedback.Tracker) {
	return func(tr *feedback.Tracker) { tr.Connect(key, node, model.SotW, "", "", model.Location{}) }
}

// status.refusedStreams is what its doc comment says: the refusals of the
// replicas running now, each counted since it started, summed as the
// leader merges their feedback. It grows while they run, and drops when a
// replica goes (its feedback expires or is deleted) or restarts; it is
// not a total kept across them.
func TestRefusedStreamsAreTheRunningReplicas(t *testing.T) {
	key := model.Key{Namespace: "ns", Name: "web"}
	grpcNode := &corev3.Node{Id: "g", UserAgentName: "gRPC Go"}
	replica := func(refusals int) *feedback.Tracker {
		tr := feedback.New(time.Minute)
		for range refusals {
			refuse(key, grpcNode)(tr)
		}
		return tr
	}
	a, b := replica(3), replica(2)
	step := func(prev *xdsv1alpha1.ProxyScopeStatus, replicas ...*feedback.Tracker) xdsv1alpha1.ProxyScopeStatus {
		in := served()
		var parts []feedback.Summary
		for _, r := range replicas {
			parts = append(parts, r.Summary(key))
		}
		in.Feedback = feedback.Merge(parts...)
		st, _ := compute(prev, in)
		return st
	}
	st := step(&xdsv1alpha1.ProxyScopeStatus{}, a, b)
	if st.RefusedStreams != 5 {
		t.Fatalf("two replicas that refused 3 and 2 streams: refusedStreams %d, want 5", st.RefusedStreams)
	}
	refuse(key, grpcNode)(b)
	if st = step(&st, a, b); st.RefusedStreams != 6 {
		t.Fatalf("one more refusal: refusedStreams %d, want 6", st.RefusedStreams)
	}
	if st = step(&st, a); st.RefusedStreams != 3 {
		t.Fatalf("the replica that refused 3 streams gone: refusedStreams %d, want the other's 3", st.RefusedStreams)
	}
	if st = step(&st, replica(1)); st.RefusedStreams != 1 {
		t.Fatalf("the last replica restarted and refused 1 stream: refusedStreams %d, want 1", st.RefusedStreams)
	}
}

// TestComputeKeepsWhatANewLeaderCannotKnowBetter checks what a new leader
// computes for a scope whose world did not change: the version its
// predecessor wrote keeps its lastPushTime (the new leader only built it
// again), and the predecessor's cost figures stand while the new leader's
// window is empty, and until the scope's next refresh slot after the new
// leader began; a new version gets a new time, and the new leader's own
// figures replace the old ones at that slot.
func TestComputeKeepsWhatANewLeaderCannotKnowBetter(t *testing.T) {
	pushed := metav1.NewTime(now.Add(-time.Hour))
	figures := &xdsv1alpha1.ProtocolCost{Window: metav1.Duration{Duration: time.Hour}, Pushes: 600, SentBytes: 60_000, OtherProtocolBytes: 70_000, OtherProtocolRatio: "1.17"}
	in := served(at("v1"))
	prev, _ := compute(&xdsv1alpha1.ProxyScopeStatus{}, in)
	prev.LastPushTime, prev.Cost = &pushed, figures.DeepCopy()

	// The new leader: the same version built at its start, no window yet.
	in = served(at("v1"))
	in.RevTime, in.CostWritten, in.Leading = now, now, now
	in.Feedback.Cost.Bucket = time.Minute
	st, recheck := compute(&prev, in)
	if !equality.Semantic.DeepEqual(st, prev) {
		t.Errorf("a new leader over an unchanged scope changes its status:\n%+v\nwas\n%+v", st, prev)
	}
	// Its window still empty a refresh period later (no proxy came back),
	// the figures go, and it looks again by then.
	if period := CostRefreshBuckets * time.Minute; recheck <= 0 || recheck > period {
		t.Errorf("holding its predecessor's figures, the new leader looks again in %v, want within %v", recheck, period)
	}
	empty := *in
	empty.Now = now.Add(CostRefreshBuckets * time.Minute)
	if st, _ := compute(&prev, &empty); st.Cost != nil {
		t.Errorf("a refresh period after the new leader began, with no figures of its own, its predecessor's still stand: %+v", st.Cost)
	}

	// Its window's figures (of pushes since before its start) wait for
	// the scope's first refresh slot after it began, then replace them.
	clock := now.Add(-5 * time.Minute)
	tr := feedback.NewWithClock(time.Minute, func() time.Time { return clock })
	key := model.Key{Name: "web"}
	tr.Sent(key, model.SotW, xdstype.Cluster.URL(), feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 50})
	clock = now
	in.Feedback.Cost = tr.Summary(key).Cost
	_, next := costDue(in)
	for _, step := range []struct {
		at   time.Time
		kept bool
	}{{now.Add(next - time.Second), true}, {now.Add(next + time.Second), false}} {
		clock, in.Now = step.at, step.at
		in.Feedback.Cost = tr.Summary(key).Cost
		st, _ = compute(&prev, in)
		if st.Cost == nil || equality.Semantic.DeepEqual(st.Cost, figures) != step.kept {
			t.Errorf("%v after the new leader began (the scope's slot at %v): its predecessor's figures kept %v, want %v: %+v", step.at.Sub(now), next, !step.kept, step.kept, st.Cost)
		}
	}

	// A new version: a new time.
	in = served(at("v2"))
	in.Version, in.RevTime, in.CostWritten = "v2", now, now
	if st, _ = compute(&prev, in); st.LastPushTime == nil || !st.LastPushTime.Equal(&metav1.Time{Time: now}) {
		t.Errorf("a new version kept the old lastPushTime: %v", st.LastPushTime)
	}
}
