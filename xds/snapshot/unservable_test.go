package snapshot

import (
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestUnservableResourceIsHeldBackAlone: a resource that cannot be
// marshalled (a string that is not UTF-8) or fails Envoy's validation (a
// negative connect timeout) is held back by itself, keeping its previous
// version; the rest of its Service and of the scope is served; the scope's
// resolution names it until it is servable again or gone.
func TestUnservableResourceIsHeldBackAlone(t *testing.T) {
	cluster := func(name string, timeout int64) *clusterv3.Cluster {
		return &clusterv3.Cluster{Name: name, ConnectTimeout: durationpb.New(time.Duration(timeout) * time.Second)}
	}
	cla := func(name, zone string) *endpointv3.ClusterLoadAssignment {
		return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{Locality: &corev3.Locality{Zone: zone}}}}
	}
	store := NewStore()
	b := NewBuilder(catalog.New(), store, 0)
	b.Apply([]catalog.Update{{Key: key, Scope: spec(), Reset: true, Upserted: catalog.Set{
		xdstype.Cluster:  {"shop/web:80": cluster("shop/web:80", 1), "shop/api:80": cluster("shop/api:80", 1)},
		xdstype.Endpoint: {"shop/web:80": cla("shop/web:80", "z1"), "shop/api:80": cla("shop/api:80", "z1")},
	}}})
	sc := store.Get(key)
	_, before, _ := read(sc)
	edsBefore := testutil.ToFloat64(metrics.UnservableResources.WithLabelValues(xdstype.Endpoint.URL()))
	cdsBefore := testutil.ToFloat64(metrics.UnservableResources.WithLabelValues(xdstype.Cluster.URL()))

	// The catalog sends each resource's provenance with it, which the
	// resolution names the Service by.
	web := func(port int32) *model.Origin {
		return &model.Origin{Service: model.Key{Namespace: "shop", Name: "web"}, Port: port}
	}
	api := &model.Origin{Service: model.Key{Namespace: "shop", Name: "api"}, Port: 80}
	b.Apply([]catalog.Update{{Key: key, Scope: spec(), Upserted: catalog.Set{
		xdstype.Cluster:  {"shop/web:81": cluster("shop/web:81", 1), "shop/web:82": cluster("shop/web:82", -1)},
		xdstype.Endpoint: {"shop/web:80": cla("shop/web:80", "z\xff"), "shop/web:81": cla("shop/web:81", "z1"), "shop/api:80": cla("shop/api:80", "z2")},
	}, From: [xdstype.Count]map[string]*model.Origin{
		xdstype.Cluster:  {"shop/web:81": web(81), "shop/web:82": web(82)},
		xdstype.Endpoint: {"shop/web:80": web(80), "shop/web:81": web(81), "shop/api:80": api},
	}}})
	rev, after, _ := read(sc)
	ep, cl := func(n string) string { return "1/" + n }, func(n string) string { return "0/" + n }
	if after[ep("shop/web:80")] != before[ep("shop/web:80")] {
		t.Error("the assignment that cannot be marshalled was replaced; it must keep its previous version")
	}
	if _, ok := after[cl("shop/web:82")]; ok {
		t.Error("a new cluster that fails validation is served")
	}
	if after[cl("shop/web:81")] == "" || after[ep("shop/web:81")] == "" {
		t.Error("the Service's servable resources were held back with the bad ones")
	}
	if after[ep("shop/api:80")] == before[ep("shop/api:80")] {
		t.Error("another Service's change was held back")
	}
	held := unservable(sc)
	if len(held) != 2 ||
		held[0].Type != xdstype.Cluster || held[0].Name != "shop/web:82" || !strings.Contains(held[0].Reason, "ConnectTimeout") ||
		held[1].Type != xdstype.Endpoint || held[1].Name != "shop/web:80" || !strings.Contains(held[1].Reason, "UTF-8") ||
		held[0].Service != (model.Key{Namespace: "shop", Name: "web"}) || held[1].Service != held[0].Service {
		t.Fatalf("resolution's unservable resources: %+v", held)
	}
	if d := testutil.ToFloat64(metrics.UnservableResources.WithLabelValues(xdstype.Endpoint.URL())) - edsBefore; d != 1 {
		t.Errorf("scopeplane_snapshot_unservable_resources_total for assignments grew by %v, want 1", d)
	}
	if d := testutil.ToFloat64(metrics.UnservableResources.WithLabelValues(xdstype.Cluster.URL())) - cdsBefore; d != 1 {
		t.Errorf("scopeplane_snapshot_unservable_resources_total for clusters grew by %v, want 1", d)
	}

	// Repaired, the assignment is served and no longer held back.
	b.Apply([]catalog.Update{upsert(xdstype.Endpoint, map[string]proto.Message{"shop/web:80": cla("shop/web:80", "z3")})})
	if r, v, _ := read(sc); r == rev || v[ep("shop/web:80")] == before[ep("shop/web:80")] {
		t.Error("the repaired assignment was not served")
	}
	if held := unservable(sc); len(held) != 1 || held[0].Name != "shop/web:82" {
		t.Errorf("after the repair: %+v", held)
	}
	// Removed, the cluster is no longer reported.
	u := catalog.Update{Key: key, Scope: spec()}
	u.Removed[xdstype.Cluster] = []string{"shop/web:82"}
	b.Apply([]catalog.Update{u})
	if held := unservable(sc); len(held) != 0 {
		t.Errorf("after the removal: %+v", held)
	}
	// A reset that no longer holds a held-back name forgets it.
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"shop/db:80": cluster("shop/db:80", 0)})})
	if held := unservable(sc); len(held) != 1 {
		t.Fatalf("a zero connect timeout was not held back: %+v", held)
	}
	b.Apply([]catalog.Update{{Key: key, Scope: spec(), Reset: true, Upserted: catalog.Set{xdstype.Cluster: {"shop/web:80": cluster("shop/web:80", 1)}}}})
	if held := unservable(sc); len(held) != 0 {
		t.Errorf("after a reset: %+v", held)
	}
}

func unservable(sc *Snapshot) []Unservable {
	var out []Unservable
	sc.Read(func(v View) { out = v.Resolution().Unservable })
	return out
}
