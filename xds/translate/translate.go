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
// scope's Profile (its listener mode and port, its zone priority), so a change to one Service re-translates one
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
	"maps"
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
	// name, from which AssembleScope builds the scope's virtual hosts. They
	// are named as a scope of the profile's listener port serves them
	// (see Profile.Port), hostsPort.
	Hosts []*routev3.VirtualHost
	// hostsPort is the listener port whose route configuration names
	// Hosts, or 0 when their names carry none.
	hostsPort int32
	// hostsFrom is the Service port each of Hosts was translated from.
	hostsFrom []*model.Origin
	// RoutesTo holds, sorted, the other Services its routes may send calls
	// to (the routing's backends; a warm-up's, those of the routes it
	// keeps too): what a scope that serves the fragment must serve as
	// route backends.
	RoutesTo []model.Key
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
	// from holds, per type and in the order of its list above, the Service
	// port each resource was translated from (see EachFrom): nil for a
	// resource that belongs to the scope, not to one Service, and for every
	// resource past the end of a type's list (Resources built by hand).
	from [xdstype.Count][]*model.Origin
}

// Each calls fn for every resource, type by type in ADS order.
func (r *Resources) Each(fn func(t xdstype.Type, m proto.Message)) {
	r.EachFrom(func(t xdstype.Type, m proto.Message, _ *model.Origin) { fn(t, m) })
}

// EachFrom is Each with the provenance of every resource: the Service port
// it was translated from, or nil for a scope's own resource (an Envoy-mode
// listener or route configuration). The catalog hands it on with the
// resource, so that the snapshot, the server and the status know which
// Service a resource belongs to without parsing its name. It is the one
// place that maps the typed fields to the table of types in xdstype.
func (r *Resources) EachFrom(fn func(t xdstype.Type, m proto.Message, from *model.Origin)) {
	eachFrom(xdstype.Cluster, r.Clusters, r.from[xdstype.Cluster], fn)
	eachFrom(xdstype.Endpoint, r.Endpoints, r.from[xdstype.Endpoint], fn)
	eachFrom(xdstype.Listener, r.Listeners, r.from[xdstype.Listener], fn)
	eachFrom(xdstype.Route, r.Routes, r.from[xdstype.Route], fn)
	eachFrom(xdstype.VirtualHost, r.VirtualHosts, r.from[xdstype.VirtualHost], fn)
}

