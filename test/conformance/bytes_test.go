package conformance

import (
	"fmt"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestEndpointChangeBytesAt1000Services measures what one endpoint change
// costs on the wire in a scope of 1,000 Services, in both protocols, and
// holds it to 1.2× the smallest valid response that carries only the
// changed assignment (its name, version, type URL and a nonce).
func TestEndpointChangeBytesAt1000Services(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := newPlane(t)
			for i := range 1000 {
				p.Catalog.UpsertService(testkit.Service("shop", fmt.Sprintf("svc-%04d", i), "10.0.0.1", "10.0.0.2", "10.0.0.3"))
			}
			p.Catalog.UpsertScope(envoyScope("shop", "gw", pr.scope))
			p.Sync()
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			px.wait("the initial sync", func(c *adsclient.Client) bool {
				vhosts := len(c.State(xdstype.VirtualHost.URL())) == 1000 || pr.client == adsclient.SotW
				return len(c.State(xdstype.Endpoint.URL())) == 1000 && len(c.State(xdstype.Route.URL())) == 1 && vhosts
			})
			before := len(px.settled())
			initial := px.Stats().Bytes

			p.Catalog.UpsertService(testkit.Service("shop", "svc-0500", "10.0.0.1", "10.0.0.2", "10.0.0.9"))
			p.Sync()
			px.wait("the change", func(c *adsclient.Client) bool { return len(c.Events()) > before })
			evs := px.settled()[before:]
			if len(evs) != 1 || len(evs[0].Names) != 1 {
				t.Fatalf("one endpoint change sent %v", summary(evs))
			}
			got := evs[0].Bytes
			held := px.State(xdstype.Endpoint.URL())["shop/svc-0500:80"]
			limit := minimalResponse(pr.client, held, evs[0])
			t.Logf("%s, 1,000 Services: initial sync %d bytes; one endpoint change %d bytes (limit %d, %.2f×)",
				pr.name, initial, got, limit, float64(got)/float64(limit))
			if float64(got) > 1.2*float64(limit) {
				t.Errorf("one endpoint change cost %d bytes, more than 1.2× the limit of %d", got, limit)
			}

			// A Service added: SotW resends every cluster and the route
			// configuration with every virtual host; delta sends the
			// Service's cluster, assignment and virtual host (VHDS).
			before = len(evs) + before
			p.Catalog.UpsertService(testkit.Service("shop", "svc-new", "10.0.0.1"))
			p.Sync()
			px.wait("the new Service", func(c *adsclient.Client) bool { return len(c.State(xdstype.Cluster.URL())) == 1001 })
			evs = px.settled()
			added, resources := 0, 0
			for _, e := range evs[before:] {
				added += e.Bytes
				resources += len(e.Names)
			}
			// And removed again: delta sends three removals.
			before = len(evs)
			p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "svc-new"})
			p.Sync()
			px.wait("the Service gone", func(c *adsclient.Client) bool { return len(c.State(xdstype.Cluster.URL())) == 1000 })
			removed, removals := 0, 0
			for _, e := range px.settled()[before:] {
				removed += e.Bytes
				removals += len(e.Removed)
			}
			t.Logf("%s, 1,000 Services: one Service added %d bytes in %d resources, removed %d bytes", pr.name, added, resources, removed)
			if pr.client == adsclient.Delta {
				if resources != 3 || removals != 3 {
					t.Errorf("delta sent %d resources for one added Service and %d removals for it removed, want 3 and 3", resources, removals)
				}
				if added > 10<<10 || removed > 10<<10 {
					t.Errorf("delta sent %d bytes for one added Service and %d for it removed, want at most 10 KB each", added, removed)
				}
			}
		})
	}
}

// minimalResponse is the size of the smallest valid response carrying only
// the changed resource.
func minimalResponse(p adsclient.Protocol, h adsclient.Held, e adsclient.Event) int {
	res := &anypb.Any{TypeUrl: h.Resource.GetTypeUrl(), Value: h.Resource.GetValue()}
	if p == adsclient.SotW {
		return proto.Size(&discoveryv3.DiscoveryResponse{VersionInfo: e.Version, TypeUrl: e.TypeURL, Nonce: e.Nonce, Resources: []*anypb.Any{res}})
	}
	return proto.Size(&discoveryv3.DeltaDiscoveryResponse{TypeUrl: e.TypeURL, Nonce: e.Nonce, Resources: []*discoveryv3.Resource{{
		Name: e.Names[0], Version: h.Version, Resource: res,
	}}})
}
