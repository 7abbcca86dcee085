package controlplane_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
)

// zonedSlice lists one backend on 127.0.0.1:port (through
// whoami.SliceAddress) in zone, hinted for that zone when hinted is set, as
// the EndpointSlice controller hints a PreferClose Service.
func zonedSlice(ns, name, svc string, port int, zone string, hinted bool) *discoveryv1.EndpointSlice {
	s := loopbackSlice(ns, name, svc, port)
	s.Endpoints[0].Zone = ptr.To(zone)
	if hinted {
		s.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
	}
	return s
}

// zonedClient is grpc-go's xDS client with the scope's bootstrap, declaring
// that it runs in zone ("" for none) as node.locality.zone.
func zonedClient(t *testing.T, ns, scope, zone, target string) *grpc.ClientConn {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(bootstrapOf(t, ns, scope, bootstrap.GRPCKey), &b); err != nil {
		t.Fatal(err)
	}
	if zone != "" {
		b["node"].(map[string]any)["locality"] = map[string]any{"zone": zone}
	}
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(raw)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// spread makes n RPCs and returns the backends that answered, sorted and
// deduplicated, and a trace of them in order.
func spread(conn *grpc.ClientConn, n int) ([]string, string) {
	var got, trace []string
	for range n {
		who, err := call(conn)
		if err != nil {
			who = "error: " + err.Error()
		}
		got = append(got, who)
		trace = append(trace, who)
	}
	slices.Sort(got)
	return slices.Compact(got), strings.Join(trace, " ")
}

// TestGRPCClientsStayInTheirZone drives grpc-go's xDS clients in two zones
// (and one in none) through a PreferClose Service whose EndpointSlices
// carry zone hints: each zoned client's RPCs stay on its zone's backend,
// the unzoned one reaches both, and when a zone's endpoint stops being
// ready its clients fail over to the other zone, as kube-proxy does; when
// it is ready again they come back. A second Service asks for nothing, and
// the scope's localityPriority: SameZone makes its zone-a client prefer
// zone-a and fail over when zone-a's backend dies, without a push.
func TestGRPCClientsStayInTheirZone(t *testing.T) {
	backends := map[string]*whoami.Backend{}
	for _, name := range []string{"zonal-a", "zonal-b", "plain-a", "plain-b"} {
		b, err := whoami.Start(name)
		if err != nil {
			t.Fatal(err)
		}
		backends[name] = b
		t.Cleanup(b.Stop)
	}
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "topo"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "topo", Name: "zonal"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}},
				TrafficDistribution: ptr.To(corev1.ServiceTrafficDistributionPreferClose)},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "topo", Name: "plain"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
		},
		zonedSlice("topo", "zonal-a", "zonal", backends["zonal-a"].Port, "zone-a", true),
		zonedSlice("topo", "zonal-b", "zonal", backends["zonal-b"].Port, "zone-b", true),
		zonedSlice("topo", "plain-a", "plain", backends["plain-a"].Port, "zone-a", false),
		zonedSlice("topo", "plain-b", "plain", backends["plain-b"].Port, "zone-b", false),
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "topo", Name: "grpc"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services:         []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"zonal", "plain"}}},
				Listener:         xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
				LocalityPriority: xdsv1alpha1.LocalityPrioritySameZone,
			},
		},
	)
	const target = "xds:///zonal.topo.svc.cluster.local:50051"
	inA := zonedClient(t, "topo", "grpc", "zone-a", target)
	inB := zonedClient(t, "topo", "grpc", "zone-b", target)
	nowhere := zonedClient(t, "topo", "grpc", "", target)
	expect := func(what string, conn *grpc.ClientConn, want ...string) {
		t.Helper()
		var trace string
		testkit.Eventually(t, what, func() (bool, string) {
			var got []string
			got, trace = spread(conn, 12)
			return slices.Equal(got, want), trace
		})
		t.Logf("%s: %s", what, trace)
	}
	expect("zone-a's client stays in zone-a", inA, "zonal-a")
	expect("zone-b's client stays in zone-b", inB, "zonal-b")
	expect("the client with no zone reaches both zones", nowhere, "zonal-a", "zonal-b")

	// zone-a empties: its only endpoint is no longer ready. No ready
	// endpoint is hinted for zone-a, so its clients get every endpoint.
	setReady := func(name string, ready bool) {
		mutate(t, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "topo", Name: name}}, func(s *discoveryv1.EndpointSlice) {
			s.Endpoints[0].Conditions.Ready = ptr.To(ready)
		})
	}
	setReady("zonal-a", false)
	expect("zone-a's client fails over to zone-b", inA, "zonal-b")
	expect("zone-b's client stays in zone-b", inB, "zonal-b")
	setReady("zonal-a", true)
	expect("zone-a's client is back in zone-a", inA, "zonal-a")

	// The Service that asks for nothing, under localityPriority: SameZone.
	plainA := zonedClient(t, "topo", "grpc", "zone-a", "xds:///plain.topo.svc.cluster.local:50051")
	expect("zone-a's client of the plain Service prefers zone-a", plainA, "plain-a")
	backends["plain-a"].Stop() // zone-a's backend dies; its endpoint stays ready
	expect("it fails over to priority 1, zone-b, without a push", plainA, "plain-b")
}
