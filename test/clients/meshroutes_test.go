package clients

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/model"
)

// The mesh routes' backends: two versions of whoami, each a Service of its
// own that only the routes send traffic to (the scope selects whoami).
const (
	v1 = "whoami-v1"
	v2 = "whoami-v2"
)

// meshPace is how the clients call in the mesh-route scenarios: every
// 2 ms, so that a sample of splitRPCs takes seconds, each call with a
// deadline of 10 s, twice slowDelay: a call to the slow backend that ends
// DEADLINE_EXCEEDED was ended by the route's timeout, since without it the
// backend would have answered in time.
var meshPace = pace{interval: 2 * time.Millisecond, deadline: 10 * time.Second}

// slowDelay is how late the slow backend of the timeout scenario answers.
const slowDelay = 5 * time.Second

// routeTimeout is the timeout scenario's timeouts.request.
const routeTimeout = "300ms"

// splitRPCs is the sample each client's weighted split is measured over.
const splitRPCs = 1000

// mesh is the state the mesh-route scenarios share with the matrix.
type mesh struct {
	t       *testing.T
	c       client.Client
	cp      *controlplane.ControlPlane
	m       *matrix
	kinds   []string
	clients map[string]*runner
	// start starts a client of the grpc scope at meshPace.
	start func(kind string) *runner
	// identities is who each kind of client joins as.
	identities map[string]string
	backends   map[string]*whoami.Backend
	// marks are where each client was at each route change, so that a
	// failed RPC is told by the change it followed.
	marks []mark
}

// mark is the clients' result counts when what changed.
type mark struct {
	what string
	at   map[string]int
}

// meshRoutes drives every client through Gateway API routes on the
// Service whoami (GAMMA): a canary rolled out step by step, a header
// match, a GRPCRoute's method match, a timeout, a retry policy and the
// route deleted. Each cell says what the client did, in numbers; a NACK is
// recorded where it happened, with the client's words.
func meshRoutes(ms *mesh, netns string) {
	t := ms.t
	ms.backends = map[string]*whoami.Backend{}
	for name, addr := range map[string]string{v1: addrV1, v2: addrV2} {
		b := whoami.Serve(name, listenIn(t, netns, net.JoinHostPort(addr, fmt.Sprint(port))))
		t.Cleanup(b.Stop)
		ms.backends[name] = b
		create(t, ms.c,
			&corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: port, AppProtocol: ptr.To("grpc")}}},
			},
			&discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			})
	}
	for _, k := range ms.kinds {
		ms.clients[k].stop()
		ms.clients[k] = ms.start(k)
	}
	const before = "mesh routes: clients restarted, a call every 2 ms, 10 s deadlines"
	for _, k := range ms.kinds {
		ms.m.record(t, before, k, "backend-a (whoami's own endpoint)", ms.clients[k], backend("backend-a"))
	}

	lap := time.Now()
	timed := func(what string, step func()) {
		step()
		t.Logf("mesh routes: %s took %v", what, time.Since(lap).Round(100*time.Millisecond))
		lap = time.Now()
	}
	var route *gatewayv1.HTTPRoute
	timed("the canary", func() { route = ms.canary() })
	timed("the header match", func() { ms.headerMatch(route) })
	timed("the method match", ms.methodMatch)
	timed("the timeout", func() { ms.timeout(route) })
	timed("the retry", func() { ms.retry(route) })
	timed("the route's deletion", func() { ms.deleted(route) })
}