func eachFrom[T proto.Message](t xdstype.Type, ms []T, from []*model.Origin, fn func(xdstype.Type, proto.Message, *model.Origin)) {
	for i, m := range ms {
		var o *model.Origin
		if i < len(from) {
			o = from[i]
		}
		fn(t, m, o)
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
	return RoutedService(svc, p, nil)
}

// RoutedService is Service for a Service that mesh routes attach to (rt;
// nil for none): each port they attach to routes by their rules instead of
// sending every request to the port's own endpoints.
func RoutedService(svc *model.Service, p Profile, rt *Routing) Fragment {
	mode := p.Mode
	ports := tcpPorts(svc)
	out := Fragment{Service: svc.Key}
	if rt != nil {
		out.RoutesTo = slices.SortedFunc(maps.Keys(rt.Backends), model.Key.Compare)
	}
	// Every resource of a port shares its Origin; one allocation holds all.
	origins := make([]model.Origin, len(ports))
	for i := range ports {
		origins[i] = model.Origin{Service: svc.Key, Port: ports[i].Port}
	}
	from := &out.from
	out.Clusters = make([]*clusterv3.Cluster, 0, len(ports))
	for i := range ports {
		out.Clusters = append(out.Clusters, cluster(svc, &ports[i], mode))
		from[xdstype.Cluster] = append(from[xdstype.Cluster], &origins[i])
	}
	out.Endpoints, out.Places = endpointsFor(svc, ports, p)
	for i := range out.Endpoints { // one per port, in the order of ports
		from[xdstype.Endpoint] = append(from[xdstype.Endpoint], &origins[i])
	}
	switch mode {
	case model.ListenerProxylessGRPC:
		out.Listeners = make([]*listenerv3.Listener, 0, 2*len(ports))
		out.Routes = make([]*routev3.RouteConfiguration, 0, len(ports))
		for i := range ports {
			ls := apiListeners(svc, ports[i].Port)
			out.Listeners = append(out.Listeners, ls...)
			for range ls {
				from[xdstype.Listener] = append(from[xdstype.Listener], &origins[i])
			}
			out.Routes = append(out.Routes, grpcRouteConfig(svc, ports[i].Port, rt))
			from[xdstype.Route] = append(from[xdstype.Route], &origins[i])
		}
	default:
		if validPort(p.Port) {
			out.hostsPort = p.Port
		}
		out.Hosts = envoyVirtualHosts(svc, ports, rt, out.hostsPort)
		for i := range out.Hosts { // one per port, in the order of ports
			out.hostsFrom = append(out.hostsFrom, &origins[i])
		}
	}
	sortFrom(out.Clusters, from[xdstype.Cluster], (*clusterv3.Cluster).GetName)
	sortFrom(out.Endpoints, from[xdstype.Endpoint], (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortFrom(out.Hosts, out.hostsFrom, (*routev3.VirtualHost).GetName)
	sortFrom(out.Listeners, from[xdstype.Listener], (*listenerv3.Listener).GetName)
	sortFrom(out.Routes, from[xdstype.Route], (*routev3.RouteConfiguration).GetName)
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
	from := &out.from
	from[xdstype.Cluster] = make([]*model.Origin, 0, nClusters)
	from[xdstype.Endpoint] = make([]*model.Origin, 0, nEndpoints)
	for _, f := range fragments {
		out.Clusters = append(out.Clusters, f.Clusters...)
		from[xdstype.Cluster] = appendFrom(from[xdstype.Cluster], f.from[xdstype.Cluster], len(f.Clusters))
		out.Endpoints = append(out.Endpoints, f.Endpoints...)
		from[xdstype.Endpoint] = appendFrom(from[xdstype.Endpoint], f.from[xdstype.Endpoint], len(f.Endpoints))
	}
	out.Places = mergePlaces(fragments)
	switch scope.Listener.Mode {
	case model.ListenerProxylessGRPC:
		out.Listeners = make([]*listenerv3.Listener, 0, nListeners)
		out.Routes = make([]*routev3.RouteConfiguration, 0, nRoutes)
		from[xdstype.Listener] = make([]*model.Origin, 0, nListeners)
		from[xdstype.Route] = make([]*model.Origin, 0, nRoutes)
		for _, f := range fragments {
			out.Listeners = append(out.Listeners, f.Listeners...)
			from[xdstype.Listener] = appendFrom(from[xdstype.Listener], f.from[xdstype.Listener], len(f.Listeners))
			out.Routes = append(out.Routes, f.Routes...)
			from[xdstype.Route] = appendFrom(from[xdstype.Route], f.from[xdstype.Route], len(f.Routes))
		}
	default:
		// The listener and the route configuration are the scope's own:
		// they have no provenance. Each virtual host has its Service's.
		if port := scope.Listener.Port; validPort(port) {
			out.Listeners = []*listenerv3.Listener{httpListener(port)}
			out.VirtualHosts, from[xdstype.VirtualHost] = httpVirtualHosts(scope, port, fragments)
			out.Routes = []*routev3.RouteConfiguration{httpRouteConfig(port, out.VirtualHosts, VHDS(scope))}
		}
	}
	sortFrom(out.Clusters, from[xdstype.Cluster], (*clusterv3.Cluster).GetName)
	sortFrom(out.Endpoints, from[xdstype.Endpoint], (*endpointv3.ClusterLoadAssignment).GetClusterName)
	sortFrom(out.Listeners, from[xdstype.Listener], (*listenerv3.Listener).GetName)
	sortFrom(out.Routes, from[xdstype.Route], (*routev3.RouteConfiguration).GetName)
	stampEpoch(scope, &out)
	return out
}

// appendFrom appends to dst the provenance of n resources, from their
// fragment's list (nil entries where it is shorter), keeping dst aligned
// with the resources appended alongside.
func appendFrom(dst, from []*model.Origin, n int) []*model.Origin {
	k := min(n, len(from))
	dst = append(dst, from[:k]...)
	for range n - k {
		dst = append(dst, nil)
	}
	return dst
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

// sortFrom is sortByName keeping from, the provenance of each resource,
// aligned with s; without it (a length that differs), it is sortByName. A
// fragment's few resources are sorted in place without allocating.
func sortFrom[T any](s []T, from []*model.Origin, name func(T) string) {
	if len(from) != len(s) {
		sortByName(s, name)
		return
	}
	if len(s) <= 32 {
		for i := 1; i < len(s); i++ {
			for j := i; j > 0 && name(s[j]) < name(s[j-1]); j-- {
				s[j], s[j-1] = s[j-1], s[j]
				from[j], from[j-1] = from[j-1], from[j]
			}
		}
		return
	}
	type named struct {
		name string
		v    T
		from *model.Origin
	}
	ns := make([]named, len(s))
	for i, v := range s {
		ns[i] = named{name(v), v, from[i]}
	}
	slices.SortFunc(ns, func(a, b named) int { return strings.Compare(a.name, b.name) })
	for i := range ns {
		s[i], from[i] = ns[i].v, ns[i].from
	}
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
