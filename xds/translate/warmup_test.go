package translate

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
)

// TestWarmUp checks that a route configuration that routes to clusters the
// served one does not name is warmed up as the served one plus an entry
// per new cluster that no gRPC call matches, valid as Envoy validates it;
// that neither input is changed; and that nothing is warmed up when no
// cluster is new, or in Envoy mode.
func TestWarmUp(t *testing.T) {
	parent, backends := meshWorld()
	proxyless := Profile{Mode: model.ListenerProxylessGRPC}
	served := Service(parent, proxyless)
	final := RoutedService(parent, proxyless, &Routing{Routes: []*model.Route{canaryRoute()}, Backends: backends})
	servedCopy, finalCopy := proto.Clone(served.Routes[0]), proto.Clone(final.Routes[0])

	warm, needed, added := WarmUp(&served, &final)
	if !needed || !added {
		t.Fatalf("routes to new clusters: warm-up needed %v, clusters added %v", needed, added)
	}
	if !proto.Equal(served.Routes[0], servedCopy) || !proto.Equal(final.Routes[0], finalCopy) {
		t.Fatal("WarmUp changed its inputs")
	}
	if err := validateAll(warm.Resources); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range routesOf(t, warm, model.ListenerProxylessGRPC) {
		if r.GetMatch().GetPath() == NoCallPath {
			got = append(got, "warm-up "+r.GetRoute().GetCluster())
		} else {
			got = append(got, r.GetRoute().GetCluster())
		}
	}
	want := []string{"shop/reviews:9080@u0", "warm-up shop/reviews-v1:9080@u1", "warm-up shop/reviews-v2:9080@u2"}
	if !slices.Equal(got, want) {
		t.Fatalf("warm-up entries %q, want %q", got, want)
	}
	if &warm.Clusters[0] != &final.Clusters[0] || len(warm.Listeners) != len(final.Listeners) {
		t.Error("the warm-up's other resources are not the final translation's")
	}

	if !slices.Equal(warm.RoutesTo, final.RoutesTo) {
		t.Errorf("the warm-up routes to %v, want the final routes' %v", warm.RoutesTo, final.RoutesTo)
	}
	again, needed, added := WarmUp(&warm, &final)
	if !needed || added || !proto.Equal(again.Routes[0], warm.Routes[0]) {
		t.Errorf("from the warm-up, which names every cluster: needed %v (want true), added %v (want false), the same entries %v", needed, added, proto.Equal(again.Routes[0], warm.Routes[0]))
	}
	if _, needed, _ := WarmUp(&warm, &served); needed {
		t.Error("back to the Service's own cluster, which the warm-up's routes send calls to: warmed up")
	}
	back, needed, added := WarmUp(&final, &served)
	if !needed || !added || len(back.RoutesTo) != len(final.RoutesTo) {
		t.Errorf("back from the routes to the Service's own cluster: needed %v, added %v, routes to %v (want the routes' backends, which its entries still reach)", needed, added, back.RoutesTo)
	}
	envoy := Profile{Mode: model.ListenerEnvoy, Port: 10080}
	plain, routed := Service(parent, envoy), RoutedService(parent, envoy, &Routing{Routes: []*model.Route{canaryRoute()}, Backends: backends})
	if _, needed, _ := WarmUp(&plain, &routed); needed {
		t.Error("Envoy mode warmed up: Envoy builds clusters before routes use them")
	}
}