// canary creates an HTTPRoute on whoami splitting 90/10 between v1 and v2
// and rolls it out to 50/50 and 0/100, measuring each step's split, with
// no RPC failing from the route's creation to the end.
func (ms *mesh) canary() *gatewayv1.HTTPRoute {
	t := ms.t
	const rollout = "mesh canary rollout (HTTPRoute on whoami): created, 90/10 → 50/50 → 0/100"
	since, from := time.Now(), ms.change("the HTTPRoute created (90/10)")
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami-canary"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: onWhoami(),
			Rules:           []gatewayv1.HTTPRouteRule{weighted(90, 10)},
		},
	}
	create(t, ms.c, route)
	// A client's calls are one at a time, so the first answered by v1 or
	// v2 shows the route in effect for every call after it.
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitAt(from[k], func(r result) bool { return r.Backend == v1 || r.Backend == v2 })
		ms.recordSplit("mesh canary 90/10, over 1,000 RPCs: v2 within 10% ± 3 points", k, at, ok, last, 10, 3)
	}
	// 90/10 → 50/50 has no first call to show it: the step is in effect
	// when v2 answers more than 35% of 200 calls in a row, which a 90/10
	// split does with a chance below 1e-15.
	step := ms.change("90/10 → 50/50")
	mutate(t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) { r.Spec.Rules = []gatewayv1.HTTPRouteRule{weighted(50, 50)} })
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitWindow(step[k], 200, func(rs []result) bool { return tally(rs)[v2] > 70 })
		// Over 1,000 RPCs one binomial σ of a 50/50 split is 1.6 points:
		// ± 5 points (3.2 σ) fails a right client once in 700 runs.
		ms.recordSplit("mesh canary 50/50, over 1,000 RPCs: v2 within 50% ± 5 points", k, at, ok, last, 50, 5)
	}
	step = ms.change("50/50 → 0/100")
	mutate(t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) { r.Spec.Rules = []gatewayv1.HTTPRouteRule{weighted(0, 100)} })
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitWindow(step[k], 100, func(rs []result) bool { return tally(rs)[v2] == len(rs) })
		ms.recordSplit("mesh canary 0/100, over 1,000 RPCs: v2 only", k, at, ok, last, 100, 0)
	}
	for _, k := range ms.kinds {
		ms.recordNoFailures(rollout, k, from[k])
	}
	ms.nacks(rollout, since)
	return route
}

// sampled returns n results of the client from at, where the step was
// seen in effect. When it was not (ok false), it records so after prefix,
// with the last result, fails the test and returns false; too few results
// fail the test too.
func (ms *mesh) sampled(scenario, kind, prefix string, at int, ok bool, last result, n int) ([]result, bool) {
	t := ms.t
	t.Helper()
	r := ms.clients[kind]
	if !ok {
		ms.m.add(scenario, kind, prefix+fmt.Sprintf("NOT in effect within %v (last: %s, canary %v)", reach, clipped(last.Backend+last.Error), last.Canary))
		t.Errorf("%s: %s did not show the step within %v; last result %+v; stderr:\n%s", scenario, kind, reach, last, r.stderr.tail())
		return nil, false
	}
	got, full := r.sample(at, n)
	if !full {
		t.Errorf("%s: %s returned %d of %d results; stderr:\n%s", scenario, kind, len(got), n, r.stderr.tail())
	}
	return got, true
}

// onWhoami attaches a route to the Service whoami (GAMMA).
func onWhoami() gatewayv1.CommonRouteSpec {
	return gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
		Group: ptr.To(gatewayv1.Group("")), Kind: ptr.To(gatewayv1.Kind("Service")), Name: "whoami",
	}}}
}

// weighted is a rule sending w1 of every w1+w2 calls to v1, the rest to v2.
func weighted(w1, w2 int32) gatewayv1.HTTPRouteRule {
	return gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v1, w1), toBackend(v2, w2)}}
}

func toBackend(name string, weight int32) gatewayv1.HTTPBackendRef {
	return gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Port: ptr.To(gatewayv1.PortNumber(port))},
		Weight:                 ptr.To(weight),
	}}
}

