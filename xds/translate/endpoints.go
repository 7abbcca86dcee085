package translate

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

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
	)
	topology := svc.Topology()
	for i := range ports {
		name := clusterName(svc, ports[i].Port, p.Mode)
		scratch = candidates(svc, &ports[i], scratch[:0])
		out = append(out, assignment(name, scratch, nil, nil))
		switch {
		case topology:
			placed = append(placed, hintViews(name, scratch)...)
		case p.ZonePriority:
			placed = append(placed, zonePriorityViews(name, scratch)...)
		}
	}
	return out, groupByPlace(placed)
}

// candidate is an endpoint address that serves one Service port, before
// deduplication and grouping.
type candidate struct {
	addr   netip.Addr
	raw    string
	port   uint32
	health corev3.HealthStatus
	ep     *model.Endpoint
}

// candidates returns the endpoints that serve one Service port, appended to
// scratch, in the order an assignment lists them: by zone, then address,
// then port.
//
// Ready endpoints are HEALTHY. Serving endpoints that are not ready — the
// EndpointSlice API's serving-but-terminating — are DRAINING, so Envoy
// finishes their connections without sending new requests and grpc-go skips
// them. Endpoints that do not serve are left out. So are endpoints whose
// address is not an IP (or carries an IPv6 zone) or whose port cannot be
// addressed, because one bad address makes Envoy reject the whole
// assignment.
//
// An address and port listed twice (a pod in two EndpointSlices during a
// slice migration) is kept once, with its best health: grpc-go rejects
// duplicates and Envoy would double its share.
func candidates(svc *model.Service, port *model.ServicePort, scratch []candidate) []candidate {
	cands := scratch
	for i := range svc.Endpoints {
		ep := &svc.Endpoints[i]
		var health corev3.HealthStatus
		switch {
		case ep.Ready:
			health = corev3.HealthStatus_HEALTHY
		case ep.Serving:
			health = corev3.HealthStatus_DRAINING
		default:
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
		cands = append(cands, candidate{addr: addr, raw: ep.Address, port: uint32(n), health: health, ep: ep})
	}

	// Order by endpoint, best health first, so compaction keeps the best
	// copy of a duplicate; the remaining keys only make ties deterministic.
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(
			a.addr.Compare(b.addr),
			cmp.Compare(a.port, b.port),
			healthRank(a.health)-healthRank(b.health),
			strings.Compare(a.ep.Zone, b.ep.Zone),
			strings.Compare(a.raw, b.raw),
		)
	})
	cands = slices.CompactFunc(cands, func(a, b candidate) bool { return a.addr == b.addr && a.port == b.port })
	slices.SortStableFunc(cands, func(a, b candidate) int { return strings.Compare(a.ep.Zone, b.ep.Zone) })
	return cands
}

// assignment builds the ClusterLoadAssignment named name of the candidates
// that keep accepts (nil: all of them), each zone at the priority prio gives
// it (nil: 0). A Service without endpoints still gets one, with no
// endpoints, so a proxy never waits for a name that would never come.
//
// Endpoints are grouped by zone into one locality each, sorted by zone, and
// within it by address then port. Every locality has a Locality message, even
// for the empty zone, because grpc-go rejects a locality without one; its
// weight is its number of HEALTHY endpoints (at least 1, since grpc-go drops
// a zero-weight locality and Envoy forbids it), so that a zone full of
// draining pods does not draw traffic onto its few ready ones.
func assignment(name string, cands []candidate, keep func(*candidate) bool, prio func(zone string) uint32) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for start := 0; start < len(cands); {
		end := start + 1
		zone := cands[start].ep.Zone
		for end < len(cands) && cands[end].ep.Zone == zone {
			end++
		}
		group := cands[start:end]
		start = end
		lbs := make([]*endpointv3.LbEndpoint, 0, len(group))
		var healthy uint32
		for i := range group {
			if keep != nil && !keep(&group[i]) {
				continue
			}
			lbs = append(lbs, lbEndpoint(group[i].raw, group[i].port, group[i].health))
			if group[i].health == corev3.HealthStatus_HEALTHY {
				healthy++
			}
		}
		if len(lbs) == 0 {
			continue
		}
		l := &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: zone},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(max(healthy, 1)),
		}
		if prio != nil {
			l.Priority = prio(zone)
		}
		cla.Endpoints = append(cla.Endpoints, l)
	}
	return cla
}

// healthRank orders health statuses best first.
func healthRank(h corev3.HealthStatus) int {
	if h == corev3.HealthStatus_HEALTHY {
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
		LoadBalancingWeight: wrapperspb.UInt32(1),
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
