package snapshot

import (
	"fmt"
	"runtime"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// BenchmarkApplyEndpointChange measures versioning one changed assignment
// into a scope that holds n clusters and assignments: marshal once, hash,
// log, wake. It must not grow with n.
func BenchmarkApplyEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("resources=%d", n), func(b *testing.B) {
			store := NewStore()
			bld := NewBuilder(catalog.New(), store, 0)
			cs, es := map[string]proto.Message{}, map[string]proto.Message{}
			for i := range n {
				name := fmt.Sprintf("ns/svc-%d:80", i)
				cs[name] = &clusterv3.Cluster{Name: name}
				es[name] = &endpointv3.ClusterLoadAssignment{ClusterName: name}
			}
			bld.Apply([]catalog.Update{{Key: key, Scope: spec(), Reset: true, Upserted: catalog.Set{xdstype.Cluster: cs, xdstype.Endpoint: es}}})
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				cla := &endpointv3.ClusterLoadAssignment{ClusterName: "ns/svc-7:80", Endpoints: make([]*endpointv3.LocalityLbEndpoints, i%3+1)}
				bld.Apply([]catalog.Update{upsert(xdstype.Endpoint, map[string]proto.Message{"ns/svc-7:80": cla})})
			}
		})
	}
}

// heapHeld keeps BenchmarkHeap's last store alive, so that the profile
// -memprofile writes after the benchmark shows what it holds.
var heapHeld *Store

// BenchmarkHeap measures the live heap the snapshots hold per Service once
// the builder has applied the catalog's first Take of the operator's
// world-scale teams layout (see testkit.WorldService): the encoded
// resources, their versions and indexes, not the catalog (B/service).
func BenchmarkHeap(b *testing.B) {
	const n, scopes = 20000, 100
	svcs := testkit.WorldServices(n)
	var grown int64
	for range b.N {
		heapHeld = nil
		c := catalog.New()
		for k := range scopes {
			c.UpsertScope(testkit.WorldTeam(k))
		}
		for _, svc := range svcs {
			c.UpsertService(svc)
		}
		us := c.Take()
		grown = testkit.HeapGrowth(func() {
			store := NewStore()
			NewBuilder(c, store, 0).Apply(us)
			heapHeld = store
		})
		runtime.KeepAlive(c)
	}
	b.ReportMetric(float64(grown)/n, "B/service")
}
