package routestatus

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
)

const us = gatewayv1.GatewayController("scopeplane.dev/mesh")

var parentRef = testkit.ServiceParent

func svc(ns, name string, ports ...int32) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p})
	}
	return s
}

// route is an HTTPRoute of namespace shop on Service reviews port 80 with
// one rule to the backends given as "ns/name:port".
func route(backends ...gatewayv1.HTTPBackendRef) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "split", Generation: 4},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parentRef("", "reviews", 80), {Name: "gw"}}},
			Rules:           []gatewayv1.HTTPRouteRule{{BackendRefs: backends}},
		},
	}
}

func backend(ns, name string, port int32) gatewayv1.HTTPBackendRef {
	return gatewayv1.HTTPBackendRef{BackendRef: testkit.BackendRef(ns, name, port)}
}

func inputs(hr *gatewayv1.HTTPRoute, services ...*corev1.Service) *Inputs {
	in := &Inputs{ControllerName: us, Route: convert.HTTPRoute(hr), ParentRefs: hr.Spec.ParentRefs, Services: map[model.Key]*corev1.Service{}, Now: metav1.Unix(2000, 0)}
	for _, s := range services {
		in.Services[model.Key{Namespace: s.Namespace, Name: s.Name}] = s
	}
	return in
}

type want struct {
	accepted, resolved string // "True/Reason" or "False/Reason"
	message            string // in one of the messages
}

func check(t *testing.T, got []gatewayv1.RouteParentStatus, w want) {
	t.Helper()
	var ours []gatewayv1.RouteParentStatus
	for _, e := range got {
		if e.ControllerName == us {
			ours = append(ours, e)
		}
	}
	if len(ours) != 1 {
		t.Fatalf("%d entries of ours, want 1: %+v", len(ours), got)
	}
	e := ours[0]
	if n := e.ParentRef.Name; n != "reviews" {
		t.Errorf("entry for parent %q, want reviews", n)
	}
	var msgs []string
	for _, c := range e.Conditions {
		msgs = append(msgs, c.Message)
		if c.ObservedGeneration != 4 {
			t.Errorf("%s: observedGeneration %d, want 4", c.Type, c.ObservedGeneration)
		}
		wanted := map[string]string{"Accepted": w.accepted, "ResolvedRefs": w.resolved}[c.Type]
		if got := string(c.Status) + "/" + c.Reason; got != wanted {
			t.Errorf("%s = %s (%s), want %s", c.Type, got, c.Message, wanted)
		}
	}
	if len(e.Conditions) != 2 {
		t.Errorf("conditions %+v, want Accepted and ResolvedRefs", e.Conditions)
	}
	if !strings.Contains(strings.Join(msgs, "\n"), w.message) {
		t.Errorf("messages %q, want one to contain %q", msgs, w.message)
	}
}