// recordSplit measures splitRPCs results of the client from at (where
// the step was seen in effect; ok says whether it was) and records how
// they split; it fails the test unless v1 and v2 answered every one and
// v2's share is within tol points of wantV2 percent.
func (ms *mesh) recordSplit(scenario, kind string, at int, ok bool, last result, wantV2, tol float64) {
	t := ms.t
	t.Helper()
	got, ok := ms.sampled(scenario, kind, "", at, ok, last, splitRPCs)
	if !ok {
		return
	}
	n := tally(got)
	share := 100 * float64(n[v2]) / float64(max(len(got), 1))
	ms.m.add(scenario, kind, fmt.Sprintf("%s of %d RPCs (v2 %.1f%%)", n, len(got), share))
	if n[v1]+n[v2] != len(got) || share < wantV2-tol || share > wantV2+tol {
		t.Errorf("%s: %s split %d RPCs %s (v2 %.1f%%), want %d answered by %s and %s, v2 within %.0f%% ± %.0f points", scenario, kind, len(got), n, share, splitRPCs, v1, v2, wantV2, tol)
	}
}

// headerMatch sends the calls carrying x-canary: yes to v2 and the rest
// to v1, with no call failing on the way.
func (ms *mesh) headerMatch(route *gatewayv1.HTTPRoute) {
	const scenario = "mesh header match (HTTPRoute): x-canary: yes → v2, the rest → v1"
	since, from := time.Now(), ms.change("the header match set")
	mutate(ms.t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) { r.Spec.Rules = byHeader() })
	// Under 0/100 every call went to v2: the first call without the header
	// answered by v1 shows the match in effect.
	for _, k := range ms.kinds {
		ms.recordByHeader(scenario, k, "", from[k], func(r result) bool { return !r.Canary && r.Backend == v1 })
		ms.recordNoFailures(scenario, k, from[k])
	}
	ms.nacks(scenario, since)
}

// byHeader is the rules of the header match, the header's name as a user
// writes it (HTTP header names are case-insensitive).
func byHeader() []gatewayv1.HTTPRouteRule {
	return []gatewayv1.HTTPRouteRule{
		{
			Matches:     []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{Name: "X-Canary", Value: "yes"}}}},
			BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v2, 1)},
		},
		{BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v1, 1)}},
	}
}

// recordByHeader waits for the client's first result after from that
// shows the header match in effect, then records, after prefix, how the
// next 400 calls went by whether they carried the header; it fails the
// test unless those that did went to v2 only and the rest to v1 only.
func (ms *mesh) recordByHeader(scenario, kind, prefix string, from int, inEffect func(result) bool) {
	t := ms.t
	t.Helper()
	at, ok, last := ms.clients[kind].awaitAt(from, inEffect)
	got, ok := ms.sampled(scenario, kind, prefix, at, ok, last, 400)
	if !ok {
		return
	}
	var with, without []result
	for _, r := range got {
		if r.Canary {
			with = append(with, r)
		} else {
			without = append(without, r)
		}
	}
	w, wo := tally(with), tally(without)
	ms.m.add(scenario, kind, prefix+fmt.Sprintf("with the header %s of %d; without %s of %d", w, len(with), wo, len(without)))
	if w[v2] != len(with) || wo[v1] != len(without) {
		t.Errorf("%s: %s: with x-canary: yes %s of %d, want %s only; without %s of %d, want %s only", scenario, kind, w, len(with), v2, wo, len(without), v1)
	}
}

