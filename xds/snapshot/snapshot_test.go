package snapshot

import (
	"fmt"
	"hash/fnv"
	"sort"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var key = model.Key{Namespace: "shop", Name: "gw"}

func spec() *model.Scope { return &model.Scope{Key: key, Protocol: model.SotW} }

func upsert(t xdstype.Type, msgs map[string]proto.Message) catalog.Update {
	u := catalog.Update{Key: key, Scope: spec()}
	u.Upserted[t] = msgs
	return u
}

func read(sc *Snapshot) (rev uint64, versions map[string]string, typeVersions [xdstype.Count]string) {
	versions = map[string]string{}
	sc.Read(func(v View) {
		rev = v.Rev()
		for t := range xdstype.Count {
			typeVersions[t] = v.TypeVersion(t)
			v.All(t, func(r *Resource) { versions[fmt.Sprint(int(t), "/", r.Name)] = r.Version })
		}
	})
	return
}

func changed(sc *Snapshot, since uint64, t xdstype.Type) ([]string, bool) {
	var out []string
	var ok bool
	sc.Read(func(v View) { ok = v.ChangedSince(since, t, func(n string) { out = append(out, n) }) })
	sort.Strings(out)
	return out, ok
}

func TestVersionsFollowContentAndEndpointsFollowTheirCluster(t *testing.T) {
	store := NewStore()
	b := NewBuilder(catalog.New(), store, 0)
	cla := func(n int) *endpointv3.ClusterLoadAssignment {
		return &endpointv3.ClusterLoadAssignment{ClusterName: "a", Endpoints: make([]*endpointv3.LocalityLbEndpoints, n)}
	}
	c1 := &clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(1e9)}
	b.Apply([]catalog.Update{{Key: key, Scope: spec(), Reset: true, Upserted: catalog.Set{
		xdstype.Cluster:  {"a": c1},
		xdstype.Endpoint: {"a": cla(0)},
	}}})
	sc := store.Get(key)
	rev1, v1, tv1 := read(sc)

	// The same content again changes nothing: no revision, no wake-up.
	var wake <-chan struct{}
	sc.Read(func(v View) { wake = v.Wake() })
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"a": proto.Clone(c1)})})
	if rev, _, _ := read(sc); rev != rev1 {
		t.Errorf("an unchanged resource moved the revision from %d to %d", rev1, rev)
	}
	select {
	case <-wake:
		t.Error("an unchanged resource woke the streams")
	default:
	}

	// A cluster change re-versions its assignment even though the
	// assignment's content is the same, so Envoy can finish warming.
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"a": &clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(2e9)}})})
	rev2, v2, tv2 := read(sc)
	select {
	case <-wake:
	default:
		t.Error("a change did not wake the streams")
	}
	if rev2 != rev1+1 || v2["0/a"] == v1["0/a"] || v2["1/a"] == v1["1/a"] {
		t.Errorf("after a cluster change: rev %d→%d, cluster %s→%s, assignment %s→%s", rev1, rev2, v1["0/a"], v2["0/a"], v1["1/a"], v2["1/a"])
	}
	if tv2[xdstype.Cluster] == tv1[xdstype.Cluster] || tv2[xdstype.Endpoint] == tv1[xdstype.Endpoint] || tv2[xdstype.Listener] != tv1[xdstype.Listener] {
		t.Errorf("type versions %v → %v: want clusters and endpoints changed, listeners not", tv1, tv2)
	}
	if names, ok := changed(sc, rev1, xdstype.Endpoint); !ok || fmt.Sprint(names) != "[a]" {
		t.Errorf("endpoints changed since rev %d: %v %v", rev1, names, ok)
	}
	if names, _ := changed(sc, rev1, xdstype.Listener); len(names) != 0 {
		t.Errorf("listeners changed since rev %d: %v", rev1, names)
	}

	// An endpoint change re-versions the assignment only.
	b.Apply([]catalog.Update{upsert(xdstype.Endpoint, map[string]proto.Message{"a": cla(1)})})
	_, v3, tv3 := read(sc)
	if v3["0/a"] != v2["0/a"] || v3["1/a"] == v2["1/a"] || tv3[xdstype.Cluster] != tv2[xdstype.Cluster] {
		t.Errorf("an endpoint change moved %v → %v", v2, v3)
	}

	// Removal and deletion.
	b.Apply([]catalog.Update{{Key: key, Scope: spec(), Removed: [xdstype.Count][]string{xdstype.Endpoint: {"a"}}}})
	if _, v4, tv4 := read(sc); v4["1/a"] != "" || tv4[xdstype.Endpoint] != emptyVersion {
		t.Errorf("after removing the assignment: %v, type version %q", v4, tv4[xdstype.Endpoint])
	}
	sc.Read(func(v View) { wake = v.Wake() })
	b.Apply([]catalog.Update{{Key: key}})
	<-wake
	if store.Get(key) != nil {
		t.Error("a deleted scope is still in the store")
	}
	sc.Read(func(v View) {
		if v.Spec() != nil {
			t.Error("a deleted scope still has a spec")
		}
	})
}

