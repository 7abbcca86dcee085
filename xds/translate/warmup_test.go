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

	warm, added := WarmUp(&served, &final)
	if !added {
		t.Fatal("routes to new clusters: nothing warmed up")
	}
	if !proto.Equal(served.Routes[0], servedCopy) || !proto.Equal(final.Routes[0], finalCopy) {
		t.Fatal("WarmUp changed its inputs")
	}
	if err := validateAll(warm.Resources); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range routesOf(t, warm, model.ListenerProxylessGRPC) {
		if r.GetMatch().GetPath() == WarmUpPath {
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

	if again, added := WarmUp(&warm, &final); added || again.Routes[0] != warm.Routes[0] {
		t.Errorf("from the warm-up, which names every cluster, nothing is warmed up and it stays served: added %v", added)
	}
	if _, added := WarmUp(&final, &served); !added {
		t.Error("back to the Service's own cluster, which the routes did not name: nothing warmed up")
	}
	envoy := Profile{Mode: model.ListenerEnvoy, Port: 10080}
	plain, routed := Service(parent, envoy), RoutedService(parent, envoy, &Routing{Routes: []*model.Route{canaryRoute()}, Backends: backends})
	if _, added := WarmUp(&plain, &routed); added {
		t.Error("Envoy mode warmed up: Envoy builds clusters before routes use them")
	}
}