// methodMatch adds a GRPCRoute on whoami's port sending Whoami/Get to v2:
// it prevails over the HTTPRoute, so every call goes to v2; deleted, the
// HTTPRoute's header match is back. No call may fail on the way.
func (ms *mesh) methodMatch() {
	t := ms.t
	const scenario = "mesh GRPCRoute method match scopeplane.whoami.Whoami/Get → v2 (over the HTTPRoute), then deleted"
	since, from := time.Now(), ms.change("the GRPCRoute created")
	grpcRoute := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami-get"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: onWhoami(),
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Service: ptr.To("scopeplane.whoami.Whoami"), Method: ptr.To("Get")}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{
					BackendObjectReference: gatewayv1.BackendObjectReference{Name: v2, Port: ptr.To(gatewayv1.PortNumber(port))},
				}}},
			}},
		},
	}
	create(t, ms.c, grpcRoute)
	// Under the header match calls without the header went to v1: the
	// first such call answered by v2 shows the GRPCRoute in effect.
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitAt(from[k], func(r result) bool { return !r.Canary && r.Backend == v2 })
		got, ok := ms.sampled(scenario, k, "", at, ok, last, 400)
		if !ok {
			continue
		}
		n := tally(got)
		ms.m.add(scenario, k, fmt.Sprintf("%s of %d RPCs", n, len(got)))
		if n[v2] != len(got) {
			t.Errorf("%s: %s: %s of %d RPCs, want %s only", scenario, k, n, len(got), v2)
		}
	}
	deletedAt := ms.change("the GRPCRoute deleted")
	if err := ms.c.Delete(context.Background(), grpcRoute); err != nil {
		t.Fatal(err)
	}
	for _, k := range ms.kinds {
		ms.recordByHeader(scenario, k, "deleted, the header match again: ", deletedAt[k], func(r result) bool { return !r.Canary && r.Backend == v1 })
		ms.recordNoFailures(scenario, k, from[k])
	}
	ms.nacks(scenario, since)
}

// cCoreEarlyTimeout is how gRPC C-core 1.51 (Debian's python3-grpcio)
// applies a timeout its service config sets, as the route's
// max_stream_duration does: 1 to 2 s early (the offset is fixed per
// process), so a timeout under 2 s ends every call at once, whatever the
// backend. Upstream: grpc/grpc#34547 and grpc/grpc#40633 (open).
const cCoreEarlyTimeout = "C-core 1.51 ends calls 1–2 s before a service-config timeout (grpc/grpc#34547)"

// grpcJSCancelled is how grpc-js-xds 1.14 ends some calls that its
// deadline (here the route's timeout) ends: it sends the deadline as
// grpc-timeout, grpc-go's server resets the stream with CANCEL when the
// deadline passes there, and grpc-js reports a CANCEL that arrives before
// its own timer fires as CANCELLED rather than DEADLINE_EXCEEDED
// (grpc-js subchannel-call.ts, grpc-go internal/transport/http2_server.go).
const (
	grpcJSCancelled    = "CANCELLED: Call cancelled"
	grpcJSCancelledWhy = "grpc-js reports the backend's RST_STREAM CANCEL at the propagated deadline as CANCELLED when it beats its own timer"
)

