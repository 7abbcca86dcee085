package translate

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/xds/envoyvalid"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// testInput is the test-only YAML form of one scope and its selected
// Services; selections and labels are left out because the translator never
// sees them.
type testInput struct {
	Scope    testScope     `json:"scope"`
	Services []testService `json:"services"`
}

type testScope struct {
	Namespace string             `json:"namespace"`
	Name      string             `json:"name"`
	Mode      model.ListenerMode `json:"mode"`
	Port      int32              `json:"port,omitempty"`
	Protocol  model.Protocol     `json:"protocol,omitempty"`
	// VirtualHosts is spec.listener.virtualHosts: Inline or VHDS.
	VirtualHosts string `json:"virtualHosts,omitempty"`
	// LocalityPriority is spec.localityPriority: None or SameZone.
	LocalityPriority string `json:"localityPriority,omitempty"`
	// Generation is the ProxyScope's metadata.generation, the epoch of a
	// ProxylessGRPC scope.
	Generation int64 `json:"generation,omitempty"`
}

type testService struct {
	Namespace    string         `json:"namespace"`
	Name         string         `json:"name"`
	ExternalName string         `json:"externalName,omitempty"`
	Ports        []testPort     `json:"ports,omitempty"`
	Endpoints    []testEndpoint `json:"endpoints,omitempty"`
	// TrafficDistribution is spec.trafficDistribution.
	TrafficDistribution string `json:"trafficDistribution,omitempty"`
}

type testPort struct {
	Name           string             `json:"name,omitempty"`
	Port           int32              `json:"port"`
	Protocol       model.PortProtocol `json:"protocol,omitempty"`
	AppProtocol    string             `json:"appProtocol,omitempty"`
	TargetPort     int32              `json:"targetPort,omitempty"`
	TargetPortName string             `json:"targetPortName,omitempty"`
}

// testEndpoint defaults its conditions as the EndpointSlice API does: an
// unset ready means ready, an unset serving means the value of ready.
type testEndpoint struct {
	Address     string             `json:"address"`
	Ports       []testEndpointPort `json:"ports,omitempty"`
	Ready       *bool              `json:"ready,omitempty"`
	Serving     *bool              `json:"serving,omitempty"`
	Terminating bool               `json:"terminating,omitempty"`
	Zone        string             `json:"zone,omitempty"`
	Node        string             `json:"node,omitempty"`
	// ForZones and ForNodes are the endpoint's hints.
	ForZones []string `json:"forZones,omitempty"`
	ForNodes []string `json:"forNodes,omitempty"`
}

type testEndpointPort struct {
	Name     string             `json:"name,omitempty"`
	Port     int32              `json:"port"`
	Protocol model.PortProtocol `json:"protocol,omitempty"`
}

// parseInput decodes a testInput strictly, so a misspelt field fails the
// test instead of silently meaning nothing.
func parseInput(data []byte) (*model.Scope, []*model.Service, error) {
	var in testInput
	if err := yaml.UnmarshalStrict(data, &in); err != nil {
		return nil, nil, err
	}
	scope := &model.Scope{
		Key:          model.Key{Namespace: in.Scope.Namespace, Name: in.Scope.Name},
		Protocol:     cmp.Or(in.Scope.Protocol, model.SotW),
		Listener:     model.Listener{Mode: in.Scope.Mode, Port: in.Scope.Port, VHDS: in.Scope.VirtualHosts == "VHDS"},
		ZonePriority: in.Scope.LocalityPriority == "SameZone",
		Generation:   in.Scope.Generation,
	}
	services := make([]*model.Service, 0, len(in.Services))
	for _, s := range in.Services {
		svc := &model.Service{
			Key:                 model.Key{Namespace: s.Namespace, Name: s.Name},
			ExternalName:        s.ExternalName,
			TrafficDistribution: s.TrafficDistribution,
		}
		for _, p := range s.Ports {
			svc.Ports = append(svc.Ports, model.ServicePort(p))
		}
		for _, e := range s.Endpoints {
			ep := model.Endpoint{
				Address:     e.Address,
				Family:      model.IPv4,
				Ready:       e.Ready == nil || *e.Ready,
				Terminating: e.Terminating,
				Zone:        e.Zone,
				Node:        e.Node,
				ForZones:    e.ForZones,
				ForNodes:    e.ForNodes,
			}
			ep.Serving = ep.Ready
			if e.Serving != nil {
				ep.Serving = *e.Serving
			}
			if strings.Contains(e.Address, ":") {
				ep.Family = model.IPv6
			}
			for _, p := range e.Ports {
				ep.Ports = append(ep.Ports, model.EndpointPort{Name: p.Name, Port: p.Port, Protocol: cmp.Or(p.Protocol, model.ProtocolTCP)})
			}
			svc.Endpoints = append(svc.Endpoints, ep)
		}
		services = append(services, svc)
	}
	return scope, services, nil
}