func TestTypeVersionIsOrderIndependentAndResetRemovesTheRest(t *testing.T) {
	build := func(names ...string) (*Store, *Builder) {
		store := NewStore()
		b := NewBuilder(catalog.New(), store, 0)
		for _, n := range names {
			b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{n: &clusterv3.Cluster{Name: n}})})
		}
		return store, b
	}
	s1, _ := build("a", "b", "c")
	s2, b2 := build("c", "a", "b")
	_, _, tv1 := read(s1.Get(key))
	_, _, tv2 := read(s2.Get(key))
	if tv1[xdstype.Cluster] != tv2[xdstype.Cluster] {
		t.Errorf("the same set in another order has another version: %s vs %s", tv1[xdstype.Cluster], tv2[xdstype.Cluster])
	}
	b2.Apply([]catalog.Update{{Key: key, Scope: spec(), Reset: true, Upserted: catalog.Set{xdstype.Cluster: {"a": &clusterv3.Cluster{Name: "a"}}}}})
	if _, v, _ := read(s2.Get(key)); fmt.Sprint(v) != fmt.Sprint(map[string]string{"0/a": v["0/a"]}) {
		t.Errorf("after a reset to {a}: %v", v)
	}
}

func TestLogTrimmingFallsBackToFullComparison(t *testing.T) {
	store := NewStore()
	b := NewBuilder(catalog.New(), store, 0)
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"a": &clusterv3.Cluster{Name: "a"}})})
	sc := store.Get(key)
	rev0, _, _ := read(sc)
	for i := range 3000 {
		b.Apply([]catalog.Update{upsert(xdstype.Endpoint, map[string]proto.Message{"a": &endpointv3.ClusterLoadAssignment{ClusterName: fmt.Sprint(i)}})})
	}
	if _, ok := changed(sc, rev0, xdstype.Endpoint); ok {
		t.Error("a stream 3000 revisions behind was told the log still reaches it")
	}
	rev, _, _ := read(sc)
	if names, ok := changed(sc, rev-1, xdstype.Endpoint); !ok || fmt.Sprint(names) != "[a]" {
		t.Errorf("one revision behind: %v %v", names, ok)
	}
}

// TestRejectedScopeKeepsItsResolutionAndServesNothing checks the record a
// rejected spec leaves for the status, and that its deletion removes it.
func TestRejectedScopeKeepsItsResolutionAndServesNothing(t *testing.T) {
	b := NewBuilder(catalog.New(), NewStore(), 0)
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"a": &clusterv3.Cluster{Name: "a"}})})
	served := b.store.Get(key)
	b.Apply([]catalog.Update{{Key: key, Resolution: catalog.Resolution{Generation: 2, Invalid: "bad selector"}}})
	sc := b.store.Get(key)
	if sc == nil || sc == served {
		t.Fatal("a rejected scope must leave a fresh record in the store")
	}
	sc.Read(func(v View) {
		if v.Spec() != nil || v.Len(xdstype.Cluster) != 0 || v.Resolution().Invalid != "bad selector" || v.Resolution().Generation != 2 {
			t.Errorf("rejected scope: spec %v, %d clusters, resolution %+v", v.Spec(), v.Len(xdstype.Cluster), v.Resolution())
		}
	})
	served.Read(func(v View) {
		if v.Spec() != nil {
			t.Error("the previously served state still has a spec: its streams would go on")
		}
	})
	b.Apply([]catalog.Update{{Key: key}})
	if b.store.Get(key) != nil {
		t.Error("deleting a rejected scope left its record")
	}
}

// TestSotWBytesFollowsTheResources keeps the running total a full-state
// response is priced from equal to the sum over the resources it holds.
func TestSotWBytesFollowsTheResources(t *testing.T) {
	store := NewStore()
	b := NewBuilder(catalog.New(), store, 0)
	check := func(when string) {
		t.Helper()
		store.Get(key).Read(func(v View) {
			want := 0
			v.All(xdstype.Cluster, func(r *Resource) {
				if r.Size != proto.Size(r.Body()) {
					t.Errorf("%s: %s Size %d, encoded %d", when, r.Name, r.Size, proto.Size(r.Body()))
				}
				want += proto.Size(&discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{r.Body()}})
			})
			if got := v.SotWBytes(xdstype.Cluster); got != want {
				t.Errorf("%s: SotWBytes %d, sum of entries %d", when, got, want)
			}
		})
	}
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{
		"a": &clusterv3.Cluster{Name: "a"}, "b": &clusterv3.Cluster{Name: "b", ConnectTimeout: durationpb.New(3)},
	})})
	check("after adding a and b")
	b.Apply([]catalog.Update{upsert(xdstype.Cluster, map[string]proto.Message{"a": &clusterv3.Cluster{Name: "a", AltStatName: "longer now"}})})
	check("after changing a")
	u := catalog.Update{Key: key, Scope: spec()}
	u.Removed[xdstype.Cluster] = []string{"b"}
	b.Apply([]catalog.Update{u})
	check("after removing b")
}

// TestPairDigestIsFNVOfNameAndVersion pins a pair's part of a type's digest
// to what versions have always been made of (FNV-1a of name, a zero byte
// and version, so that versions proxies hold stay valid across an upgrade),
// the same from bytes as from strings.
func TestPairDigestIsFNVOfNameAndVersion(t *testing.T) {
	for _, p := range [][2]string{{"", ""}, {"default/a:80", "0123abcd"}, {"é", "\x00"}} {
		h := fnv.New64a()
		_, _ = h.Write([]byte(p[0] + "\x00" + p[1]))
		if got, gotBytes := PairDigest(p[0], p[1]), PairDigest([]byte(p[0]), []byte(p[1])); got != h.Sum64() || gotBytes != got {
			t.Errorf("PairDigest(%q, %q) = %x from strings, %x from bytes, want FNV-1a's %x", p[0], p[1], got, gotBytes, h.Sum64())
		}
	}
}
