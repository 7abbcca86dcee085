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