// timeout sends every call to v2 under a route timeout shorter than v2's
// delay and a client deadline longer than it. While v2 answers at once,
// every call must be answered; once it is slow, every call must end
// DEADLINE_EXCEEDED, which only the route's timeout can explain.
func (ms *mesh) timeout(route *gatewayv1.HTTPRoute) {
	t := ms.t
	scenario := fmt.Sprintf("mesh timeout (HTTPRoute timeouts.request %s): v2 answers at once, then after %v; clients' deadline %v", routeTimeout, slowDelay, meshPace.deadline)
	since, from := time.Now(), ms.change("the timeout set")
	mutate(t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{
			BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v2, 1)},
			Timeouts:    &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration(routeTimeout))},
		}}
	})
	// Under the header match calls without the header went to v1: the
	// first such call not answered by v1 shows the timeout's rule.
	inEffect := map[string]int{}
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitAt(from[k], func(r result) bool { return !r.Canary && r.Backend != v1 })
		if !ok {
			ms.m.add(scenario, k, fmt.Sprintf("the rule NOT in effect within %v (last: %s)", reach, clipped(last.Backend+last.Error)))
			t.Errorf("%s: %s did not take the timeout's rule within %v; last result %+v", scenario, k, reach, last)
			continue
		}
		inEffect[k] = at - 1
	}
	for _, k := range ms.kinds {
		at, ok := inEffect[k]
		if !ok {
			continue
		}
		got, _ := ms.clients[k].sample(at, 50)
		n := tally(got)
		lo, hi := took(got)
		note := fmt.Sprintf("v2 at once: %s of %d (%d–%d ms)", n, len(got), lo, hi)
		switch {
		case k == "c-core" && n["DEADLINE_EXCEEDED"] == len(got):
			ms.m.add(scenario, k, note+"; KNOWN: "+cCoreEarlyTimeout)
			t.Logf("%s: %s: every call DEADLINE_EXCEEDED although v2 answers at once: %s", scenario, k, cCoreEarlyTimeout)
		case k == "c-core" && n[v2] == len(got):
			ms.m.add(scenario, k, note)
			t.Errorf("%s: %s answered every call under the timeout's rule: either the timeout did not reach it, or the known bug (%s) is gone and the matrix should no longer expect it", scenario, k, cCoreEarlyTimeout)
		default:
			ms.m.add(scenario, k, note)
			if n[v2] != len(got) {
				t.Errorf("%s: %s, v2 answering at once: %s of %d, want every call answered by %s", scenario, k, n, len(got), v2)
			}
		}
	}
	ms.backends[v2].Behave(slowDelay, 0)
	defer ms.backends[v2].Behave(0, 0)
	slow := ms.counts()
	for _, k := range ms.kinds {
		if _, ok := inEffect[k]; !ok {
			continue
		}
		at, ok, last := ms.clients[k].awaitAt(slow[k], func(r result) bool { return r.Code == "DEADLINE_EXCEEDED" })
		if !ok {
			ms.m.add(scenario, k, fmt.Sprintf("v2 slow: NOT DEADLINE_EXCEEDED within %v (last: %s after %d ms)", reach, clipped(last.Backend+last.Error), last.Ms))
			t.Errorf("%s: %s's calls did not end DEADLINE_EXCEEDED within %v; last result %+v; stderr:\n%s", scenario, k, reach, last, ms.clients[k].stderr.tail())
			continue
		}
		got, ok := ms.clients[k].sample(at-1, 10)
		n := tally(got)
		lo, hi := took(got)
		note := fmt.Sprintf("v2 slow: %s of %d (%d–%d ms; %s)", n, len(got), lo, hi, clipped(got[0].Error))
		known, other := counted{}, counted{}
		for _, r := range got {
			switch {
			case r.Code == "DEADLINE_EXCEEDED":
			case k == "grpc-js-xds" && r.Error == grpcJSCancelled:
				known[r.Error]++
			default:
				other[fmt.Sprintf("%s after %d ms", clipped(r.Backend+r.Error), r.Ms)]++
			}
		}
		if len(known) > 0 {
			note += fmt.Sprintf("; KNOWN: %s (%s)", known.times(), grpcJSCancelledWhy)
			t.Logf("%s: %s: %s: %s", scenario, k, known.times(), grpcJSCancelledWhy)
		}
		if len(other) > 0 {
			note += "; " + other.times()
		}
		ms.m.add(scenario, k, note)
		if !ok || len(other) > 0 {
			t.Errorf("%s: %s, v2 slow: %s of %d, want every call ended by the route's timeout: %s", scenario, k, n, len(got), other.times())
		}
	}
	ms.nacks(scenario, since)
}

// took is the shortest and the longest time the results took, in ms.
func took(rs []result) (lo, hi int64) {
	for i, r := range rs {
		if i == 0 || r.Ms < lo {
			lo = r.Ms
		}
		hi = max(hi, r.Ms)
	}
	return lo, hi
}

