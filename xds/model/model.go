// Package model is the Kubernetes-free intermediate representation between
// the reconcilers and the xDS translator: Services with their ports and the
// endpoints merged from all of their EndpointSlices, namespaces with their
// labels, and scopes with their protocol, listener and selections.
//
// Kubernetes objects are converted into it in one place (package
// controllers/convert); the translator reads only these types, so it can be
// tested, fuzzed and benchmarked without an API server.
package model

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// Key names a namespaced object (a Service or a scope).
type Key struct {
	Namespace string
	Name      string
}

// String returns "namespace/name", the form scopes are named by in node metadata.
func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Compare orders keys by namespace, then name.
func (k Key) Compare(o Key) int {
	switch {
	case k.Namespace < o.Namespace:
		return -1
	case k.Namespace > o.Namespace:
		return 1
	case k.Name < o.Name:
		return -1
	case k.Name > o.Name:
		return 1
	}
	return 0
}

// Service is one Kubernetes Service with the endpoints of all its EndpointSlices.
type Service struct {
	Key Key
	// UID is the Service's metadata.uid: which incarnation of the name this
	// is. ProxylessGRPC cluster, assignment and route configuration names
	// carry it (see translate.GRPCRouteName), so that a Service deleted and
	// re-created is new to gRPC clients that cache what they saw; "" leaves
	// the names without it.
	UID    string
	Labels map[string]string
	// ExternalName is the DNS name of an ExternalName Service; such a Service
	// has no endpoints and is resolved by the proxy.
	ExternalName string
	Ports        []ServicePort
	// Endpoints are merged across every EndpointSlice of the Service, in a
	// deterministic order (address, then the slice's ports).
	Endpoints []Endpoint
	// TrafficDistribution is the Service's spec.trafficDistribution
	// (PreferClose, PreferSameZone, PreferSameNode), "" when unset: a
	// Service that sets it is routed by its EndpointSlices' hints, as
	// kube-proxy routes it, and never by a scope's zone priorities.
	TrafficDistribution string
}

// Topology reports whether the Service asks Kubernetes to keep its traffic
// close: it sets a traffic distribution, or an endpoint carries hints.
func (s *Service) Topology() bool {
	if s.TrafficDistribution != "" {
		return true
	}
	for i := range s.Endpoints {
		if len(s.Endpoints[i].ForZones) > 0 || len(s.Endpoints[i].ForNodes) > 0 {
			return true
		}
	}
	return false
}

// PortProtocol is the L4 protocol of a port.
type PortProtocol string

// L4 protocols a Service port may declare.
const (
	ProtocolTCP  PortProtocol = "TCP"
	ProtocolUDP  PortProtocol = "UDP"
	ProtocolSCTP PortProtocol = "SCTP"
)

// ServicePort is one port of a Service.
type ServicePort struct {
	// Name is the port's name; EndpointSlice ports carry the same name, which
	// is how an endpoint's port is found for this Service port.
	Name        string
	Port        int32
	Protocol    PortProtocol
	AppProtocol string
	// TargetPort is the numeric target port, or 0 when TargetPortName is set.
	TargetPort int32
	// TargetPortName is a named container port; each EndpointSlice resolves
	// it to a number of its own.
	TargetPortName string
}

// AddressFamily is the IP family of an endpoint address.
type AddressFamily uint8

// Address families an EndpointSlice may carry (FQDN slices are not modelled).
const (
	IPv4 AddressFamily = 4
	IPv6 AddressFamily = 6
)

// EndpointPort is a port of an EndpointSlice, which applies to every endpoint
// of that slice.
type EndpointPort struct {
	// Name matches the ServicePort.Name it serves.
	Name     string
	Port     int32
	Protocol PortProtocol
}

// Endpoint is one address of an EndpointSlice with the slice's ports and the
// endpoint's conditions, already defaulted as the EndpointSlice API defines
// them (nil ready means ready; nil serving means the value of ready).
type Endpoint struct {
	Address     string
	Family      AddressFamily
	Ports       []EndpointPort
	Ready       bool
	Serving     bool
	Terminating bool
	Zone        string
	Node        string
	// ForZones and ForNodes are the endpoint's EndpointSlice hints, sorted:
	// the zones, and the Nodes, whose clients should use it.
	ForZones []string
	ForNodes []string
}

// ScopeMetadataKey is the xDS node metadata key by which a proxy names the
// scope it joins; the value is "<namespace>/<name>" of a ProxyScope. The
// bootstraps write it and the ADS server reads it.
const ScopeMetadataKey = "scopeplane.dev/scope"

// Location is where a proxy runs, as far as the control plane can tell.
type Location struct {
	// Zone is the proxy's topology zone ("" when unknown).
	Zone string
	// Node is the Kubernetes Node the proxy's pod runs on, when its
	// authenticated token names it.
	Node string
	// Source says how Zone is known.
	Source LocationSource
}

