package translate

import (
	"slices"
	"strconv"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	statefulsessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/stateful_session/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/model"
)

// ClusterDomain is the DNS suffix of in-cluster Service names, which both
// listener modes use to name Services the way their clients do.
const ClusterDomain = "cluster.local"

// HTTPListenerName is the name of an Envoy-mode scope's HTTP listener and of
// the route configuration it fetches, e.g. "http-8080": one per port, so a
// port change is a clean replacement.
func HTTPListenerName(port int32) string {
	return "http-" + strconv.Itoa(int(port))
}

// GRPCListenerNames returns the two API listener names under which a gRPC
// client finds a Service port — "<svc>.<ns>.svc.cluster.local:<port>" and
// "<svc>.<ns>:<port>", the host:port of xds:/// targets — the first of which
// is also the name of the port's route configuration.
func GRPCListenerNames(svc model.Key, port int32) (fqdn, short string) {
	p := ":" + strconv.Itoa(int(port))
	return svc.Name + "." + svc.Namespace + ".svc." + ClusterDomain + p, svc.Name + "." + svc.Namespace + p
}

// envoyVirtualHosts builds the Envoy-mode virtual hosts of a Service, one
// per port, matching every name a client in the cluster may put in Host:
// svc, svc.ns, svc.ns.svc and svc.ns.svc.cluster.local, each with ":<port>".
// A virtual host is named by the shortest of them that is unique,
// "<svc>.<ns>:<port>", the host entry VHDS names a virtual host by; every
// byte of the name is sent to every proxy of the scope with every route
// configuration or VHDS resource. The scope names it
// "http-<listener port>/<svc>.<ns>:<port>" (see httpVirtualHosts), and so
// does the fragment when listener is that port (not 0).
//
// The names without a port go to one port only, because Envoy rejects a
// route configuration in which two virtual hosts share a domain: to port 80
// when the Service has it (a Host without a port means 80 in HTTP), else to
// its lowest port.
func envoyVirtualHosts(svc *model.Service, ports []model.ServicePort, rt *Routing, listener int32) []*routev3.VirtualHost {
	key := svc.Key
	if len(ports) == 0 {
		return nil
	}
	bare := ports[0].Port // ports are sorted, so this is the lowest
	for i := range ports {
		if ports[i].Port == 80 {
			bare = 80
		}
	}
	names := [...]string{
		key.Name,
		key.Name + "." + key.Namespace,
		key.Name + "." + key.Namespace + ".svc",
		key.Name + "." + key.Namespace + ".svc." + ClusterDomain,
	}
	var scopeWide string
	if listener != 0 {
		scopeWide = HTTPListenerName(listener) + "/"
	}
	out := make([]*routev3.VirtualHost, 0, len(ports))
	for i := range ports {
		port := ports[i].Port
		p := ":" + strconv.Itoa(int(port))
		domains := make([]string, 0, 2*len(names))
		for _, n := range names {
			if port == bare {
				domains = append(domains, n)
			}
			domains = append(domains, n+p)
		}
		routes, routed := portRoutes(svc, port, rt, model.ListenerEnvoy)
		if !routed {
			routes = []*routev3.Route{routeTo(model.ClusterName(key, port))}
		}
		out = append(out, &routev3.VirtualHost{Name: scopeWide + names[1] + p, Domains: domains, Routes: routes})
	}
	return out
}

// VHDS reports whether an Envoy-mode scope's proxies fetch its virtual hosts
// by VHDS instead of inline in the route configuration: when the scope asks
// for it (spec.listener.virtualHosts, off by default, since only a recent
// Envoy accepts VHDS over ADS). Envoy reads VHDS only over incremental xDS,
// so a SotW scope keeps them inline; so does a Delta scope while it still
// serves the SotW proxies of a change of protocol.
func VHDS(scope *model.Scope) bool {
	return scope.Listener.VHDS && scope.Protocol == model.Delta && (scope.Transition == nil || scope.Transition.From == model.Delta)
}

// routeTo sends every request to one cluster.
func routeTo(cluster string) *routev3.Route {
	return &routev3.Route{
		Match: matchAll,
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		}},
	}
}

// httpListener builds an Envoy-mode scope's listener: plain HTTP on all IPv4
// addresses, routes fetched by RDS over ADS so that a Service change updates
// only the route configuration, never the listener (which would drain its
// connections), and the stateful session filter, unconfigured, which the
// route entries of a rule with sessionPersistence configure.
func httpListener(port int32) *listenerv3.Listener {
	name := HTTPListenerName(port)
	hcm := connectionManager(name, name)
	hcm.HttpFilters = slices.Insert(hcm.HttpFilters, 0, &hcmv3.HttpFilter{
		Name:       StatefulSessionFilter,
		ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&statefulsessionv3.StatefulSession{})},
	})
	return &listenerv3.Listener{
		Name:    name,
		Address: socketAddress("0.0.0.0", uint32(port)),
		FilterChains: []*listenerv3.FilterChain{{
			Filters: []*listenerv3.Filter{{
				Name:       wellknown.HTTPConnectionManager,
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(hcm)},
			}},
		}},
	}
}

