// Package translate turns the model (package xds/model) into Envoy v3 xDS
// resources: Clusters, ClusterLoadAssignments, Listeners and
// RouteConfigurations.
//
// Every function here is pure — no client, no clock, no mutable globals, no
// goroutines — so that the catalog can cache one Service's fragment
// and re-translate only the Services that changed, and so that the output can
// be golden-tested, fuzzed and content-hashed. Equal input gives equal output,
// byte-equal when marshalled deterministically: every list is sorted and no
// map iteration order leaks into a message.
//
// Translation happens in two steps. Service turns ONE Service into a
// Fragment, which depends only on that Service and the
// scope's listener mode, so a change to one Service re-translates one
// fragment. AssembleScope merges the fragments selected by a scope into the
// scope's complete resource set, adding the scope-wide HTTP listener,
// route configuration and virtual hosts in Envoy mode. Translate does both
// at once.
//
// The returned messages are shared, not copied: a fragment's messages are
// reused by every scope that assembles it. Callers must treat every returned
// message as read-only.
package translate

import (
	"cmp"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Fragment is the part of a scope's xDS resources that one Service
// contributes to every scope that selects it. It is cached per Service so
// that a change to one Service re-translates only that Service.
type Fragment struct {
	// Service is the translated Service's key. AssembleScope uses its
	// namespace to decide which Service keeps a short host name that two
	// Services of different namespaces both claim.
	Service model.Key
	// Resources holds one Cluster per translatable Service port and one
	// ClusterLoadAssignment per EDS cluster (ExternalName Services have none:
	// their clusters resolve DNS themselves); in ProxylessGRPC mode also the
	// two gRPC API listeners and one RouteConfiguration per port. Envoy-mode
	// listeners, routes and virtual hosts are scope-wide: AssembleScope
	// builds them.
	Resources
	// Hosts holds one VirtualHost per Service port in Envoy mode, sorted by
	// name, from which AssembleScope builds the scope's virtual hosts.
	Hosts []*routev3.VirtualHost
}

// Resources is a set of xDS resources, each type sorted by resource name:
// a scope's complete set, ready to be versioned and served, or a fragment's part.
type Resources struct {
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	// VirtualHosts are an Envoy-mode scope's virtual hosts, which delta
	// proxies fetch by VHDS (see VHDS) and SotW proxies find inline in the
	// route configuration.
	VirtualHosts []*routev3.VirtualHost
	// Places holds, sorted by place, the assignments that proxies at a
	// place see instead of those of the same names in Endpoints: the
	// endpoints Kubernetes routes to from there (EndpointSlice hints), or
	// the scope's zone priorities. Each must name an assignment of
	// Endpoints; Each does not visit them.
	Places []PlaceEndpoints
}

// Each calls fn for every resource, type by type in ADS order. It is the
// one place that maps the typed fields to the table of types in xdstype.
func (r *Resources) Each(fn func(t xdstype.Type, m proto.Message)) {
	for _, m := range r.Clusters {
		fn(xdstype.Cluster, m)
	}
	for _, m := range r.Endpoints {
		fn(xdstype.Endpoint, m)
	}
	for _, m := range r.Listeners {
		fn(xdstype.Listener, m)
	}
	for _, m := range r.Routes {
		fn(xdstype.Route, m)
	}
	for _, m := range r.VirtualHosts {
		fn(xdstype.VirtualHost, m)
	}
}

// Service translates one Service into the fragment it contributes to a
// scope of the given listener mode. It does not modify svc.
//
// Only TCP ports (protocol TCP or unset) with a number in 1..65535 are
// translated: HTTP and gRPC routing, the only thing a scope's listener does,
// cannot carry UDP or SCTP, and a port Envoy cannot address would get the
// whole response rejected.
func Service(svc *model.Service, p Profile) Fragment {
	mode := p.Mode
	ports := tcpPorts(svc)
	out := Fragment{Service: svc.Key}
	out.Clusters = make([]*clusterv3.Cluster, 0, len(ports))
	for i := range ports {
		out.Clusters = append(out.Clusters, cluster(svc, &ports[i], mode))
	}
	out.Endpoints, out.Places = endpointsFor(svc, ports, p)
	switch mode {
	case model.ListenerProxylessGRPC:
		out.Listeners = make([]*listenerv3.Listener, 0, 2*len(ports))
		out.Routes = make([]*routev3.RouteConfiguration, 0, len(ports))
		for i := range ports {
			out.Listeners = append(out.Listeners, apiListeners(svc, ports[i].Port)...)
			out.Routes = append(out.Routes, grpcRouteConfig(svc, ports[i].Port))
		}
	default:
		out.Hosts = envoyVirtualHosts(svc.Key, ports)
	}
	sortByName(out.Clusters, (*clusterv3.Cluster).GetName)
	sortByName(out.Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortByName(out.Hosts, (*routev3.VirtualHost).GetName)
	sortByName(out.Listeners, (*listenerv3.Listener).GetName)
	sortByName(out.Routes, (*routev3.RouteConfiguration).GetName)
	return out
}

// AssembleScope merges the fragments of the Services a scope selects (the
// caller has already filtered them, and they must be of distinct Services
// translated in the scope's profile, ProfileOf) into the scope's complete resource set.
//
// In Envoy mode it adds one HTTP listener on scope.Listener.Port whose
// connection manager fetches, over ADS, one route configuration, and every
// fragment's virtual hosts as VirtualHost resources, which the route
// configuration carries inline or names as its VHDS source (see VHDS); a
// listener port outside 1..65535 adds none of them, because Envoy would bind
// a random port for 0 and reject anything larger.
// In ProxylessGRPC mode it concatenates the fragments' API listeners and
// route configurations. Every listener and route configuration carries the
// scope's epoch (EpochMetadataKey). The fragments are not modified.
func AssembleScope(scope *model.Scope, fragments []*Fragment) Resources {
	var nClusters, nEndpoints, nListeners, nRoutes int
	for _, f := range fragments {
		nClusters += len(f.Clusters)
		nEndpoints += len(f.Endpoints)
		nListeners += len(f.Listeners)
		nRoutes += len(f.Routes)
	}
	out := Resources{
		Clusters:  make([]*clusterv3.Cluster, 0, nClusters),
		Endpoints: make([]*endpointv3.ClusterLoadAssignment, 0, nEndpoints),
	}
	for _, f := range fragments {
		out.Clusters = append(out.Clusters, f.Clusters...)
		out.Endpoints = append(out.Endpoints, f.Endpoints...)
	}
	out.Places = mergePlaces(fragments)
	switch scope.Listener.Mode {
	case model.ListenerProxylessGRPC:
		out.Listeners = make([]*listenerv3.Listener, 0, nListeners)
		out.Routes = make([]*routev3.RouteConfiguration, 0, nRoutes)
		for _, f := range fragments {
			out.Listeners = append(out.Listeners, f.Listeners...)
			out.Routes = append(out.Routes, f.Routes...)
		}
	default:
		if port := scope.Listener.Port; validPort(port) {
			out.Listeners = []*listenerv3.Listener{httpListener(port)}
			out.VirtualHosts = httpVirtualHosts(scope, port, fragments)
			out.Routes = []*routev3.RouteConfiguration{httpRouteConfig(port, out.VirtualHosts, VHDS(scope))}
		}
	}
	sortByName(out.Clusters, (*clusterv3.Cluster).GetName)
	sortByName(out.Endpoints, (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortByName(out.Listeners, (*listenerv3.Listener).GetName)
	sortByName(out.Routes, (*routev3.RouteConfiguration).GetName)
	stampEpoch(scope, &out)
	return out
}

// Translate translates every Service and assembles the scope from them. It
// is the one-call form used by golden tests, fuzzing and callers that cache
// nothing; services must be distinct.
func Translate(scope *model.Scope, services []*model.Service) Resources {
	fragments := make([]*Fragment, len(services))
	for i, svc := range services {
		f := Service(svc, ProfileOf(scope))
		fragments[i] = &f
	}
	return AssembleScope(scope, fragments)
}

// tcpPorts returns the Service's translatable ports — TCP, numbered
// 1..65535 — sorted by number, keeping the first (by name) of ports that
// repeat a number, since two clusters of one name cannot coexist. It copies
// so the caller's model is never reordered.
func tcpPorts(svc *model.Service) []model.ServicePort {
	ports := make([]model.ServicePort, 0, len(svc.Ports))
	for _, p := range svc.Ports {
		if isTCP(p.Protocol) && validPort(p.Port) {
			ports = append(ports, p)
		}
	}
	slices.SortFunc(ports, func(a, b model.ServicePort) int {
		return cmp.Or(
			cmp.Compare(a.Port, b.Port),
			strings.Compare(a.Name, b.Name),
			strings.Compare(a.AppProtocol, b.AppProtocol),
			cmp.Compare(a.TargetPort, b.TargetPort),
			strings.Compare(a.TargetPortName, b.TargetPortName),
		)
	})
	return slices.CompactFunc(ports, func(a, b model.ServicePort) bool { return a.Port == b.Port })
}

// isTCP reports whether a port protocol is TCP; Kubernetes defaults an unset
// protocol to TCP.
func isTCP(p model.PortProtocol) bool {
	return p == model.ProtocolTCP || p == ""
}

// validPort reports whether n can be a socket port; Envoy's validation and
// kernel both reject anything else.
func validPort(n int32) bool {
	return n > 0 && n <= 65535
}

// sortByName sorts resources by their xDS resource name, which is what makes
// the output independent of input order. Long slices are sorted through a
// copy of their names, which keeps comparisons out of the scattered
// messages: about a third faster at ten thousand Services.
func sortByName[T any](s []T, name func(T) string) {
	if len(s) <= 32 {
		slices.SortFunc(s, func(a, b T) int { return strings.Compare(name(a), name(b)) })
		return
	}
	type named struct {
		name string
		v    T
	}
	ns := make([]named, len(s))
	for i, v := range s {
		ns[i] = named{name(v), v}
	}
	slices.SortFunc(ns, func(a, b named) int { return strings.Compare(a.name, b.name) })
	for i := range ns {
		s[i] = ns[i].v
	}
}