func TestParents(t *testing.T) {
	reviews := svc("shop", "reviews", 80)
	for _, tc := range []struct {
		name string
		in   *Inputs
		want want
	}{
		{"good", inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 8080)),
			want{"True/Accepted", "True/ResolvedRefs", "attached to port 80 of Service shop/reviews"}},
		{"no parent Service", inputs(route(backend("", "v1", 8080)), svc("shop", "v1", 8080)),
			want{"False/NoMatchingParent", "True/ResolvedRefs", "Service shop/reviews does not exist"}},
		{"no parent port", inputs(route(backend("", "v1", 8080)), svc("shop", "reviews", 81), svc("shop", "v1", 8080)),
			want{"False/NoMatchingParent", "True/ResolvedRefs", "Service shop/reviews has no port 80"}},
		{"no backend", inputs(route(backend("", "v1", 8080)), reviews),
			want{"True/Accepted", "False/BackendNotFound", "rule 0: backendRefs[0]: Service shop/v1 does not exist"}},
		{"no backend port", inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 9090)),
			want{"True/Accepted", "False/BackendNotFound", "Service shop/v1 has no port 8080"}},
		{"another kind", func() *Inputs {
			b := backend("", "far", 80)
			b.Kind = ptr.To(gatewayv1.Kind("ServiceImport"))
			b.Group = ptr.To(gatewayv1.Group("multicluster.x-k8s.io"))
			return inputs(route(b, backend("", "v1", 8080)), reviews)
		}(), want{"True/Accepted", "False/InvalidKind", `a backend must be a core Service, not a "ServiceImport"`}},
		{"cross-namespace without consent", inputs(route(backend("other", "v2", 8080)), reviews, svc("other", "v2", 8080)),
			want{"True/Accepted", "False/RefNotPermitted", "no ReferenceGrant of namespace other lets HTTPRoutes of namespace shop name it"}},
		{"cross-namespace, missing, without consent: not told", inputs(route(backend("other", "gone", 8080)), reviews),
			want{"True/Accepted", "False/RefNotPermitted", "Service other/gone is in another namespace"}},
		{"cross-namespace with consent", func() *Inputs {
			in := inputs(route(backend("other", "v2", 8080)), reviews, svc("other", "v2", 8080))
			in.Consent.Grants = map[string]model.Grants{"other": {"shop": {"v2": {}}}}
			return in
		}(), want{"True/Accepted", "True/ResolvedRefs", ""}},
		{"cross-namespace allowed", func() *Inputs {
			in := inputs(route(backend("other", "v2", 8080)), reviews, svc("other", "v2", 8080))
			in.Consent.Allow = true
			return in
		}(), want{"True/Accepted", "True/ResolvedRefs", ""}},
		{"cross-namespace, no ReferenceGrant API", func() *Inputs {
			in := inputs(route(backend("other", "v2", 8080)), reviews, svc("other", "v2", 8080))
			in.Consent.Unavailable = true
			return in
		}(), want{"True/Accepted", "False/RefNotPermitted", "the cluster does not serve ReferenceGrants"}},
		{"refused", func() *Inputs {
			hr := route(backend("", "v1", 8080))
			hr.Spec.Rules[0].Matches = []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/(")}}}
			return inputs(hr, reviews, svc("shop", "v1", 8080))
		}(), want{"False/UnsupportedValue", "True/ResolvedRefs", `rule 0: matches[0].path.value: the regular expression "/("`}},
		{"conflicted by a GRPCRoute", func() *Inputs {
			in := inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 8080))
			in.GRPCRoutes = []*model.Route{{Key: model.Key{Namespace: "shop", Name: "rpc"}, Kind: model.GRPCRoute, Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}}}}}
			return in
		}(), want{"False/Conflicted", "True/ResolvedRefs", "GRPCRoute shop/rpc also attaches to port 80 of Service shop/reviews"}},
		{"served to proxyless clients without some fields", func() *Inputs {
			in := inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 8080))
			in.ProxylessOmissions = []string{"rule 0: header modifiers"}
			return in
		}(), want{"True/Accepted", "True/ResolvedRefs", "attached to port 80 of Service shop/reviews; proxyless gRPC clients are not sent rule 0: header modifiers"}},
		{"a GRPCRoute on another port", func() *Inputs {
			in := inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 8080))
			in.GRPCRoutes = []*model.Route{{Key: model.Key{Namespace: "shop", Name: "rpc"}, Kind: model.GRPCRoute, Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}, Port: 9090}}}}
			return in
		}(), want{"True/Accepted", "True/ResolvedRefs", ""}},
		{"a GRPCRoute of another namespace (another set)", func() *Inputs {
			in := inputs(route(backend("", "v1", 8080)), reviews, svc("shop", "v1", 8080))
			in.GRPCRoutes = []*model.Route{{Key: model.Key{Namespace: "web", Name: "rpc"}, Kind: model.GRPCRoute, Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}}}}}
			return in
		}(), want{"True/Accepted", "True/ResolvedRefs", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, Parents(nil, tc.in), tc.want)
		})
	}
}

