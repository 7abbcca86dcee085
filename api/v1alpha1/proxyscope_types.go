package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Protocol is the xDS transport variant that every proxy of a scope must speak.
// +kubebuilder:validation:Enum=SotW;Delta
type Protocol string

const (
	// ProtocolSotW is State-of-the-World xDS (StreamAggregatedResources):
	// every response for a wildcard type carries the complete set. Proxies
	// select it with `api_type: GRPC` in their ADS config.
	ProtocolSotW Protocol = "SotW"
	// ProtocolDelta is incremental xDS (DeltaAggregatedResources): responses
	// carry only what changed plus the names removed. Proxies select it with
	// `api_type: DELTA_GRPC` in their ADS config.
	ProtocolDelta Protocol = "Delta"
)

// ListenerMode says how the proxies of a scope consume the configuration.
// +kubebuilder:validation:Enum=Envoy;ProxylessGRPC
type ListenerMode string

const (
	// ListenerModeEnvoy serves one HTTP listener on listener.port that routes
	// by Host/:authority to every selected service.
	ListenerModeEnvoy ListenerMode = "Envoy"
	// ListenerModeProxylessGRPC serves gRPC API listeners named
	// `<svc>.<ns>.svc.cluster.local:<port>` and `<svc>.<ns>:<port>`, as gRPC's
	// xds:/// resolver asks for them.
	ListenerModeProxylessGRPC ListenerMode = "ProxylessGRPC"
)

// ScopeLabel is set on the objects scopeplane writes for a ProxyScope (its
// bootstrap ConfigMap) to the ProxyScope's name.
const ScopeLabel = "xds.scopeplane.dev/proxyscope"

// DNSLabel is a DNS-1123 label, the form of Kubernetes namespace and Service names.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"
type DNSLabel string

// ProxyScopeSpec says which Services the scope's proxies receive, in which
// xDS protocol and through which kind of listener.
type ProxyScopeSpec struct {
	// protocol is the xDS variant every proxy of this scope must speak: SotW
	// (State of the World, `api_type: GRPC`) or Delta (incremental,
	// `api_type: DELTA_GRPC`). A proxy that opens the other kind of stream is
	// refused with FailedPrecondition, and the refusal is reported on the
	// status. Changing it rewrites the scope's bootstrap ConfigMap at once
	// and keeps serving proxies of the old kind for
	// protocolTransitionSeconds, so that they can restart with the new
	// bootstrap one by one; then their streams are closed.
	// +kubebuilder:default=SotW
	// +optional
	Protocol Protocol `json:"protocol,omitempty"`

	// protocolTransitionSeconds is how long, after spec.protocol changes,
	// the scope keeps serving proxies of the previous protocol (status.
	// protocolTransition counts them). 0 closes their streams at once.
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	ProtocolTransitionSeconds *int32 `json:"protocolTransitionSeconds,omitempty"`

	// services selects the Services (and their EndpointSlices) that reach
	// this scope's proxies; nothing else does. A Service matched by several
	// selections is sent once.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	// +required
	Services []ServiceSelection `json:"services"`

	// listener says how the scope's proxies consume the configuration: an
	// Envoy HTTP listener on a port, or gRPC API listeners for proxyless gRPC
	// clients.
	// +required
	Listener ListenerSpec `json:"listener"`

	// proxies narrows who may receive this scope's configuration. A proxy
	// authenticates to the control plane as a ServiceAccount (a projected
	// token, or a SPIFFE certificate spiffe://<trust-domain>/ns/<namespace>/sa/<name>),
	// and a scope admits only ServiceAccounts of its own namespace; when
	// proxies is set, only the ServiceAccounts named here. Any other proxy
	// naming this scope is refused with PermissionDenied, answered exactly
	// as for a scope that does not exist.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(x, self.exists_one(y, y == x))",message="each ServiceAccount may be listed only once"
	// +listType=atomic
	// +optional
	Proxies []ServiceAccountName `json:"proxies,omitempty"`

	// admitByPeerAddress admits, besides proxies that present a credential,
	// a proxy that presents none (or only the identity-less key its
	// bootstrap ConfigMap publishes) when its connection's source address
	// is held by exactly one Running Pod that is not being deleted, is not
	// on the host network, and whose address is no Node's: the proxy is
	// then that Pod's ServiceAccount, and spec.proxies and the namespace
	// rule apply as to any other. It is for gRPC clients that can send no
	// token (grpc-js-xds, gRPC C-core before call credentials), it is
	// weaker than a credential (docs/bootstrap.md: spoofing, address reuse,
	// SNAT), and it needs the control plane to run with
	// --xds-auth=...,peer-address. Off by default: a scope that does not
	// opt in refuses such a proxy exactly as a scope that does not exist.
	// +optional
	AdmitByPeerAddress bool `json:"admitByPeerAddress,omitempty"`

	// localityPriority orders each proxy's endpoints by where the proxy runs,
	// for the selected Services that ask Kubernetes for no topology (no
	// spec.trafficDistribution, no EndpointSlice hints). SameZone sends a
	// proxy the endpoints of its own zone at priority 0 and the others at
	// priority 1, so that its traffic leaves the zone only when the zone's
	// endpoints fail; a proxy's zone is its Node's topology.kubernetes.io/zone
	// label (from its authenticated token), else its bootstrap's
	// node.locality.zone. None, the default, sends every proxy the same
	// endpoints. Services that do ask are always routed as kube-proxy routes
	// them: a proxy gets the endpoints hinted for its Node or zone, or all of
	// them when none is hinted and ready there.
	// +kubebuilder:validation:Enum=None;SameZone
	// +optional
	LocalityPriority LocalityPriority `json:"localityPriority,omitempty"`
}