// render writes resources as YAML: protojson (Any payloads resolved from the
// global registry) converted by sigs.k8s.io/yaml, which sorts keys, so the
// output is stable and readable in review. Each place's assignments are a
// section "endpoints@<place>", after the others.
func render(res Resources) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("{")
	sections := []struct {
		key  string
		msgs []proto.Message
	}{
		{"clusters", asMessages(res.Clusters)},
		{"endpoints", asMessages(res.Endpoints)},
		{"listeners", asMessages(res.Listeners)},
		{"routes", asMessages(res.Routes)},
		{"virtualHosts", asMessages(res.VirtualHosts)},
	}
	for _, p := range res.Places {
		sections = append(sections, struct {
			key  string
			msgs []proto.Message
		}{"endpoints@" + p.Place.String(), asMessages(p.Endpoints)})
	}
	opts := protojson.MarshalOptions{Multiline: true}
	for i, s := range sections {
		if i > 0 {
			buf.WriteString(",")
		}
		fmt.Fprintf(&buf, "%q:[", s.key)
		for j, m := range s.msgs {
			if j > 0 {
				buf.WriteString(",")
			}
			b, err := opts.Marshal(m)
			if err != nil {
				return nil, err
			}
			buf.Write(b)
		}
		buf.WriteString("]")
	}
	buf.WriteString("}")
	return yaml.JSONToYAML(buf.Bytes())
}

func asMessages[T proto.Message](s []T) []proto.Message {
	out := make([]proto.Message, len(s))
	for i, m := range s {
		out[i] = m
	}
	return out
}

// wire marshals every resource deterministically, in order, so two results
// can be compared byte for byte.
func wire(res Resources) ([]byte, error) {
	var buf bytes.Buffer
	opts := proto.MarshalOptions{Deterministic: true}
	all := [][]proto.Message{asMessages(res.Clusters), asMessages(res.Endpoints), asMessages(res.Listeners), asMessages(res.Routes), asMessages(res.VirtualHosts)}
	for _, p := range res.Places {
		all = append(all, asMessages(p.Endpoints))
	}
	for _, msgs := range all {
		buf.WriteString("--\n")
		for _, m := range msgs {
			b, err := opts.Marshal(m)
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(&buf, "%d:", len(b))
			buf.Write(b)
		}
	}
	return buf.Bytes(), nil
}

// validateAll runs Envoy's generated validation on every resource and, as
// Envoy does before it accepts one, on every message packed in its Any
// fields (an HTTP filter's config, a route's per-filter config, a
// cluster's protocol options, and what those pack in turn), which
// ValidateAll does not enter. A packed type this binary does not know is
// an error: Envoy refuses an extension it does not have.
func validateAll(res Resources) error {
	var errs []error
	res.Each(func(t xdstype.Type, m proto.Message) {
		if err := envoyvalid.Message(m); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", t, nameOf(m), err))
		}
	})
	for _, p := range res.Places {
		for _, e := range p.Endpoints {
			if err := envoyvalid.Message(e); err != nil {
				errs = append(errs, fmt.Errorf("endpoints %s at %s: %w", e.GetClusterName(), p.Place, err))
			}
		}
	}
	return errors.Join(errs...)
}

// nameOf is a resource's name, whatever its type calls it.
func nameOf(m proto.Message) string {
	switch r := m.(type) {
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName()
	case interface{ GetName() string }:
		return r.GetName()
	}
	return "?"
}

