package translate

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Endpoints returns the ClusterLoadAssignments of a Service, one per EDS
// cluster, sorted by cluster name: what a proxy sees that no Place of the
// Service's fragment covers. ExternalName Services have none.
func Endpoints(svc *model.Service, mode model.ListenerMode) []*endpointv3.ClusterLoadAssignment {
	out, _ := endpointsFor(svc, tcpPorts(svc), Profile{Mode: mode})
	sortByName(out, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	return out
}

// endpointsFor builds the assignments of the given (already filtered)
// ports, and what proxies at particular places see of them instead (see
// views).
func endpointsFor(svc *model.Service, ports []model.ServicePort, p Profile) ([]*endpointv3.ClusterLoadAssignment, []PlaceEndpoints) {
	if svc.ExternalName != "" {
		return nil, nil
	}
	out := make([]*endpointv3.ClusterLoadAssignment, 0, len(ports))
	var (
		scratch []candidate
		placed  []placedAssignment
		locs    localities
	)
	topology := svc.Topology()
	for i := range ports {
		name := clusterName(svc, ports[i].Port, p.Mode)
		scratch = candidates(svc, &ports[i], scratch[:0])
		out = append(out, assignment(name, scratch, nil, nil, &locs))
		switch {
		case topology:
			placed = append(placed, hintViews(name, scratch, &locs)...)
		case p.ZonePriority:
			placed = append(placed, zonePriorityViews(name, scratch, &locs)...)
		}
	}
	return out, groupByPlace(placed)
}

// candidate is an endpoint address that serves one Service port, before
// deduplication and grouping.
type candidate struct {
	addr netip.Addr
	raw  string
	port uint32
	// ready is false for a serving-but-terminating endpoint.
	ready bool
	ep    *model.Endpoint
	// lb is the endpoint as assignments list it, made by the first that
	// does: the scope-wide assignment and the views from places share it.
	lb *endpointv3.LbEndpoint
}

// localities holds the localities of one Service's assignments, one per
// zone, which all its ports' assignments and views share.
type localities []*corev3.Locality

// of returns the locality of zone.
func (l *localities) of(zone string) *corev3.Locality {
	for _, loc := range *l {
		if loc.GetZone() == zone {
			return loc
		}
	}
	loc := &corev3.Locality{Zone: zone}
	*l = append(*l, loc)
	return loc
}

// candidates returns the endpoints that serve one Service port, appended to
// scratch, in the order an assignment lists them: by zone, then address,
// then port.
//
// Ready endpoints are candidates, and so are serving endpoints that are not
// ready — the EndpointSlice API's serving-but-terminating ones —, which an
// assignment places at a lower priority than every ready one (see
// assignment). Endpoints that do not serve are left out. So are endpoints
// whose address is not an IP (or carries an IPv6 zone) or whose port cannot
// be addressed, because one bad address makes Envoy reject the whole
// assignment.
//
// An address and port listed twice (a pod in two EndpointSlices during a
// slice migration) is kept once, ready if either copy is: grpc-go rejects
// duplicates and Envoy would double its share.
func candidates(svc *model.Service, port *model.ServicePort, scratch []candidate) []candidate {
	cands := scratch
	for i := range svc.Endpoints {
		ep := &svc.Endpoints[i]
		if !ep.Ready && !ep.Serving {
			continue
		}
		n, ok := tcpPortFor(ep, port.Name)
		if !ok {
			continue
		}
		addr, err := netip.ParseAddr(ep.Address)
		if err != nil || addr.Zone() != "" {
			continue
		}
		cands = append(cands, candidate{addr: addr, raw: ep.Address, port: uint32(n), ready: ep.Ready, ep: ep})
	}

	// Order by endpoint, ready first, so compaction keeps the best copy of
	// a duplicate; the remaining keys only make ties deterministic.
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(
			a.addr.Compare(b.addr),
			cmp.Compare(a.port, b.port),
			readyRank(a.ready)-readyRank(b.ready),
			strings.Compare(a.ep.Zone, b.ep.Zone),
			strings.Compare(a.raw, b.raw),
		)
	})
	cands = slices.CompactFunc(cands, func(a, b candidate) bool { return a.addr == b.addr && a.port == b.port })
	slices.SortStableFunc(cands, func(a, b candidate) int { return strings.Compare(a.ep.Zone, b.ep.Zone) })
	return cands
}