// retry makes v2 fail every other call of each client with UNAVAILABLE
// and measures what each client answers without a retry policy and then
// with one (codes [503], 2 attempts): with it, every call after a client's
// first fails once and must be retried.
func (ms *mesh) retry(route *gatewayv1.HTTPRoute) {
	t := ms.t
	const scenario = "mesh retry (HTTPRoute retry codes [503], attempts 2): v2 fails every other call of each client UNAVAILABLE"
	since, from := time.Now(), ms.change("the timeout dropped")
	mutate(t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v2, 1)}}}
	})
	// A call answered shows the rule without the timeout (C-core answers
	// none under it).
	for _, k := range ms.kinds {
		if _, ok, last := ms.clients[k].awaitAt(from[k], backend(v2)); !ok {
			t.Errorf("%s: %s not answered by %s within %v without the timeout; last result %+v", scenario, k, v2, reach, last)
		}
	}
	ms.backends[v2].Behave(0, 2)
	defer ms.backends[v2].Behave(0, 0)
	flaky := ms.counts()
	for _, k := range ms.kinds {
		got, ok := ms.clients[k].sample(flaky[k], 200)
		n := tally(got)
		ms.m.add(scenario, k, fmt.Sprintf("without a policy %s of %d", n, len(got)))
		if !ok || n["UNAVAILABLE"] < 50 {
			t.Errorf("%s: %s without a retry policy: %s of %d, want about half UNAVAILABLE", scenario, k, n, len(got))
		}
	}
	policy := ms.change("the retry policy set")
	mutate(t, ms.c, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{
			BackendRefs: []gatewayv1.HTTPBackendRef{toBackend(v2, 1)},
			Retry:       &gatewayv1.HTTPRouteRetry{Codes: []gatewayv1.HTTPRouteRetryStatusCode{503}, Attempts: ptr.To(2)},
		}}
	})
	// Without the policy every other call fails: 20 answered in a row
	// show it in effect.
	for _, k := range ms.kinds {
		at, ok, last := ms.clients[k].awaitWindow(policy[k], 20, func(rs []result) bool { return tally(rs)[v2] == len(rs) })
		got, ok := ms.sampled(scenario, k, "with the policy (20 answers in a row): ", at, ok, last, splitRPCs)
		if !ok {
			continue
		}
		n := tally(got)
		rate := 100 * float64(n[v2]) / float64(max(len(got), 1))
		ms.m.add(scenario, k, fmt.Sprintf("with the policy %s of %d: %.1f%% answered", n, len(got), rate))
		if rate < 99 {
			t.Errorf("%s: %s with the retry policy: %s of %d (%.1f%%), want ≥ 99%% answered", scenario, k, n, len(got), rate)
		}
	}
	ms.nacks(scenario, since)
}

// deleted deletes the route: the calls go back to whoami's own endpoint
// (backend-a), and none fails on the way.
func (ms *mesh) deleted(route *gatewayv1.HTTPRoute) {
	t := ms.t
	const scenario = "mesh route deleted: back to whoami's own endpoint"
	since := time.Now()
	from := ms.change("the HTTPRoute deleted")
	if err := ms.c.Delete(context.Background(), &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}); err != nil {
		t.Fatal(err)
	}
	for _, k := range ms.kinds {
		ms.m.record(t, scenario, k, "backend-a", ms.clients[k], backend("backend-a"))
		ms.m.recordSteady(t, scenario, k, "backend-a", ms.clients[k], 200, backend("backend-a"))
		ms.recordNoFailures(scenario, k, from[k])
	}
	ms.nacks(scenario, since)
}

// change records a route change about to be made and returns the clients'
// result counts.
func (ms *mesh) change(what string) map[string]int {
	at := ms.counts()
	ms.marks = append(ms.marks, mark{what, at})
	return at
}

