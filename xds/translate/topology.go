package translate

import (
	"slices"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Profile is what a Service's translation depends on besides the Service:
// the listener mode of the scopes it is translated for, whether they
// order endpoints by zone, and in Envoy mode their listener port. The
// catalog caches one fragment per profile in use.
type Profile struct {
	Mode         model.ListenerMode
	ZonePriority bool
	// Port is the Envoy-mode listener port, whose route configuration
	// names the fragment's virtual hosts as the scope serves them
	// ("http-<port>/<svc>.<ns>:<port>"), so that AssembleScope serves the
	// fragment's own instead of a copy of each under that name (Envoy-mode
	// scopes of different ports hold a fragment each); 0 (and always in
	// ProxylessGRPC mode) for names without it.
	Port int32
}

// ProfileOf is the profile of a scope.
func ProfileOf(sc *model.Scope) Profile {
	p := Profile{Mode: sc.Listener.Mode, ZonePriority: sc.ZonePriority}
	if p.Mode == model.ListenerEnvoy && validPort(sc.Listener.Port) {
		p.Port = sc.Listener.Port
	}
	return p
}

// PlaceEndpoints holds what proxies at one place see of some assignments
// instead of the scope-wide ones of the same names: only the assignments
// whose view from there differs, sorted by cluster name. Every proxy at the
// place shares them, as every proxy of the scope shares the scope-wide ones.
type PlaceEndpoints struct {
	Place     model.Place
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// placedAssignment is one assignment as seen from one place.
type placedAssignment struct {
	place model.Place
	cla   *endpointv3.ClusterLoadAssignment
}

// hintViews returns what kube-proxy would route to, from each Node and zone
// the EndpointSlice hints name, of one port's candidates, where that is not
// all of them.
//
// kube-proxy uses a Service's Node hints when every ready endpoint has one
// and one names the client's Node; else its zone hints when every ready
// endpoint has one and one names the client's zone; else every endpoint.
// A proxy here looks up its Node's view, then its zone's, then the
// scope-wide assignment, which is the same rule once the views exist
// exactly for the Nodes and zones that some ready endpoint is hinted for.
// A zone view that keeps every endpoint is left out, since the scope-wide
// assignment says the same; a Node view never is when zone views exist,
// because it must win over them.
func hintViews(name string, cands []candidate, locs *localities) []placedAssignment {
	var zones, nodes []string
	allZones, allNodes, ready := true, true, false
	for i := range cands {
		c := &cands[i]
		if !c.ready {
			continue
		}
		ready = true
		allZones = allZones && len(c.ep.ForZones) > 0
		allNodes = allNodes && len(c.ep.ForNodes) > 0
		zones = append(zones, c.ep.ForZones...)
		nodes = append(nodes, c.ep.ForNodes...)
	}
	if !ready {
		return nil
	}
	var out []placedAssignment
	if allZones {
		slices.Sort(zones)
		for _, z := range slices.Compact(zones) {
			hinted := func(c *candidate) bool { return slices.Contains(c.ep.ForZones, z) }
			if keepsAll(cands, hinted) {
				continue
			}
			out = append(out, placedAssignment{model.Place{Zone: z}, assignment(name, cands, hinted, nil, locs)})
		}
	}
	if allNodes {
		zoned := len(out) > 0
		slices.Sort(nodes)
		for _, n := range slices.Compact(nodes) {
			hinted := func(c *candidate) bool { return slices.Contains(c.ep.ForNodes, n) }
			if !zoned && keepsAll(cands, hinted) {
				continue
			}
			out = append(out, placedAssignment{model.Place{Node: n}, assignment(name, cands, hinted, nil, locs)})
		}
	}
	return out
}

// zonePriorityViews returns, for each zone of one port's candidates, the
// assignment with that zone's ready endpoints first, then the other zones'
// ready ones, then the terminating ones in the same order (see
// assignment): Envoy and gRPC send to a priority only when the ones before
// it are unhealthy. A
// port whose endpoints are all in one zone has none, since every proxy
// would see the scope-wide assignment; nor does a proxy of a zone that
// holds none of them, for the same reason.
func zonePriorityViews(name string, cands []candidate, locs *localities) []placedAssignment {
	if len(cands) == 0 || cands[0].ep.Zone == cands[len(cands)-1].ep.Zone {
		return nil // candidates are sorted by zone: one zone, or none
	}
	var out []placedAssignment
	for i := range cands {
		z := cands[i].ep.Zone
		if z == "" || (i > 0 && cands[i-1].ep.Zone == z) {
			continue
		}
		out = append(out, placedAssignment{model.Place{Zone: z}, assignment(name, cands, nil, func(zone string) uint32 {
			if zone == z {
				return 0
			}
			return 1
		}, locs)})
	}
	return out
}

// keepsAll reports whether keep accepts every candidate.
func keepsAll(cands []candidate, keep func(*candidate) bool) bool {
	for i := range cands {
		if !keep(&cands[i]) {
			return false
		}
	}
	return true
}

// groupByPlace gathers placed assignments by place, sorted by place and
// each place's by cluster name.
func groupByPlace(placed []placedAssignment) []PlaceEndpoints {
	if len(placed) == 0 {
		return nil
	}
	slices.SortStableFunc(placed, func(a, b placedAssignment) int { return a.place.Compare(b.place) })
	var out []PlaceEndpoints
	for _, p := range placed {
		if n := len(out); n == 0 || out[n-1].Place != p.place {
			out = append(out, PlaceEndpoints{Place: p.place})
		}
		last := &out[len(out)-1]
		last.Endpoints = append(last.Endpoints, p.cla)
	}
	for i := range out {
		sortByName(out[i].Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	}
	return out
}

// mergePlaces merges the places of several fragments, as groupByPlace
// leaves them.
func mergePlaces(fragments []*Fragment) []PlaceEndpoints {
	var placed []placedAssignment
	for _, f := range fragments {
		for _, p := range f.Places {
			for _, cla := range p.Endpoints {
				placed = append(placed, placedAssignment{p.Place, cla})
			}
		}
	}
	return groupByPlace(placed)
}

// Seen returns the resources as a proxy at loc sees them: each assignment
// replaced by the view of its Node where there is one, else by that of its
// zone. Tests and the benchmark derive a proxy's truth with it from a
// translation from scratch; the server reads the same views from the
// snapshot. Everything but the assignments is shared with r, and the result
// has no Places of its own: it is a view already.
func (r Resources) Seen(loc model.Location) Resources {
	node, zone := loc.Places()
	view := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, place := range []model.Place{zone, node} { // the Node's view wins
		if place == (model.Place{}) {
			continue
		}
		for _, p := range r.Places {
			if p.Place != place {
				continue
			}
			for _, cla := range p.Endpoints {
				view[cla.GetClusterName()] = cla
			}
		}
	}
	out := r
	out.Places = nil
	if len(view) == 0 {
		return out
	}
	out.Endpoints = slices.Clone(r.Endpoints)
	for i, cla := range out.Endpoints {
		if v, ok := view[cla.GetClusterName()]; ok {
			out.Endpoints[i] = v
		}
	}
	return out
}