// TestParentsPartiallyInvalid checks that entries Envoy's validation
// rejects make the route PartiallyInvalid, as Gateway API defines it,
// while it stays Accepted, and that a valid route gets no such condition.
func TestParentsPartiallyInvalid(t *testing.T) {
	in := inputs(route(backend("", "v1", 8080)), svc("shop", "reviews", 80), svc("shop", "v1", 8080))
	if got := Parents(nil, in)[0].Conditions; len(got) != 2 {
		t.Fatalf("a valid route has conditions %v, want Accepted and ResolvedRefs alone", got)
	}
	in.Invalid = []string{"rule 0 match 0: bad header value"}
	got := Parents(nil, in)[0].Conditions
	if len(got) != 3 || got[0].Status != metav1.ConditionTrue || got[2].Type != string(gatewayv1.RouteConditionPartiallyInvalid) ||
		got[2].Status != metav1.ConditionTrue || got[2].Reason != string(gatewayv1.RouteReasonUnsupportedValue) ||
		!strings.Contains(got[2].Message, "rule 0 match 0: bad header value") {
		t.Errorf("conditions %+v, want Accepted, ResolvedRefs and PartiallyInvalid/UnsupportedValue naming the entry", got)
	}
}

// TestParentsKeepsOthersAndTransitionTimes checks that another
// controller's entry is kept as it is, that an entry for a parentRef no
// longer in the spec goes, and that a condition keeps its
// lastTransitionTime while its status stays.
func TestParentsKeepsOthersAndTransitionTimes(t *testing.T) {
	hr := route(backend("", "v1", 8080))
	in := inputs(hr, svc("shop", "reviews", 80))
	theirs := gatewayv1.RouteParentStatus{ParentRef: parentRef("", "reviews", 80), ControllerName: "example.com/other",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Whatever", LastTransitionTime: metav1.Unix(5, 0)}}}
	stale := gatewayv1.RouteParentStatus{ParentRef: parentRef("", "gone", 0), ControllerName: us}
	first := Parents([]gatewayv1.RouteParentStatus{theirs, stale}, in)
	if len(first) != 2 || first[0].ControllerName != "example.com/other" || first[0].Conditions[0].Reason != "Whatever" || first[1].ParentRef.Name != "reviews" {
		t.Fatalf("parents %+v: want theirs, then ours for reviews only", first)
	}
	// An hour later, the backend exists: Accepted keeps its time,
	// ResolvedRefs turns and takes the new one.
	in = inputs(hr, svc("shop", "reviews", 80), svc("shop", "v1", 8080))
	in.Now = metav1.NewTime(in.Now.Add(time.Hour))
	second := Parents(first, in)
	acc, res := second[1].Conditions[0], second[1].Conditions[1]
	if acc.LastTransitionTime != first[1].Conditions[0].LastTransitionTime {
		t.Errorf("Accepted moved from %v to %v with the same status", first[1].Conditions[0].LastTransitionTime, acc.LastTransitionTime)
	}
	if res.Status != metav1.ConditionTrue || res.LastTransitionTime != in.Now {
		t.Errorf("ResolvedRefs %+v, want True since %v", res, in.Now)
	}
	if !parentsEqual(Parents(second, in), second) {
		t.Error("the same inputs again changed the entries")
	}
	// A route with no Service parent any more keeps theirs only.
	hr.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "gw"}}
	in = inputs(hr)
	if got := Parents(second, in); len(got) != 1 || got[0].ControllerName != "example.com/other" {
		t.Errorf("without Service parents: %+v, want theirs only", got)
	}
}

func TestCheckControllerName(t *testing.T) {
	for name, ok := range map[string]bool{
		DefaultControllerName: true, "example.com/mesh/v2": true,
		"": false, "mesh": false, "Example.com/mesh": false, "example.com/": false, "example.com/" + strings.Repeat("a", 250): false,
	} {
		if err := CheckControllerName(name); (err == nil) != ok {
			t.Errorf("CheckControllerName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