// LocalityPriority is how a scope orders endpoints by locality.
type LocalityPriority string

const (
	// LocalityPriorityNone sends every proxy the same endpoints.
	LocalityPriorityNone LocalityPriority = "None"
	// LocalityPrioritySameZone puts the endpoints of the proxy's zone first.
	LocalityPrioritySameZone LocalityPriority = "SameZone"
)

// ServiceAccountName is the name of a ServiceAccount in the scope's
// namespace, a DNS-1123 subdomain.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a ServiceAccount name (a DNS-1123 subdomain): lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
type ServiceAccountName string

// ServiceSelection selects Services either in one namespace (by names and/or
// a label selector) or in every namespace whose labels match namespaceSelector.
// +kubebuilder:validation:XValidation:rule="has(self.names) || has(self.selector) || has(self.namespaceSelector)",message="a selection must name something: set names, selector or namespaceSelector (selector: {} selects every Service of the namespace)"
// +kubebuilder:validation:XValidation:rule="!(has(self.names) && has(self.namespaceSelector))",message="names and namespaceSelector do not mix: names pick Services of one namespace; to narrow a namespaceSelector use selector"
// +kubebuilder:validation:XValidation:rule="!(has(self.namespace) && has(self.namespaceSelector))",message="namespace and namespaceSelector do not mix: set one namespace, or select namespaces by label"
type ServiceSelection struct {
	// namespace holds the selected Services. Defaults to the ProxyScope's own
	// namespace. Cannot be combined with namespaceSelector.
	// +optional
	Namespace DNSLabel `json:"namespace,omitempty"`

	// names lists Services of the namespace by name. Combined with selector,
	// a Service must be named and match the selector.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Names []DNSLabel `json:"names,omitempty"`

	// selector selects Services by their labels. An empty selector ({})
	// selects every Service of the namespace(s).
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// namespaceSelector selects every namespace whose labels match; the
	// selection then covers the Services of all of them (narrowed by selector
	// when set). Cannot be combined with namespace or names.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// ListenerSpec says how the scope's proxies consume the configuration.
// +kubebuilder:validation:XValidation:rule="self.mode != 'Envoy' || has(self.port)",message="an Envoy listener needs a port (1-65535) to listen on"
// +kubebuilder:validation:XValidation:rule="self.mode != 'ProxylessGRPC' || !has(self.port)",message="a ProxylessGRPC listener has no port: gRPC clients dial each Service's own port; remove listener.port"
// +kubebuilder:validation:XValidation:rule="self.mode == 'Envoy' || !has(self.virtualHosts)",message="virtualHosts is for Envoy listeners: gRPC clients get their routes inline; remove listener.virtualHosts"
type ListenerSpec struct {
	// mode is Envoy (one HTTP listener on port, routing by Host/:authority to
	// the selected Services) or ProxylessGRPC (one gRPC API listener per
	// Service port, named `<svc>.<ns>.svc.cluster.local:<port>` and
	// `<svc>.<ns>:<port>`, for gRPC clients dialing xds:///<that name>).
	// +required
	Mode ListenerMode `json:"mode"`

	// port is the port of the Envoy HTTP listener. Required for mode Envoy;
	// must be unset for mode ProxylessGRPC.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port *int32 `json:"port,omitempty"`

	// virtualHosts says how an Envoy listener's virtual hosts (one per
	// Service port) reach Delta proxies: Inline in the route configuration
	// (the default, which every Envoy reads), or VHDS, each a resource of
	// its own, so that adding or removing a Service sends one virtual host
	// instead of the whole route table. SotW proxies always get them
	// inline (SotW has no VHDS); on a SotW scope this says what a switch to
	// Delta would serve, and how status.cost prices it. VHDS over ADS
	// needs an Envoy that accepts it (envoyproxy/envoy#41996 and #42812,
	// 2026); an older one rejects the route configuration, which the
	// status reports as Degraded.
	// +kubebuilder:validation:Enum=Inline;VHDS
	// +optional
	VirtualHosts VirtualHosts `json:"virtualHosts,omitempty"`
}

// VirtualHosts is how an Envoy listener's virtual hosts are sent.
type VirtualHosts string

const (
	// VirtualHostsInline carries them in the route configuration.
	VirtualHostsInline VirtualHosts = "Inline"
	// VirtualHostsVHDS sends each as a VHDS resource.
	VirtualHostsVHDS VirtualHosts = "VHDS"
)

// ProxyNACK is one configuration a proxy rejected.
type ProxyNACK struct {
	// node is the xDS node id of the proxy that rejected the configuration.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// peer is the address (host:port) the proxy's stream came from. Every
	// gRPC client of a scope has the same node id (they share the scope's
	// bootstrap), so this is what tells them apart.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Peer string `json:"peer,omitempty"`

	// identity is who the proxy authenticated as: its ServiceAccount,
	// "system:serviceaccount:<namespace>:<name>", followed by its pod when
	// its token is bound to one. Empty when the control plane admits
	// anonymous proxies (--xds-allow-anonymous).
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Identity string `json:"identity,omitempty"`

	// zone is the topology zone the proxy runs in: its Node's
	// topology.kubernetes.io/zone when its token names its pod, otherwise
	// the node.locality.zone its bootstrap declares. Empty when unknown.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Zone string `json:"zone,omitempty"`

	// typeURL is the xDS resource type that was rejected.
	// +kubebuilder:validation:MaxLength=253
	TypeURL string `json:"typeURL"`

	// version is the rejected version.
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version"`

	// detail is the proxy's error_detail message, cut to 1024 characters.
	// +kubebuilder:validation:MaxLength=1024
	Detail string `json:"detail"`

	// time is when the control plane received the rejection.
	Time metav1.Time `json:"time"`
}

// RoutesStatus counts the mesh routes that apply to a scope's selected
// Services and the Services served only because those routes name them.
type RoutesStatus struct {
	// attached counts the routes that apply to the scope's selected
	// Services and are served (a consumer route of the scope's namespace
	// in place of the producer's, per Gateway API's GAMMA).
	// +optional
	Attached int32 `json:"attached,omitempty"`

	// backends counts the Services the scope serves only as those routes'
	// backends: their clusters and endpoints, without a listener or virtual
	// host of their own.
	// +optional
	Backends int32 `json:"backends,omitempty"`

	// notAccepted names up to 8 routes that would apply but are not served,
	// as "Kind namespace/name: reason".
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=1024
	// +listType=atomic
	// +optional
	NotAccepted []string `json:"notAccepted,omitempty"`
}

// ProxyScopeStatus is what the control plane built for the scope and what its
// proxies reported back.
type ProxyScopeStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions are Accepted (the spec is valid and its selections resolved),
	// Ready (the accepted spec is built and served and every connected proxy
	// ACKed its current version), Degraded (a proxy NACKed, a resource of a
	// selected Service cannot be served, the bootstrap ConfigMap's name is
	// taken, proxies connect with the wrong protocol, or a selection reaches
	// another namespace's Services without its ReferenceGrant) and Stalled
	// (nothing will change without an edit: an invalid spec, a rejected
	// configuration). Ready=True is kstatus Current, Stalled=True Failed,
	// anything else InProgress.
	// Reasons are the Reason* constants of this API.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// selectedServices counts the Services the selections matched.
	// +optional
	SelectedServices int32 `json:"selectedServices,omitempty"`

	// clusters counts the Envoy clusters in the scope's snapshot.
	// +optional
	Clusters int32 `json:"clusters,omitempty"`

	// endpoints counts the endpoints (address and port) in the scope's snapshot.
	// +optional
	Endpoints int32 `json:"endpoints,omitempty"`

	// routes says which Gateway API mesh routes (HTTPRoute and GRPCRoute
	// attached to Services) shape the scope's traffic. Absent when none
	// attaches to the Services it selects.
	// +optional
	Routes *RoutesStatus `json:"routes,omitempty"`

	// connectedProxies counts the proxies with an open stream of the scope's
	// protocol. It is set (0 included, which the Proxies column then shows)
	// once the scope is served, and absent before.
	// +optional
	ConnectedProxies *int32 `json:"connectedProxies,omitempty"`

	// syncedProxies counts the connected proxies that ACKed the current version of every type.
	// +optional
	SyncedProxies int32 `json:"syncedProxies,omitempty"`

	// refusedStreams counts the streams refused for this scope (clients of
	// the other protocol), summed over the replicas running now, each since
	// it started. It grows while they run and drops when one stops or
	// restarts (a rollout starts it again from 0): like connectedProxies,
	// it is what the running replicas see, read from their feedback, and a
	// total kept across replicas would need a store that status is not.
	// The count that survives restarts is the metric
	// scopeplane_xds_refusals_total{reason="WrongProtocol"}; whether
	// refusals go on now is the Degraded condition (WrongProtocol).
	// +optional
	RefusedStreams int64 `json:"refusedStreams,omitempty"`

	// version is the content-hash version of the scope's current snapshot.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Version string `json:"version,omitempty"`

	// lastPushTime is when the change that made the current version was
	// observed, and its push to the connected proxies began.
	// +optional
	LastPushTime *metav1.Time `json:"lastPushTime,omitempty"`

	// bootstrapConfigMap names the ConfigMap, in the scope's namespace, that
	// holds a ready Envoy bootstrap and a gRPC xDS bootstrap for this scope.
	// Empty when there is none: its name is taken by another ConfigMap, the
	// control plane writes no bootstrap ConfigMaps (--bootstrap-configmaps=false),
	// or none in this namespace (not one of --bootstrap-configmap-namespaces).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	BootstrapConfigMap string `json:"bootstrapConfigMap,omitempty"`

	// recentNACKs lists the newest rejections, newest first.
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	RecentNACKs []ProxyNACK `json:"recentNACKs,omitempty"`

	// protocolTransition is set while proxies of the previous protocol are
	// still served after a change of spec.protocol.
	// +optional
	ProtocolTransition *ProtocolTransition `json:"protocolTransition,omitempty"`

	// cost is what this replica sent the scope's proxies over the last hour
	// and what the other xDS protocol would have sent them for the same
	// changes, with the advice that follows. After a change of leader, the
	// previous leader's figures stand until the new one refreshes them, at
	// the scope's refresh slot (within ten buckets), or drops them then if
	// no proxy of the scope came back to it.
	// +optional
	Cost *ProtocolCost `json:"cost,omitempty"`
}

