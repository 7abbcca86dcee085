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
// cluster, sorted by cluster name. It is the part of Service that an
// endpoint-only change invalidates, exported so such a change can redo only
// these; the mode names them (see clusterName). ExternalName Services have
// none.
func Endpoints(svc *model.Service, mode model.ListenerMode) []*endpointv3.ClusterLoadAssignment {
	out := endpointsFor(svc, tcpPorts(svc), mode)
	sortByName(out, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	return out
}

// endpointsFor builds the assignments of the given (already filtered) ports.
func endpointsFor(svc *model.Service, ports []model.ServicePort, mode model.ListenerMode) []*endpointv3.ClusterLoadAssignment {
	if svc.ExternalName != "" {
		return nil
	}
	out := make([]*endpointv3.ClusterLoadAssignment, 0, len(ports))
	var scratch []candidate
	for i := range ports {
		var cla *endpointv3.ClusterLoadAssignment
		cla, scratch = loadAssignment(svc, &ports[i], clusterName(svc, ports[i].Port, mode), scratch[:0])
		out = append(out, cla)
	}
	return out
}

// candidate is an endpoint address that serves one Service port, before
// deduplication and grouping.
type candidate struct {
	addr   netip.Addr
	raw    string
	port   uint32
	health corev3.HealthStatus
	zone   string
}

// loadAssignment builds the ClusterLoadAssignment of one Service port. A
// Service without endpoints still gets one, with no endpoints, so a proxy
// never waits for a name that would never come.
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
// slice migration) is sent once, with its best health: grpc-go rejects
// duplicates and Envoy would double its share.
//
// Endpoints are grouped by zone into one locality each, sorted by zone, and
// within it by address then port. Every locality has a Locality message, even
// for the empty zone, because grpc-go rejects a locality without one; its
// weight is its number of HEALTHY endpoints (at least 1, since grpc-go drops
// a zero-weight locality and Envoy forbids it), so that a zone full of
// draining pods does not draw traffic onto its few ready ones. name is the
// cluster's name, which the assignment carries.
func loadAssignment(svc *model.Service, port *model.ServicePort, name string, scratch []candidate) (*endpointv3.ClusterLoadAssignment, []candidate) {
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
		cands = append(cands, candidate{addr: addr, raw: ep.Address, port: uint32(n), health: health, zone: ep.Zone})
	}

	// Order by endpoint, best health first, so compaction keeps the best
	// copy of a duplicate; the remaining keys only make ties deterministic.
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(
			a.addr.Compare(b.addr),
			cmp.Compare(a.port, b.port),
			healthRank(a.health)-healthRank(b.health),
			strings.Compare(a.zone, b.zone),
			strings.Compare(a.raw, b.raw),
		)
	})
	cands = slices.CompactFunc(cands, func(a, b candidate) bool { return a.addr == b.addr && a.port == b.port })
	slices.SortStableFunc(cands, func(a, b candidate) int { return strings.Compare(a.zone, b.zone) })

	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for start := 0; start < len(cands); {
		end := start + 1
		for end < len(cands) && cands[end].zone == cands[start].zone {
			end++
		}
		group := cands[start:end]
		lbs := make([]*endpointv3.LbEndpoint, len(group))
		var healthy uint32
		for i := range group {
			lbs[i] = lbEndpoint(group[i].raw, group[i].port, group[i].health)
			if group[i].health == corev3.HealthStatus_HEALTHY {
				healthy++
			}
		}
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Zone: group[0].zone},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(max(healthy, 1)),
		})
		start = end
	}
	return cla, cands
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