// Place is where a view of a scope's endpoints is taken from: one Node
// (Zone empty) or one zone (Node empty). A proxy sees, of each assignment,
// the view of its Node if there is one, else that of its zone, else the
// scope's own (see Location.Places).
type Place struct {
	Zone string
	Node string
}

// Compare orders places: Nodes first, by name, then zones.
func (p Place) Compare(o Place) int {
	switch {
	case p.Node != o.Node && (p.Node == "" || o.Node == ""):
		if p.Node != "" {
			return -1
		}
		return 1
	case p.Node < o.Node:
		return -1
	case p.Node > o.Node:
		return 1
	case p.Zone < o.Zone:
		return -1
	case p.Zone > o.Zone:
		return 1
	}
	return 0
}

// String names the place for goldens and errors: "node/<name>" or "zone/<name>".
func (p Place) String() string {
	if p.Node != "" {
		return "node/" + p.Node
	}
	return "zone/" + p.Zone
}

// Places returns where the proxy's views come from, the most specific
// first: its Node's, then its zone's. Either is the zero Place when unknown.
func (l Location) Places() (node, zone Place) {
	if l.Node != "" {
		node = Place{Node: l.Node}
	}
	if l.Zone != "" {
		zone = Place{Zone: l.Zone}
	}
	return node, zone
}

// LocationSource says how a proxy's zone is known, from the most trusted.
type LocationSource string

const (
	// LocatedByNode says the authenticated ServiceAccount token names the
	// proxy's pod and Node, and the zone is that Node's
	// topology.kubernetes.io/zone label.
	LocatedByNode LocationSource = "Node"
	// LocatedByBootstrap says the proxy declares node.locality.zone in its
	// bootstrap, which nothing verifies.
	LocatedByBootstrap LocationSource = "Bootstrap"
)

// Protocol is the xDS protocol of a scope.
type Protocol string

// The xDS protocols a scope can require.
const (
	SotW  Protocol = "SotW"
	Delta Protocol = "Delta"
)

// APIType is what a proxy's bootstrap sets as ads_config.api_type (the name
// of Envoy's ApiConfigSource.ApiType value) to speak the protocol: the one
// place the two spellings meet, for bootstraps, refusals and status.
func (p Protocol) APIType() string {
	if p == Delta {
		return "DELTA_GRPC"
	}
	return "GRPC"
}

// ListenerMode says how a scope's proxies consume configuration.
type ListenerMode string

// Listener modes, as in the ProxyScope API.
const (
	ListenerEnvoy         ListenerMode = "Envoy"
	ListenerProxylessGRPC ListenerMode = "ProxylessGRPC"
)

// Listener is a scope's listener settings.
type Listener struct {
	Mode ListenerMode
	// Port is the Envoy HTTP listener's port; 0 in ProxylessGRPC mode.
	Port int32
	// VHDS sends an Envoy listener's virtual hosts to Delta proxies as
	// VHDS resources instead of inline in its route configuration.
	VHDS bool
}

// Scope is a ProxyScope as the translator and the xDS server see it.
type Scope struct {
	Key        Key
	Generation int64
	Protocol   Protocol
	Listener   Listener
	Selections []Selection
	// Proxies, when not empty, are the ServiceAccounts (of Key.Namespace)
	// whose proxies the scope admits; empty admits every ServiceAccount of
	// the namespace.
	Proxies []string
	// AdmitByPeerAddress admits proxies that present no credential as the
	// one Running Pod holding their address (auth.MethodPeerAddress).
	AdmitByPeerAddress bool
	// TransitionWindow is how long proxies of the previous protocol are
	// still served after Protocol changes.
	TransitionWindow time.Duration
	// ZonePriority orders, for each proxy, the endpoints of its own zone
	// first (priority 0, the rest at 1), in Services that ask Kubernetes
	// for no topology (Service.Topology).
	ZonePriority bool
	// Transition is the change of protocol in progress (nil when there is
	// none): set by the catalog when it sees Protocol change, or for a
	// scope the catalog has not seen, carried from the ProxyScope's status,
	// so that a restarted replica serves the transition it was serving.
	Transition *Transition
}

// Transition is a change of a scope's protocol, observed at Since: From is
// still served until Until, Since plus the scope's TransitionWindow.
type Transition struct {
	From         Protocol
	Since, Until time.Time
}

// Serves reports whether the scope serves a stream of protocol p at now:
// its protocol, or the previous one during a transition.
func (sc *Scope) Serves(p Protocol, now time.Time) bool {
	return p == sc.Protocol || sc.InTransition(p, now)
}

// InTransition reports whether p is the previous protocol, still served at now.
func (sc *Scope) InTransition(p Protocol, now time.Time) bool {
	return sc.Transition != nil && sc.Transition.From == p && now.Before(sc.Transition.Until)
}