// assignment builds the ClusterLoadAssignment named name of the candidates
// that keep accepts (nil: all of them), zonePrio ranking the zones (nil:
// all alike), with the localities of locs and the candidates' endpoints,
// which it shares with the Service's other assignments. A Service without endpoints still gets one, with no
// endpoints, so a proxy never waits for a name that would never come.
//
// Every endpoint is HEALTHY, and its priority says when it is used, as
// kube-proxy routes (KEP-1669): ready endpoints come first, by zonePrio's
// rank, and serving-but-terminating endpoints after every ready one, by
// the same rank. Envoy and every gRPC client send to a priority only while
// the ones before it have no healthy endpoint, so terminating endpoints
// get traffic exactly when no ready endpoint is left — a one-replica
// Deployment during a rollout keeps serving — and never draw it from a
// ready one. (Marked DRAINING instead, they would get none even then.)
// The priorities used are renumbered 0, 1, 2, … without gaps, which
// grpc-go and C-core require.
//
// Endpoints of one priority are grouped by zone into one locality each,
// sorted by priority then zone, and within it by address then port: a zone
// with ready and terminating endpoints is a locality in two priorities,
// which the xDS clients allow (A52), never twice in one. Every locality
// has a Locality message, even for the empty zone, because grpc-go rejects
// a locality without one; its weight is its number of endpoints (grpc-go
// drops a zero-weight locality and Envoy forbids it).
func assignment(name string, cands []candidate, keep func(*candidate) bool, zonePrio func(zone string) uint32, locs *localities) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	// tiers is how many ranks ready endpoints may take, so that every
	// terminating one ranks after all of them.
	tiers := uint32(1)
	if zonePrio != nil {
		tiers = 2
	}
	type ranked struct {
		c    *candidate
		rank uint32
	}
	kept := make([]ranked, 0, len(cands))
	for i := range cands {
		c := &cands[i]
		if keep != nil && !keep(c) {
			continue
		}
		var rank uint32
		if zonePrio != nil {
			rank = zonePrio(c.ep.Zone)
		}
		if !c.ready {
			rank += tiers
		}
		kept = append(kept, ranked{c, rank})
	}
	// Candidates are sorted by zone, address and port; a stable sort by
	// rank keeps that order within each rank.
	slices.SortStableFunc(kept, func(a, b ranked) int { return cmp.Compare(a.rank, b.rank) })
	var prio uint32
	for start := 0; start < len(kept); {
		end := start + 1
		rank, zone := kept[start].rank, kept[start].c.ep.Zone
		for end < len(kept) && kept[end].rank == rank && kept[end].c.ep.Zone == zone {
			end++
		}
		if start > 0 && kept[start-1].rank != rank {
			prio++
		}
		lbs := make([]*endpointv3.LbEndpoint, 0, end-start)
		for _, k := range kept[start:end] {
			if k.c.lb == nil {
				k.c.lb = lbEndpoint(k.c.raw, k.c.port, corev3.HealthStatus_HEALTHY)
			}
			lbs = append(lbs, k.c.lb)
		}
		start = end
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            locs.of(zone),
			LbEndpoints:         lbs,
			LoadBalancingWeight: weight(uint32(len(lbs))),
			Priority:            prio,
		})
	}
	return cla
}

// readyRank orders ready endpoints first.
func readyRank(ready bool) int {
	if ready {
		return 0
	}
	return 1
}

// tcpPortFor returns the endpoint's TCP port for the Service port named
// name; an EndpointSlice port with no protocol is TCP, as in the API, and a
// number Envoy cannot address does not count. Should a slice list the name
// twice (the API forbids it), the lowest number wins, so the result never
// depends on the order of the slice's ports.
func tcpPortFor(ep *model.Endpoint, name string) (int32, bool) {
	var n int32
	found := false
	for _, p := range ep.Ports {
		if p.Name == name && isTCP(p.Protocol) && validPort(p.Port) && (!found || p.Port < n) {
			n, found = p.Port, true
		}
	}
	return n, found
}

// lbEndpoint builds one endpoint of weight 1: grpc-go rejects an explicit
// zero weight, and equal weights keep round robin even.
func lbEndpoint(address string, port uint32, health corev3.HealthStatus) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
			Endpoint: &endpointv3.Endpoint{Address: socketAddress(address, port)},
		},
		HealthStatus:        health,
		LoadBalancingWeight: weight(1),
	}
}

// socketAddress builds a TCP socket address; IPv6 addresses go in as they
// are, without brackets, as Envoy expects.
func socketAddress(address string, port uint32) *corev3.Address {
	return &corev3.Address{
		Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address:       address,
			PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
		}},
	}
}