// ProtocolTransition is a change of protocol in progress.
type ProtocolTransition struct {
	// from is the previous protocol, still served until `until`.
	From Protocol `json:"from"`

	// until is when streams of the previous protocol are closed and new
	// ones refused.
	Until metav1.Time `json:"until"`

	// proxies counts the proxies still connected with the previous
	// protocol (to the replica that writes status).
	Proxies int32 `json:"proxies"`
}

// Recommendation is what the cost figures advise.
// +kubebuilder:validation:Enum=Keep;Switch;NotEnoughData
type Recommendation string

// Recommendations of status.cost.
const (
	// RecommendationKeep: the protocol in use costs less, or not enough more
	// to be worth a switch.
	RecommendationKeep Recommendation = "Keep"
	// RecommendationSwitch: the other protocol would have sent markedly
	// fewer bytes, and the scope's proxies can speak it.
	RecommendationSwitch Recommendation = "Switch"
	// RecommendationNotEnoughData: the window is too short or too quiet.
	RecommendationNotEnoughData Recommendation = "NotEnoughData"
)

// ProtocolCost prices a scope's traffic in both xDS protocols over a
// rolling window of complete minutes, at most the last hour. Sizes are of
// the serialized responses; the other protocol's are computed from the same
// shared snapshot, response by response, for the same proxies.
type ProtocolCost struct {
	// window is how much time the figures cover.
	Window metav1.Duration `json:"window"`

	// pushes is how many responses were sent.
	Pushes int64 `json:"pushes"`

	// sentBytes is what they weighed.
	SentBytes int64 `json:"sentBytes"`

	// otherProtocolBytes is what the other protocol would have sent.
	OtherProtocolBytes int64 `json:"otherProtocolBytes"`

	// otherProtocolRatio is otherProtocolBytes / sentBytes with two
	// decimals ("0.04": the other protocol would have sent 4% of the bytes).
	// +kubebuilder:validation:MaxLength=32
	// +optional
	OtherProtocolRatio string `json:"otherProtocolRatio,omitempty"`

	// connects counts streams' first responses per type (initial syncs and
	// reconnects); connectSentBytes and connectOtherProtocolBytes are their
	// share of the bytes above.
	Connects                  int64 `json:"connects"`
	ConnectSentBytes          int64 `json:"connectSentBytes"`
	ConnectOtherProtocolBytes int64 `json:"connectOtherProtocolBytes"`

	// heldBackResources counts the resources carried by responses proxies
	// rejected; otherProtocolHeldBackResources those the other protocol's
	// responses would have carried (a NACK's blast radius there).
	HeldBackResources              int64 `json:"heldBackResources"`
	OtherProtocolHeldBackResources int64 `json:"otherProtocolHeldBackResources"`

	// unusedServices counts the selected Services no proxy asked for during
	// the window (by subscribing to one of their resources by name, or with
	// a wildcard); unusedResources and unusedBytes are what they hold in the
	// scope's snapshot. Unset while a wildcard subscriber asks for all.
	// +optional
	UnusedServices *int32 `json:"unusedServices,omitempty"`
	// +optional
	UnusedResources int64 `json:"unusedResources,omitempty"`
	// +optional
	UnusedBytes int64 `json:"unusedBytes,omitempty"`

	// recommendation is what the figures advise.
	Recommendation Recommendation `json:"recommendation"`

	// advice says it in a sentence that names the numbers.
	// +kubebuilder:validation:MaxLength=1024
	Advice string `json:"advice"`
}

// ProxyScope is a group of xDS proxies that share one scoped snapshot: the
// Services its selections match, served in its protocol. A proxy joins it by
// the node metadata key `scopeplane.dev/scope: <namespace>/<name>`.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ps,categories=scopeplane
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.spec.protocol`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.listener.mode`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Services",type=integer,JSONPath=`.status.selectedServices`
// +kubebuilder:printcolumn:name="Proxies",type=integer,JSONPath=`.status.connectedProxies`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Version",type=string,priority=1,JSONPath=`.status.version`
// +kubebuilder:printcolumn:name="Other-Protocol",type=string,priority=1,JSONPath=`.status.cost.otherProtocolRatio`,description="The other protocol's bytes per byte sent over the last hour"
// +kubebuilder:printcolumn:name="Advice",type=string,priority=1,JSONPath=`.status.cost.recommendation`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProxyScope struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says what the scope's proxies receive and how.
	// +required
	Spec ProxyScopeSpec `json:"spec"`

	// status is what the control plane built and observed for the scope.
	// +optional
	Status ProxyScopeStatus `json:"status,omitempty"`
}

// ProxyScopeList is a list of ProxyScopes.
//
// +kubebuilder:object:root=true
type ProxyScopeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyScope `json:"items"`
}