// connectionManagerOf unpacks a listener's HttpConnectionManager, from its
// api_listener or from its single filter chain's single filter.
func connectionManagerOf(l *listenerv3.Listener) (*hcmv3.HttpConnectionManager, error) {
	hcm := &hcmv3.HttpConnectionManager{}
	if api := l.GetApiListener(); api != nil {
		return hcm, api.GetApiListener().UnmarshalTo(hcm)
	}
	if len(l.GetFilterChains()) != 1 || len(l.GetFilterChains()[0].GetFilters()) != 1 {
		return nil, errors.New("want exactly one filter chain with one filter")
	}
	f := l.GetFilterChains()[0].GetFilters()[0]
	if f.GetName() != wellknown.HTTPConnectionManager {
		return nil, fmt.Errorf("filter %q, want %q", f.GetName(), wellknown.HTTPConnectionManager)
	}
	return hcm, f.GetTypedConfig().UnmarshalTo(hcm)
}

// checkInvariants checks what Envoy and grpc-go require beyond
// ValidateAll, and the translator's own promises: sorted unique names, every
// reference resolvable, a locality and a positive weight everywhere, no
// duplicate endpoint, unique domains per route configuration, the router
// last.
func checkInvariants(scope *model.Scope, res Resources) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	sortedUnique := func(kind string, names []string) {
		for i, n := range names {
			if n == "" {
				fail("%s: empty name", kind)
			}
			if i > 0 && names[i-1] >= n {
				fail("%s: %q then %q: not sorted and unique", kind, names[i-1], n)
			}
		}
	}
	names := func(n int, at func(int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = at(i)
		}
		return out
	}
	sortedUnique("clusters", names(len(res.Clusters), func(i int) string { return res.Clusters[i].GetName() }))
	sortedUnique("endpoints", names(len(res.Endpoints), func(i int) string { return res.Endpoints[i].GetClusterName() }))
	sortedUnique("listeners", names(len(res.Listeners), func(i int) string { return res.Listeners[i].GetName() }))
	sortedUnique("routes", names(len(res.Routes), func(i int) string { return res.Routes[i].GetName() }))

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range res.Clusters {
		clusters[c.GetName()] = c
	}
	clas := map[string]bool{}
	for _, e := range res.Endpoints {
		clas[e.GetClusterName()] = true
		if c := clusters[e.GetClusterName()]; c == nil || c.GetType() != clusterv3.Cluster_EDS {
			fail("endpoints %s: no EDS cluster of that name", e.GetClusterName())
		}
		if err := checkAssignment(e); err != nil {
			fail("endpoints %s: %v", e.GetClusterName(), err)
		}
	}
	for i, p := range res.Places {
		if i > 0 && res.Places[i-1].Place.Compare(p.Place) >= 0 {
			fail("places: %v then %v: not sorted and unique", res.Places[i-1].Place, p.Place)
		}
		if (p.Place.Zone == "") == (p.Place.Node == "") {
			fail("place %+v: want a zone or a Node", p.Place)
		}
		sortedUnique("endpoints at "+p.Place.String(), names(len(p.Endpoints), func(i int) string { return p.Endpoints[i].GetClusterName() }))
		for _, e := range p.Endpoints {
			if !clas[e.GetClusterName()] {
				fail("endpoints %s at %v: no scope-wide assignment of that name", e.GetClusterName(), p.Place)
			}
			if err := checkAssignment(e); err != nil {
				fail("endpoints %s at %v: %v", e.GetClusterName(), p.Place, err)
			}
		}
	}
	for _, c := range res.Clusters {
		if c.GetConnectTimeout().AsDuration() != ConnectTimeout || c.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN {
			fail("cluster %s: connect timeout %v, lb policy %v", c.GetName(), c.GetConnectTimeout().AsDuration(), c.GetLbPolicy())
		}
		if err := checkOutlierDetection(scope, c); err != nil {
			fail("cluster %s: %v", c.GetName(), err)
		}
		switch c.GetType() {
		case clusterv3.Cluster_EDS:
			eds := c.GetEdsClusterConfig()
			if eds.GetServiceName() != c.GetName() || eds.GetEdsConfig().GetAds() == nil || eds.GetEdsConfig().GetResourceApiVersion() != corev3.ApiVersion_V3 {
				fail("cluster %s: EDS config %v", c.GetName(), eds)
			}
			if !clas[c.GetName()] {
				fail("cluster %s: no ClusterLoadAssignment", c.GetName())
			}
		case clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
			if (c.GetType() == clusterv3.Cluster_LOGICAL_DNS) != (scope.Listener.Mode == model.ListenerProxylessGRPC) {
				fail("cluster %s: DNS type %v in mode %s", c.GetName(), c.GetType(), scope.Listener.Mode)
			}
			la := c.GetLoadAssignment()
			if la.GetClusterName() != c.GetName() || len(la.GetEndpoints()) != 1 || len(la.GetEndpoints()[0].GetLbEndpoints()) != 1 || la.GetEndpoints()[0].GetLocality() == nil {
				fail("cluster %s: DNS load assignment must be one locality with one endpoint: %v", c.GetName(), la)
			}
			if clas[c.GetName()] {
				fail("cluster %s: DNS cluster has a ClusterLoadAssignment", c.GetName())
			}
		default:
			fail("cluster %s: type %v", c.GetName(), c.GetType())
		}
	}

	sortedUnique("virtual hosts", names(len(res.VirtualHosts), func(i int) string { return res.VirtualHosts[i].GetName() }))
	routes := map[string]*routev3.RouteConfiguration{}
	for _, r := range res.Routes {
		routes[r.GetName()] = r
		vhosts := r.GetVirtualHosts()
		if scope.Listener.Mode != model.ListenerProxylessGRPC {
			// The scope's virtual hosts, fetched by VHDS or carried inline.
			if VHDS(scope) != (r.GetVhds() != nil) || (r.GetVhds() != nil && len(vhosts) != 0) {
				fail("route %s: VHDS %v, inline virtual hosts %d, for a %s scope", r.GetName(), r.GetVhds(), len(vhosts), scope.Protocol)
			}
			if cs := r.GetVhds().GetConfigSource(); r.GetVhds() != nil && (cs.GetAds() == nil || cs.GetResourceApiVersion() != corev3.ApiVersion_V3) {
				fail("route %s: VHDS config source %v", r.GetName(), cs)
			}
			if r.GetVhds() == nil && !slices.EqualFunc(vhosts, res.VirtualHosts, func(a, b *routev3.VirtualHost) bool { return proto.Equal(a, b) }) {
				fail("route %s: the inline virtual hosts are not the scope's", r.GetName())
			}
			vhosts = res.VirtualHosts
			for _, vh := range vhosts {
				// Envoy files a VHDS resource under the route configuration
				// named before its last slash.
				if i := strings.LastIndexByte(vh.GetName(), '/'); i < 0 || vh.GetName()[:i] != r.GetName() {
					fail("virtual host %s: not named under route configuration %s", vh.GetName(), r.GetName())
				}
			}
		} else if len(res.VirtualHosts) != 0 {
			fail("proxyless mode: %d virtual host resources", len(res.VirtualHosts))
		}
		domains := map[string]string{}
		var vhNames []string
		for _, vh := range vhosts {
			vhNames = append(vhNames, vh.GetName())
			if len(vh.GetDomains()) == 0 {
				fail("route %s: virtual host %s has no domain", r.GetName(), vh.GetName())
			}
			for _, d := range vh.GetDomains() {
				if other, dup := domains[d]; dup {
					fail("route %s: domain %q in virtual hosts %s and %s", r.GetName(), d, other, vh.GetName())
				}
				domains[d] = vh.GetName()
			}
			if len(vh.GetRoutes()) != 1 || vh.GetRoutes()[0].GetMatch().GetPrefix() != "/" {
				fail("route %s: virtual host %s: want one route on prefix /", r.GetName(), vh.GetName())
			}
			for _, rt := range vh.GetRoutes() {
				if clusters[rt.GetRoute().GetCluster()] == nil {
					fail("route %s: virtual host %s routes to unknown cluster %q", r.GetName(), vh.GetName(), rt.GetRoute().GetCluster())
				}
			}
		}
		sortedUnique("route "+r.GetName()+" virtual hosts", vhNames)
	}
	for _, l := range res.Listeners {
		hcm, err := connectionManagerOf(l)
		if err != nil {
			fail("listener %s: %v", l.GetName(), err)
			continue
		}
		if cs := hcm.GetRds().GetConfigSource(); cs.GetAds() == nil || cs.GetResourceApiVersion() != corev3.ApiVersion_V3 {
			fail("listener %s: RDS config source %v", l.GetName(), cs)
		}
		if routes[hcm.GetRds().GetRouteConfigName()] == nil {
			fail("listener %s: route configuration %q missing", l.GetName(), hcm.GetRds().GetRouteConfigName())
		}
		fs := hcm.GetHttpFilters()
		// The router is found by its type; a stamped listener's names it
		// with the scope's epoch (see EpochMetadataKey).
		routerName := wellknown.Router
		if Stamped(scope) {
			routerName = fmt.Sprintf("%s/epoch-%d", wellknown.Router, scope.Generation)
		}
		if len(fs) == 0 || fs[len(fs)-1].GetName() != routerName || !fs[len(fs)-1].GetTypedConfig().MessageIs(&routerv3.Router{}) {
			fail("listener %s: router is not the last HTTP filter: %v", l.GetName(), fs)
		}
		switch scope.Listener.Mode {
		case model.ListenerProxylessGRPC:
			if l.GetApiListener() == nil || l.GetAddress() != nil || len(l.GetFilterChains()) != 0 {
				fail("listener %s: want an API listener only", l.GetName())
			}
		default:
			if l.GetName() != HTTPListenerName(scope.Listener.Port) || l.GetAddress().GetSocketAddress().GetPortValue() != uint32(scope.Listener.Port) {
				fail("listener %s: want %s on port %d", l.GetName(), HTTPListenerName(scope.Listener.Port), scope.Listener.Port)
			}
		}
	}
	if scope.Listener.Mode != model.ListenerProxylessGRPC {
		want := 0
		if validPort(scope.Listener.Port) {
			want = 1
		}
		if len(res.Listeners) != want || len(res.Routes) != want {
			fail("envoy mode: %d listeners and %d route configurations, want %d", len(res.Listeners), len(res.Routes), want)
		}
	}
	return errors.Join(errs...)
}