// httpVirtualHosts builds an Envoy-mode scope's virtual hosts from the
// fragments' ones, sorted by name and named
// "http-<listener port>/<svc>.<ns>:<port>": the route configuration's name, a
// slash and a host entry, VHDS's naming convention. Envoy files a VHDS
// resource under the route configuration named before the last slash, and
// replaces or removes a virtual host by this name.
//
// A domain claimed by more than one virtual host — in practice the short name
// "svc" (and "svc:port") of two same-named Services in different namespaces
// — would make Envoy reject the whole configuration. It stays with the
// Service in the scope's own namespace, as a short name resolves in a pod's
// own namespace, when exactly one claimant is there; otherwise every claimant
// loses it, since no choice would be right. A virtual host left with no
// domain is dropped, and one that lost the domain it is named by (which only
// keys with dots can share) is named by the first domain it kept instead,
// unique as every kept domain is. Fragments are never modified: a virtual
// host is the fragment's own when the fragment named it for this port and
// it kept every domain, else a shallow copy under its scope-wide name,
// sharing the fragment's routes (and domains, unless some were dropped).
// It returns, in the same order,
// the Service port each virtual host was translated from: a renamed one's
// name no longer says.
//
// Kubernetes names have no dots, and then only dot-free domains (the short
// forms) can be claimed twice, because the number of dots tells the other
// forms apart; so only those are counted, which keeps this linear and cheap
// at ten thousand Services. Should any key contain a dot, every domain is.
func httpVirtualHosts(scope *model.Scope, port int32, fragments []*Fragment) ([]*routev3.VirtualHost, []*model.Origin) {
	all := false
	for _, f := range fragments {
		if strings.Contains(f.Service.Name, ".") || strings.Contains(f.Service.Namespace, ".") {
			all = true
			break
		}
	}
	counted := func(d string) bool { return all || strings.IndexByte(d, '.') < 0 }

	type claims struct{ all, local int32 }
	byDomain := make(map[string]claims, 2*len(fragments))
	n := 0
	for _, f := range fragments {
		local := f.Service.Namespace == scope.Key.Namespace
		n += len(f.Hosts)
		for _, vh := range f.Hosts {
			for _, d := range vh.GetDomains() {
				if !counted(d) {
					continue
				}
				c := byDomain[d]
				c.all++
				if local {
					c.local++
				}
				byDomain[d] = c
			}
		}
	}

	prefix := HTTPListenerName(port) + "/"
	vhosts := make([]*routev3.VirtualHost, 0, n)
	from := make([]*model.Origin, 0, n)
	var kept []string
	for _, f := range fragments {
		local := f.Service.Namespace == scope.Key.Namespace
		named, own := f.hostsPort == port, prefix
		if !named && f.hostsPort != 0 {
			own = HTTPListenerName(f.hostsPort) + "/"
		}
		for i, vh := range f.Hosts {
			kept = kept[:0]
			for _, d := range vh.GetDomains() {
				if !counted(d) {
					kept = append(kept, d)
					continue
				}
				if c := byDomain[d]; c.all == 1 || (local && c.local == 1) {
					kept = append(kept, d)
				}
			}
			domains, host := vh.GetDomains(), vh.GetName()
			if f.hostsPort != 0 {
				host = strings.TrimPrefix(host, own)
			}
			switch len(kept) {
			case 0:
				continue
			case len(domains):
				if named {
					vhosts = append(vhosts, vh)
					from = append(from, originAt(f.hostsFrom, i))
					continue
				}
			default:
				domains = slices.Clone(kept)
				if !slices.Contains(domains, host) {
					// Only dotted keys can claim a full name twice, and then
					// both lose it; a domain the virtual host kept is unique.
					host = domains[0]
				}
			}
			vhosts = append(vhosts, &routev3.VirtualHost{Name: prefix + host, Domains: domains, Routes: vh.GetRoutes()})
			from = append(from, originAt(f.hostsFrom, i))
		}
	}
	sortFrom(vhosts, from, (*routev3.VirtualHost).GetName)
	return vhosts, from
}

// originAt is from[i], or nil past its end.
func originAt(from []*model.Origin, i int) *model.Origin {
	if i < len(from) {
		return from[i]
	}
	return nil
}

