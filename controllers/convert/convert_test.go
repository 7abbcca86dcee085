package convert

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/model"
)

func TestServiceMergesSlicesWithTheirOwnPorts(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", UID: "4f1d2c3b-aaaa-4bbb-8ccc-0123456789ab", Labels: map[string]string{"app": "cart"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromString("web"), AppProtocol: ptr.To("http")},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}
	slices := []*discoveryv1.EndpointSlice{
		{
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("none")}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.0.0.2"}, Zone: ptr.To("z1"), NodeName: ptr.To("n1")}, // nil conditions: ready
				{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}},
				{Addresses: []string{"not-an-ip", "fd00::1"}}, // neither is IPv4
			},
		},
		{
			AddressType: discoveryv1.AddressTypeIPv6,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8081), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"fd00:0::1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
			},
		},
		{AddressType: discoveryv1.AddressTypeFQDN, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"example.com"}}}},
		{ // the same address again, in a second IPv4 slice with the same ports, not ready
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}},
		},
	}
	http8080 := []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}}
	want := &model.Service{
		Key:    model.Key{Namespace: "shop", Name: "cart"},
		UID:    "4f1d2c3b-aaaa-4bbb-8ccc-0123456789ab",
		Labels: map[string]string{"app": "cart"},
		Ports: []model.ServicePort{
			{Name: "http", Port: 80, Protocol: model.ProtocolTCP, AppProtocol: "http", TargetPortName: "web"},
			{Name: "dns", Port: 53, Protocol: model.ProtocolUDP, TargetPort: 53},
		},
		Endpoints: []model.Endpoint{
			{Address: "10.0.0.1", Family: model.IPv4, Ports: http8080, Terminating: true},
			{Address: "10.0.0.2", Family: model.IPv4, Ports: http8080, Ready: true, Serving: true, Zone: "z1", Node: "n1"},
			{Address: "fd00::1", Family: model.IPv6, Ports: []model.EndpointPort{{Name: "http", Port: 8081, Protocol: model.ProtocolTCP}}, Serving: true, Terminating: true},
		},
	}
	if d := cmp.Diff(want, Service(svc, slices)); d != "" {
		t.Errorf("Service() mismatch (-want +got):\n%s", d)
	}
}

func TestExternalNameServiceHasNoEndpoints(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "payments"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "pay.example.com", Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	got := Service(svc, []*discoveryv1.EndpointSlice{{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}})
	if got.ExternalName != "pay.example.com" || len(got.Endpoints) != 0 || got.Ports[0].TargetPort != 443 {
		t.Errorf("ExternalName Service converted to %+v", got)
	}
}

func TestScope(t *testing.T) {
	ps := &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "gw", Generation: 3},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolDelta,
			Services: []xdsv1alpha1.ServiceSelection{
				{Names: []xdsv1alpha1.DNSLabel{"cart"}},
				{Namespace: "team-a", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}}},
				{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"shared": "true"}}},
			},
			Listener:         xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080), VirtualHosts: xdsv1alpha1.VirtualHostsVHDS},
			LocalityPriority: xdsv1alpha1.LocalityPrioritySameZone,
		},
	}
	sc, err := Scope(ps)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Key != (model.Key{Namespace: "shop", Name: "gw"}) || sc.Generation != 3 || sc.Protocol != model.Delta ||
		sc.Listener != (model.Listener{Mode: model.ListenerEnvoy, Port: 10080, VHDS: true}) || len(sc.Selections) != 3 || !sc.ZonePriority {
		t.Fatalf("scope converted to %+v", sc)
	}
	cart := &model.Service{Key: model.Key{Namespace: "shop", Name: "cart"}}
	web := &model.Service{Key: model.Key{Namespace: "team-a", Name: "web"}, Labels: map[string]string{"tier": "web"}}
	other := &model.Service{Key: model.Key{Namespace: "team-b", Name: "x"}}
	for _, tc := range []struct {
		svc      *model.Service
		nsLabels map[string]string
		want     bool
	}{
		{cart, nil, true}, // names default to the scope's namespace
		{&model.Service{Key: model.Key{Namespace: "shop", Name: "checkout"}}, nil, false},
		{web, nil, true},
		{&model.Service{Key: model.Key{Namespace: "team-a", Name: "db"}}, nil, false},
		{other, map[string]string{"shared": "true"}, true},
		{other, map[string]string{"shared": "false"}, false},
	} {
		if got := sc.Selects(tc.svc, tc.nsLabels, true); got != tc.want {
			t.Errorf("Selects(%s, ns labels %v) = %v, want %v", tc.svc.Key, tc.nsLabels, got, tc.want)
		}
	}
	if sc.Selects(other, nil, false) {
		t.Error("a namespace selector matched a namespace that does not exist")
	}
}