// Selection selects Services in one namespace or in the namespaces that
// match NamespaceSelector. A nil Names or Selector does not restrict.
type Selection struct {
	// Namespace is the namespace searched when NamespaceSelector is nil.
	Namespace string
	// Names, when non-nil, is the set of Service names selected.
	Names map[string]struct{}
	// Selector, when non-nil, must match the Service's labels.
	Selector labels.Selector
	// NamespaceSelector, when non-nil, selects namespaces by their labels.
	NamespaceSelector labels.Selector
}

// Matches reports whether the Service is selected, given the labels of its
// namespace (nil when the namespace is unknown).
func (s *Selection) Matches(svc *Service, nsLabels map[string]string, nsKnown bool) bool {
	return s.check(svc, nsLabels, nsKnown) == selected
}

// Why a selection does not select a Service.
type mismatch int

const (
	selected mismatch = iota
	noNamespace
	namespaceLabels
	otherNamespace
	notNamed
	serviceLabels
)

// check is the one definition of selection: the catalog applies it through
// Matches, kubectl scopeplane explain reports it through Mismatch.
func (s *Selection) check(svc *Service, nsLabels map[string]string, nsKnown bool) mismatch {
	if s.NamespaceSelector != nil {
		if !nsKnown {
			return noNamespace
		}
		if !s.NamespaceSelector.Matches(labels.Set(nsLabels)) {
			return namespaceLabels
		}
	} else if svc.Key.Namespace != s.Namespace {
		return otherNamespace
	}
	if s.Names != nil {
		if _, ok := s.Names[svc.Key.Name]; !ok {
			return notNamed
		}
	}
	if s.Selector != nil && !s.Selector.Matches(labels.Set(svc.Labels)) {
		return serviceLabels
	}
	return selected
}

// Mismatch says why the selection does not select the Service, or returns
// "" when it does.
func (s *Selection) Mismatch(svc *Service, nsLabels map[string]string, nsKnown bool) string {
	switch s.check(svc, nsLabels, nsKnown) {
	case noNamespace:
		return fmt.Sprintf("namespace %q does not exist", svc.Key.Namespace)
	case namespaceLabels:
		return fmt.Sprintf("the labels of namespace %q {%s} do not match namespaceSelector {%s}",
			svc.Key.Namespace, labels.Set(nsLabels), s.NamespaceSelector)
	case otherNamespace:
		return fmt.Sprintf("it selects namespace %q, the Service is in %q", s.Namespace, svc.Key.Namespace)
	case notNamed:
		return fmt.Sprintf("%q is not among its names %v", svc.Key.Name, slices.Sorted(maps.Keys(s.Names)))
	case serviceLabels:
		return fmt.Sprintf("the Service's labels {%s} do not match selector {%s}", labels.Set(svc.Labels), s.Selector)
	}
	return ""
}

// Selects reports whether any selection of the scope matches the Service.
func (sc *Scope) Selects(svc *Service, nsLabels map[string]string, nsKnown bool) bool {
	for i := range sc.Selections {
		if sc.Selections[i].Matches(svc, nsLabels, nsKnown) {
			return true
		}
	}
	return false
}

// ClusterName is the Envoy cluster name of a Service port. It is stable and
// unique per Service port, and readable in Envoy's admin output.
func ClusterName(svc Key, port int32) string {
	return fmt.Sprintf("%s/%s:%d", svc.Namespace, svc.Name, port)
}

// Origin is the Service port a resource was translated from: its
// provenance. The translator sets it, and it travels with the resource
// through the catalog to the snapshot, so that no later stage reads it back
// out of the resource's name (a contract on the naming scheme nobody could
// see). Resources share one Origin per Service port, so that carrying it
// costs a pointer per resource.
type Origin struct {
	Service Key
	Port    int32
	// Backend says the scope serves the resource only because a mesh
	// route of a Service it selects names this Service as a backend: a
	// route may move requests to or from it without any host name
	// changing hands.
	Backend bool
}

// SameOrigin reports whether a and b (either may be nil, no provenance)
// name the same Service port. A Service translated again shares nothing
// with its earlier translation, so provenances are compared by value.
func SameOrigin(a, b *Origin) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// Grants is the consent one namespace gives, through its ReferenceGrants, to
// ProxyScopes of other namespaces to select its Services: by the scope's
// namespace, the names of the Services granted, or nil for all of them.
type Grants map[string]map[string]struct{}

// Permits reports whether a scope of namespace from may select the Service
// named name of the namespace that holds g.
func (g Grants) Permits(from, name string) bool {
	names, ok := g[from]
	if !ok {
		return false
	}
	if names == nil {
		return true
	}
	_, ok = names[name]
	return ok
}