// checkOutlierDetection checks a cluster's outlier detection: none in an
// Envoy scope; in a Stamped one, one that gRFC A50 gives no ejection
// algorithm (enforcing_success_rate and enforcing_failure_percentage set
// to 0; success rate ejection is on when the first is unset), so that no
// gRPC client counts calls or ejects an address, with the scope's epoch as
// max_ejection_time, which grpc-js-xds compares and nothing acts on, and
// nothing else.
func checkOutlierDetection(scope *model.Scope, c *clusterv3.Cluster) error {
	od := c.GetOutlierDetection()
	if !Stamped(scope) {
		if od != nil {
			return fmt.Errorf("outlier detection %v in an unstamped scope", od)
		}
		return nil
	}
	if od == nil {
		return errors.New("no outlier detection to carry the epoch")
	}
	if od.GetEnforcingSuccessRate() == nil || od.GetEnforcingSuccessRate().GetValue() != 0 || od.GetEnforcingFailurePercentage().GetValue() != 0 {
		return fmt.Errorf("outlier detection %v configures an ejection algorithm", od)
	}
	met := od.GetMaxEjectionTime()
	if err := met.CheckValid(); err != nil || met.GetNanos() != 0 || met.GetSeconds() <= 0 || (scope.Generation > 0 && met.GetSeconds() != scope.Generation) {
		return fmt.Errorf("outlier detection max_ejection_time %v, want the generation %d in seconds", met, scope.Generation)
	}
	rest := proto.Clone(od).(*clusterv3.OutlierDetection)
	rest.EnforcingSuccessRate, rest.EnforcingFailurePercentage, rest.MaxEjectionTime = nil, nil, nil
	if !proto.Equal(rest, &clusterv3.OutlierDetection{}) {
		return fmt.Errorf("outlier detection sets more than the epoch needs: %v", rest)
	}
	return nil
}

