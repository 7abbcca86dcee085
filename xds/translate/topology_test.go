package translate

import (
	"slices"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/scopeplane/scopeplane/xds/model"
)

// addressesOf lists the addresses of an assignment's endpoints, sorted.
func addressesOf(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	slices.Sort(out)
	return out
}

func TestSeenFromWhereTheProxyRuns(t *testing.T) {
	sc, services := loadCase(t, "topology-hints")
	res := Translate(sc, services)
	const local = "shop/local:9100"
	cases := []struct {
		name string
		loc  model.Location
		want []string
	}{
		{"hinted Node", model.Location{Zone: "zone-a", Node: "node-1"}, []string{"10.0.1.11"}},
		{"other Node of a hinted zone", model.Location{Zone: "zone-a", Node: "node-9"}, []string{"10.0.1.11", "10.0.1.12"}},
		{"zone without hints", model.Location{Zone: "zone-c"}, []string{"10.0.1.11", "10.0.1.12", "10.0.2.11"}},
		{"nowhere known", model.Location{}, []string{"10.0.1.11", "10.0.1.12", "10.0.2.11"}},
	}
	for _, c := range cases {
		seen := res.Seen(c.loc)
		if seen.Places != nil {
			t.Errorf("%s: the view has places of its own", c.name)
		}
		if len(seen.Endpoints) != len(res.Endpoints) || !slices.Equal(seen.Clusters, res.Clusters) {
			t.Fatalf("%s: the view changed more than assignments", c.name)
		}
		i := slices.IndexFunc(seen.Endpoints, func(cla *endpointv3.ClusterLoadAssignment) bool { return cla.GetClusterName() == local })
		if i < 0 {
			t.Fatalf("%s: no assignment %s", c.name, local)
		}
		if got := addressesOf(seen.Endpoints[i]); !slices.Equal(got, c.want) {
			t.Errorf("%s: %s sees %v, want %v", c.name, local, got, c.want)
		}
	}
	// The translation itself is left as it was.
	i := slices.IndexFunc(res.Endpoints, func(cla *endpointv3.ClusterLoadAssignment) bool { return cla.GetClusterName() == local })
	if got := addressesOf(res.Endpoints[i]); len(got) != 3 {
		t.Errorf("Seen modified the scope-wide assignment: %v", got)
	}
}

// TestAssignmentsShareTheirParts checks that one Service's assignments, of
// its ports and as seen from its zones, share each endpoint's and each
// zone's message rather than holding a copy each: with zone priority,
// every zone's view lists every endpoint again.
func TestAssignmentsShareTheirParts(t *testing.T) {
	svc := &model.Service{Key: model.Key{Namespace: "a", Name: "web"}, Ports: []model.ServicePort{{Name: "http", Port: 80}, {Name: "grpc", Port: 9090}}}
	for i, zone := range []string{"zone-a", "zone-b", "zone-a"} {
		svc.Endpoints = append(svc.Endpoints, model.Endpoint{
			Address: "10.0.0." + string(rune('1'+i)), Family: model.IPv4, Ready: true, Serving: true, Zone: zone,
			Ports: []model.EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9090}},
		})
	}
	f := Service(svc, Profile{Mode: model.ListenerEnvoy, ZonePriority: true})
	endpoints := map[*endpointv3.LbEndpoint]bool{}
	localities := map[string]map[any]bool{}
	count := func(cla *endpointv3.ClusterLoadAssignment) {
		for _, l := range cla.GetEndpoints() {
			if localities[l.GetLocality().GetZone()] == nil {
				localities[l.GetLocality().GetZone()] = map[any]bool{}
			}
			localities[l.GetLocality().GetZone()][l.GetLocality()] = true
			for _, e := range l.GetLbEndpoints() {
				endpoints[e] = true
			}
		}
	}
	for _, cla := range f.Endpoints {
		count(cla)
	}
	if len(f.Places) != 2 {
		t.Fatalf("%d zone views, want 2", len(f.Places))
	}
	for _, p := range f.Places {
		for _, cla := range p.Endpoints {
			count(cla)
		}
	}
	if len(endpoints) != 6 {
		t.Errorf("3 endpoints of 2 ports are held as %d messages, want 6", len(endpoints))
	}
	for zone, ls := range localities {
		if len(ls) != 1 {
			t.Errorf("zone %s is held as %d messages, want 1", zone, len(ls))
		}
	}
}