func TestScopeWithInvalidSelectorNamesIt(t *testing.T) {
	ps := &xdsv1alpha1.ProxyScope{Spec: xdsv1alpha1.ProxyScopeSpec{Services: []xdsv1alpha1.ServiceSelection{
		{Names: []xdsv1alpha1.DNSLabel{"a"}},
		{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}}}},
	}}}
	_, err := Scope(ps)
	if err == nil || !strings.HasPrefix(err.Error(), "spec.services[1].selector: ") {
		t.Errorf("want an error naming spec.services[1].selector, got %v", err)
	}
}

// A transition the status shows in progress reaches the model, so that a
// restarted replica keeps serving it; one from the protocol the spec names
// again is over.
func TestScopeCarriesTheTransitionOnItsStatus(t *testing.T) {
	until := metav1.NewTime(time.Date(2026, 12, 2, 10, 10, 0, 0, time.UTC))
	ps := &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "gw"},
		Spec:       xdsv1alpha1.ProxyScopeSpec{Protocol: xdsv1alpha1.ProtocolDelta, ProtocolTransitionSeconds: ptr.To[int32](120)},
		Status:     xdsv1alpha1.ProxyScopeStatus{ProtocolTransition: &xdsv1alpha1.ProtocolTransition{From: xdsv1alpha1.ProtocolSotW, Until: until, Proxies: 3}},
	}
	sc, err := Scope(ps)
	if err != nil {
		t.Fatal(err)
	}
	want := model.Transition{From: model.SotW, Since: until.Add(-2 * time.Minute), Until: until.Time}
	if sc.Transition == nil || *sc.Transition != want {
		t.Errorf("transition %+v, want %+v", sc.Transition, want)
	}

	ps.Spec.Protocol = xdsv1alpha1.ProtocolSotW
	if sc, _ := Scope(ps); sc.Transition != nil {
		t.Errorf("a transition from the spec's own protocol was carried: %+v", sc.Transition)
	}
	ps.Status.ProtocolTransition = nil
	if sc, _ := Scope(ps); sc.Transition != nil {
		t.Errorf("a scope without a transition on its status has %+v", sc.Transition)
	}
}

// TestServiceRepairsInvalidUTF8: strings the API server does not check
// (an endpoint's zone) or that a client may still send broken reach Envoy
// resources, whose protobuf strings must be UTF-8. Each run of bad bytes
// becomes one U+FFFD; ports still match by their (equally repaired) names.
func TestServiceRepairsInvalidUTF8(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "h\xfftp", Port: 80, TargetPort: intstr.FromString("w\xc3b"), AppProtocol: ptr.To("gr\xffpc")},
		}},
	}
	slices := []*discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("h\xfftp"), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Zone: ptr.To("us-\xff\xfeeast"), NodeName: ptr.To("n\xc3")}},
	}}
	got := Service(svc, slices)
	p, e := got.Ports[0], got.Endpoints[0]
	if p.Name != "h\uFFFDtp" || p.TargetPortName != "w\uFFFDb" || p.AppProtocol != "gr\uFFFDpc" {
		t.Errorf("port converted to %+v", p)
	}
	if e.Zone != "us-\uFFFDeast" || e.Node != "n\uFFFD" || len(e.Ports) != 1 || e.Ports[0].Name != p.Name {
		t.Errorf("endpoint converted to %+v", e)
	}
	ext := Service(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "pay\xff.example.com"}}, nil)
	if ext.ExternalName != "pay\uFFFD.example.com" {
		t.Errorf("ExternalName converted to %q", ext.ExternalName)
	}
}