// checkAssignment checks one ClusterLoadAssignment against what grpc-go's
// EDS parser and the translator promise.
func checkAssignment(cla *endpointv3.ClusterLoadAssignment) error {
	type hostPort struct {
		addr netip.Addr
		port uint32
	}
	seen := map[hostPort]bool{}
	type tier struct {
		prio uint32
		zone string
	}
	var last *tier
	// Priorities start at 0 and leave no gap: grpc-go and C-core reject
	// one.
	for _, loc := range cla.GetEndpoints() {
		if loc.GetLocality() == nil {
			return errors.New("locality without Locality")
		}
		zone := loc.GetLocality().GetZone()
		cur := tier{loc.GetPriority(), zone}
		switch {
		case last == nil && cur.prio != 0:
			return fmt.Errorf("zone %q: first priority %d, want 0", zone, cur.prio)
		case last != nil && cur.prio != last.prio && cur.prio != last.prio+1:
			return fmt.Errorf("zone %q: priority %d after %d", zone, cur.prio, last.prio)
		case last != nil && cur.prio == last.prio && last.zone >= zone:
			return fmt.Errorf("priority %d: zones not sorted and unique: %q then %q", cur.prio, last.zone, zone)
		}
		last = &cur
		if len(loc.GetLbEndpoints()) == 0 {
			return fmt.Errorf("zone %q: empty locality", zone)
		}
		var prev *hostPort
		for _, lb := range loc.GetLbEndpoints() {
			if lb.GetLoadBalancingWeight().GetValue() != 1 {
				return fmt.Errorf("endpoint weight %v", lb.GetLoadBalancingWeight())
			}
			if lb.GetHealthStatus() != corev3.HealthStatus_HEALTHY {
				return fmt.Errorf("health %v", lb.GetHealthStatus())
			}
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addr, err := netip.ParseAddr(sa.GetAddress())
			if err != nil {
				return err
			}
			hp := hostPort{addr, sa.GetPortValue()}
			if hp.port == 0 || hp.port > 65535 {
				return fmt.Errorf("port %d", hp.port)
			}
			if seen[hp] {
				return fmt.Errorf("duplicate endpoint %s", sa)
			}
			seen[hp] = true
			if prev != nil && cmp.Or(prev.addr.Compare(hp.addr), cmp.Compare(prev.port, hp.port)) >= 0 {
				return fmt.Errorf("endpoints not sorted: %v then %v", *prev, hp)
			}
			prev = &hp
		}
		if w := loc.GetLoadBalancingWeight().GetValue(); w != uint32(len(loc.GetLbEndpoints())) {
			return fmt.Errorf("zone %q: locality weight %d, want %d", zone, w, len(loc.GetLbEndpoints()))
		}
	}
	return nil
}