// httpRouteConfig builds an Envoy-mode scope's one route configuration:
// with the virtual hosts inline, or, for VHDS, with none and the source
// Envoy fetches them from — ADS, which Envoy accepts for VHDS when its ADS
// stream is delta. The virtual hosts are the scope's VirtualHost resources
// either way, so a proxy routes the same in both protocols, and a SotW
// route configuration is byte for byte the route configuration's name plus
// those resources' bodies, which lets each protocol price the other exactly.
func httpRouteConfig(port int32, vhosts []*routev3.VirtualHost, vhds bool) *routev3.RouteConfiguration {
	if vhds {
		return VHDSRouteConfig(HTTPListenerName(port))
	}
	return &routev3.RouteConfiguration{Name: HTTPListenerName(port), VirtualHosts: vhosts}
}

// VHDSRouteConfig is the route configuration of that name of a Delta
// Envoy-mode scope: no virtual host, fetched by VHDS over ADS. The ADS
// server prices what a SotW scope's proxies would be sent in delta with it.
func VHDSRouteConfig(name string) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, Vhds: &routev3.Vhds{ConfigSource: adsSource}}
}

// GRPCRouteName is the name of a Service port's route configuration for
// gRPC clients: the port's first listener name and, after "@", the
// Service's UID when it has one.
//
// The UID is there for clients that compare what they are sent with what
// they cached: grpc-js-xds keeps a deleted listener or cluster and ignores
// an equal one sent again, and gRPC C-core ignores a route configuration
// equal to the one it had before the listener was deleted. Versions and
// contents are derived from the API state alone, so a Service deleted and
// re-created would otherwise come back byte for byte and reach neither.
// With the UID in the route and cluster names (see clusterName), its
// listeners and route configuration differ and its cluster and assignment
// are names they never saw, while every replica still serves the same
// bytes. Envoy has no such cache, so Envoy-mode names go without it.
func GRPCRouteName(svc *model.Service, port int32) string {
	fqdn, _ := GRPCListenerNames(svc.Key, port)
	if svc.UID == "" {
		return fqdn
	}
	return fqdn + "@" + svc.UID
}

// apiListeners builds the two gRPC API listeners of a Service port; both
// fetch the same route configuration.
func apiListeners(svc *model.Service, port int32) []*listenerv3.Listener {
	fqdn, short := GRPCListenerNames(svc.Key, port)
	route := GRPCRouteName(svc, port)
	return []*listenerv3.Listener{apiListener(fqdn, route), apiListener(short, route)}
}

// apiListener builds a gRPC API listener exactly as grpc-go's xDS client
// accepts it: an HttpConnectionManager in api_listener, RDS over ADS, and the
// router as the last (here only) HTTP filter.
func apiListener(name, routeConfig string) *listenerv3.Listener {
	return &listenerv3.Listener{
		Name:        name,
		ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(connectionManager(name, routeConfig))},
	}
}

// grpcRouteConfig builds the route configuration of a Service port for gRPC
// clients: one virtual host matching both listener names and, for clients
// that override the authority, anything; its routes are the mesh routes'
// entries for the port (rt), or one to the port's own endpoints.
func grpcRouteConfig(svc *model.Service, port int32, rt *Routing) *routev3.RouteConfiguration {
	fqdn, short := GRPCListenerNames(svc.Key, port)
	cluster := clusterName(svc, port, model.ListenerProxylessGRPC)
	routes, routed := portRoutes(svc, port, rt, model.ListenerProxylessGRPC)
	if !routed {
		routes = []*routev3.Route{routeTo(cluster)}
	}
	return &routev3.RouteConfiguration{
		Name: GRPCRouteName(svc, port),
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    cluster,
			Domains: []string{fqdn, short, "*"},
			Routes:  routes,
		}},
	}
}

// connectionManager builds the HttpConnectionManager both modes use: routes
// by RDS over ADS and the router filter, which must be last.
func connectionManager(statPrefix, routeConfig string) *hcmv3.HttpConnectionManager {
	return &hcmv3.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsSource,
			RouteConfigName: routeConfig,
		}},
		HttpFilters: []*hcmv3.HttpFilter{{
			Name:       wellknown.Router,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})},
		}},
	}
}

// mustAny packs m deterministically, so equal input gives equal bytes. It
// panics only if m cannot be marshalled, which for these messages means a
// string that is not UTF-8 — impossible for names Kubernetes has validated.
func mustAny(m proto.Message) *anypb.Any {
	a := new(anypb.Any)
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		panic("translate: cannot pack " + string(m.ProtoReflect().Descriptor().FullName()) + ": " + err.Error())
	}
	return a
}