// TestServiceTopology checks that the Service's trafficDistribution and its
// endpoints' hints reach the model, hints sorted and deduplicated, and that
// Topology says which Services Kubernetes routes by them.
func TestServiceTopology(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec:       corev1.ServiceSpec{TrafficDistribution: ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)},
	}
	slices := []*discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, Zone: ptr.To("b"), NodeName: ptr.To("n1"), Hints: &discoveryv1.EndpointHints{
				ForZones: []discoveryv1.ForZone{{Name: "b"}, {Name: "a"}, {Name: "b"}},
				ForNodes: []discoveryv1.ForNode{{Name: "n1"}},
			}},
			{Addresses: []string{"10.0.0.2"}, Zone: ptr.To("a")},
		},
	}}
	got := Service(svc, slices)
	if got.TrafficDistribution != "PreferSameNode" || !got.Topology() {
		t.Errorf("trafficDistribution %q, Topology %v", got.TrafficDistribution, got.Topology())
	}
	e1, e2 := got.Endpoints[0], got.Endpoints[1]
	if !reflect.DeepEqual(e1.ForZones, []string{"a", "b"}) || !reflect.DeepEqual(e1.ForNodes, []string{"n1"}) || e2.ForZones != nil || e2.ForNodes != nil {
		t.Errorf("hints converted to %v %v, %v %v", e1.ForZones, e1.ForNodes, e2.ForZones, e2.ForNodes)
	}
	svc.Spec.TrafficDistribution = nil
	if !Service(svc, slices).Topology() {
		t.Error("a Service with hints and no trafficDistribution: Topology false")
	}
	slices[0].Endpoints[0].Hints = nil
	if Service(svc, slices).Topology() {
		t.Error("a Service without hints or trafficDistribution: Topology true")
	}
}

// TestGrants checks which ReferenceGrant entries count: from ProxyScopes of
// a namespace, to core Services by name or all; grants of one namespace add
// up, and one for all Services covers the named ones.
func TestGrants(t *testing.T) {
	from := func(group, kind, ns string) gatewayv1beta1.ReferenceGrantFrom {
		return gatewayv1beta1.ReferenceGrantFrom{Group: gatewayv1beta1.Group(group), Kind: gatewayv1beta1.Kind(kind), Namespace: gatewayv1beta1.Namespace(ns)}
	}
	to := func(group, kind, name string) gatewayv1beta1.ReferenceGrantTo {
		r := gatewayv1beta1.ReferenceGrantTo{Group: gatewayv1beta1.Group(group), Kind: gatewayv1beta1.Kind(kind)}
		if name != "" {
			r.Name = ptr.To(gatewayv1beta1.ObjectName(name))
		}
		return r
	}
	grant := func(f []gatewayv1beta1.ReferenceGrantFrom, to ...gatewayv1beta1.ReferenceGrantTo) gatewayv1beta1.ReferenceGrant {
		return gatewayv1beta1.ReferenceGrant{Spec: gatewayv1beta1.ReferenceGrantSpec{From: f, To: to}}
	}
	ps := "xds.scopeplane.dev"
	got := Grants([]gatewayv1beta1.ReferenceGrant{
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(ps, "ProxyScope", "a"), from(ps, "ProxyScope", "b")}, to("", "Service", "api")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(ps, "ProxyScope", "a")}, to("", "Service", "db")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(ps, "ProxyScope", "b")}, to("", "Service", "")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from("gateway.networking.k8s.io", "HTTPRoute", "c"), from(ps, "Gateway", "d")}, to("", "Service", "")),
		grant([]gatewayv1beta1.ReferenceGrantFrom{from(ps, "ProxyScope", "e")}, to("", "Secret", ""), to("apps", "Service", "api")),
	})
	want := model.Grants{"a": {"api": {}, "db": {}}, "b": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Grants = %v, want %v", got, want)
	}
	for _, c := range []struct {
		from, name string
		want       bool
	}{{"a", "api", true}, {"a", "web", false}, {"b", "web", true}, {"c", "api", false}, {"e", "api", false}} {
		if got.Permits(c.from, c.name) != c.want {
			t.Errorf("Permits(%s, %s) = %v, want %v", c.from, c.name, !c.want, c.want)
		}
	}
}
