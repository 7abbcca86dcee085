package conformance

import (
	"fmt"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestEveryServiceIsRoutable checks, in both protocols, that a proxy routes
// every Host form of every Service of its scope to that Service's cluster,
// whose endpoints it holds, as Envoy assembles its route table: a SotW
// proxy from the virtual hosts inline in the route configuration, a delta
// proxy from the ones VHDS sent, filed under the route configuration named
// before the last slash of their names, or inline when the scope does not
// ask for VHDS (the default). A Service added becomes routable and one
// removed stops being routable, while with VHDS the route configuration
// itself is sent once, at the start.
func TestEveryServiceIsRoutable(t *testing.T) {
	cases := []struct {
		name   string
		client adsclient.Protocol
		scope  model.Protocol
		vhds   bool
	}{{"SotW", adsclient.SotW, model.SotW, true}, {"Delta", adsclient.Delta, model.Delta, true}, {"Delta inline", adsclient.Delta, model.Delta, false}}
	for _, pr := range cases {
		t.Run(pr.name, func(t *testing.T) {
			p := newPlane(t)
			var services []string
			for i := range 50 {
				services = append(services, fmt.Sprintf("svc-%02d", i))
				p.Catalog.UpsertService(testkit.Service("shop", services[i], "10.0.0.1"))
			}
			sc := envoyScope("shop", "gw", pr.scope)
			sc.Listener.VHDS = pr.vhds
			p.Catalog.UpsertScope(sc)
			p.Sync()
			px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			routable := func(want, gone []string) func(*adsclient.Client) bool {
				return func(c *adsclient.Client) bool { return routeErr(c, want, gone) == nil }
			}
			check := func(what string, want, gone []string) {
				t.Helper()
				px.wait(what, routable(want, gone))
				px.settled()
				if err := routeErr(px.Client, want, gone); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			}
			check("every Service routable", services, nil)

			p.Catalog.UpsertService(testkit.Service("shop", "svc-new", "10.0.0.7"))
			p.Sync()
			services = append(services, "svc-new")
			check("the new Service routable", services, nil)

			p.Catalog.DeleteService(model.Key{Namespace: "shop", Name: "svc-03"})
			p.Sync()
			kept := append(append([]string(nil), services[:3]...), services[4:]...)
			check("the removed Service unroutable", kept, []string{"svc-03"})

			routes := 0
			for _, e := range px.Events() {
				if e.TypeURL == xdstype.Route.URL() && len(e.Names) > 0 {
					routes++
				}
			}
			want := 3 // the whole route table, for each change
			if pr.vhds && pr.scope == model.Delta {
				want = 1
			}
			if routes != want {
				t.Errorf("the route configuration was sent %d times, want %d (%s)", routes, want, pr.name)
			}
		})
	}
}

// routeErr says what keeps the proxy from routing every Host form of each
// Service of want (in namespace shop, port 80) to its cluster with
// endpoints, or routes a Host of gone anywhere; nil when nothing does.
func routeErr(c *adsclient.Client, want, gone []string) error {
	rcs := c.State(xdstype.Route.URL())
	held, ok := rcs["http-10080"]
	if !ok || held.Resource == nil {
		return fmt.Errorf("no route configuration http-10080 (held: %v)", keys(rcs))
	}
	var rc routev3.RouteConfiguration
	if err := held.Resource.UnmarshalTo(&rc); err != nil {
		return err
	}
	vhosts := rc.GetVirtualHosts()
	if rc.GetVhds() != nil {
		if len(vhosts) != 0 {
			return fmt.Errorf("route configuration %s names VHDS and carries %d virtual hosts", rc.GetName(), len(vhosts))
		}
		for name, h := range c.State(xdstype.VirtualHost.URL()) {
			if name[:strings.LastIndexByte(name, '/')+1] != rc.GetName()+"/" || h.Resource == nil {
				continue
			}
			vh := new(routev3.VirtualHost)
			if err := h.Resource.UnmarshalTo(vh); err != nil {
				return err
			}
			if vh.GetName() != name {
				return fmt.Errorf("VHDS resource %s holds virtual host %s: Envoy replaces and removes it by name", name, vh.GetName())
			}
			vhosts = append(vhosts, vh)
		}
	}
	byDomain := map[string]*routev3.VirtualHost{}
	for _, vh := range vhosts {
		for _, d := range vh.GetDomains() {
			if other := byDomain[d]; other != nil {
				return fmt.Errorf("domain %s in virtual hosts %s and %s: Envoy rejects the route configuration", d, other.GetName(), vh.GetName())
			}
			byDomain[d] = vh
		}
	}
	clusters, assignments := c.State(xdstype.Cluster.URL()), c.State(xdstype.Endpoint.URL())
	hosts := func(svc string) []string {
		return []string{svc, svc + ":80", svc + ".shop", svc + ".shop.svc:80", svc + ".shop.svc.cluster.local", svc + ".shop.svc.cluster.local:80"}
	}
	for _, svc := range want {
		for _, host := range hosts(svc) {
			vh := byDomain[host]
			if vh == nil {
				return fmt.Errorf("host %s matches no virtual host", host)
			}
			cluster := vh.GetRoutes()[0].GetRoute().GetCluster()
			if cluster != "shop/"+svc+":80" {
				return fmt.Errorf("host %s routes to cluster %q", host, cluster)
			}
			cla, ok := assignments[cluster]
			if _, known := clusters[cluster]; !known || !ok || cla.Resource == nil {
				return fmt.Errorf("host %s routes to %s, whose cluster or assignment the proxy lacks", host, cluster)
			}
			var a endpointv3.ClusterLoadAssignment
			if err := cla.Resource.UnmarshalTo(&a); err != nil {
				return fmt.Errorf("host %s: assignment %s: %w", host, cluster, err)
			}
			if len(a.GetEndpoints()) == 0 {
				return fmt.Errorf("host %s: assignment %s has no endpoints", host, cluster)
			}
		}
	}
	for _, svc := range gone {
		for _, host := range hosts(svc) {
			if vh := byDomain[host]; vh != nil {
				return fmt.Errorf("host %s of a removed Service still routes, by %s", host, vh.GetName())
			}
		}
	}
	return nil
}