// shuffled returns a deep copy of the Services in a random order, with the
// order of each Service's ports, endpoints and endpoint ports shuffled too —
// every order the translator promises not to depend on.
func shuffled(r *rand.Rand, services []*model.Service) []*model.Service {
	out := cloneServices(services)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	for _, s := range out {
		r.Shuffle(len(s.Ports), func(i, j int) { s.Ports[i], s.Ports[j] = s.Ports[j], s.Ports[i] })
		r.Shuffle(len(s.Endpoints), func(i, j int) { s.Endpoints[i], s.Endpoints[j] = s.Endpoints[j], s.Endpoints[i] })
		for k := range s.Endpoints {
			ps := s.Endpoints[k].Ports
			r.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
		}
	}
	return out
}

// cloneServices deep-copies Services, so tests can prove the translator
// leaves its input alone.
func cloneServices(services []*model.Service) []*model.Service {
	if services == nil {
		return nil
	}
	out := make([]*model.Service, len(services))
	for i, s := range services {
		c := *s
		c.Ports = slices.Clone(s.Ports)
		c.Endpoints = slices.Clone(s.Endpoints)
		for k := range c.Endpoints {
			c.Endpoints[k].Ports = slices.Clone(c.Endpoints[k].Ports)
		}
		out[i] = &c
	}
	return out
}