// recordNoFailures records how many of the client's RPCs since its result
// number from failed, each failure told by the route change it followed,
// and fails the test for any.
func (ms *mesh) recordNoFailures(scenario, kind string, from int) {
	t := ms.t
	t.Helper()
	r := ms.clients[kind]
	r.mu.Lock()
	got := slices.Clone(r.results[min(from, len(r.results)):])
	r.mu.Unlock()
	failed, n := counted{}, 0
	for i, res := range got {
		if res.Error == "" {
			continue
		}
		after := "before any change"
		for _, mk := range ms.marks {
			if mk.at[kind] <= from+i {
				after = mk.what
			}
		}
		failed[fmt.Sprintf("after %s: %s", after, clipped(res.Error))]++
		n++
	}
	cell := fmt.Sprintf("%d failed of %d RPCs", n, len(got))
	if n > 0 {
		cell += fmt.Sprintf(" (%s)", failed.times())
		t.Errorf("%s: %s failed %d of %d RPCs: %s", scenario, kind, n, len(got), failed.times())
	}
	ms.m.add(scenario, kind, cell)
}

// counts is how many results each client has reported.
func (ms *mesh) counts() map[string]int {
	out := map[string]int{}
	for _, k := range ms.kinds {
		out[k] = ms.clients[k].count()
	}
	return out
}

// nacks records in the scenario's cells every rejection the grpc scope's
// clients sent since, in the client's words, and fails the test for it.
func (ms *mesh) nacks(scenario string, since time.Time) {
	t := ms.t
	t.Helper()
	for _, n := range ms.cp.Feedback.Get(model.Key{Namespace: ns, Name: "grpc"}).NACKs {
		if n.Time.Before(since) {
			continue
		}
		kind := n.Identity
		for k, id := range ms.identities {
			if id == n.Identity {
				kind = k
			}
		}
		typ := n.TypeURL[strings.LastIndex(n.TypeURL, ".")+1:]
		ms.m.add(scenario, kind, fmt.Sprintf("NACKed %s version %s: %s", typ, n.Version, n.Detail))
		t.Errorf("%s: %s NACKed %s version %s: %s", scenario, kind, n.TypeURL, n.Version, n.Detail)
	}
}

// counted is how many results had each outcome: the backend that answered
// or the error's code.
type counted map[string]int

// tally counts results by outcome.
func tally(rs []result) counted {
	out := counted{}
	for _, r := range rs {
		switch {
		case r.Backend != "":
			out[r.Backend]++
		case r.Code != "":
			out[r.Code]++
		default:
			out[r.Error]++
		}
	}
	return out
}

// ordered is the outcomes, most frequent first.
func (c counted) ordered() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return c[keys[i]] > c[keys[j]] || c[keys[i]] == c[keys[j]] && keys[i] < keys[j] })
	return keys
}

// String is the outcomes, most frequent first: "whoami-v1 903, whoami-v2 97".
func (c counted) String() string {
	keys := c.ordered()
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, c[k])
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// times is the outcomes, most frequent first, each after its count:
// "6 × after the route created: UNAVAILABLE …".
func (c counted) times() string {
	keys := c.ordered()
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %s", c[k], k)
	}
	return strings.Join(parts, "; ")
}

// sample waits for n results of the client from its result number from,
// allowing reach plus 20 ms a call, and returns them (fewer if they did
// not come).
func (r *runner) sample(from, n int) ([]result, bool) {
	deadline := time.Now().Add(reach + time.Duration(n)*20*time.Millisecond)
	for r.count() < from+n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	got := slices.Clone(r.results[min(from, len(r.results)):min(from+n, len(r.results))])
	return got, len(got) == n
}

// awaitWindow waits, up to reach, for the first n results in a row after
// the first from that satisfy ok; at is the number of results up to the
// window's end.
func (r *runner) awaitWindow(from, n int, ok func([]result) bool) (at int, found bool, last result) {
	deadline := time.Now().Add(reach)
	end := from + n
	for {
		r.mu.Lock()
		for ; end <= len(r.results); end++ {
			if ok(r.results[end-n : end]) {
				r.mu.Unlock()
				return end, true, r.results[end-1]
			}
		}
		if len(r.results) > 0 {
			last = r.results[len(r.results)-1]
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			return end - 1, false, last
		}
		time.Sleep(50 * time.Millisecond)
	}
}
