package controllers

// The permissions the operator needs, generated into config/rbac by
// controller-gen: read the inputs of translation, and Nodes' metadata for
// the zone of a proxy whose token names its Node, and Gateway API's mesh
// routes (HTTPRoutes and GRPCRoutes attached to Services).

// +kubebuilder:rbac:groups="",resources=services;namespaces;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=xds.scopeplane.dev,resources=proxyscopes,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=referencegrants,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;grpcroutes,verbs=get;list;watch

// The leader writes each scope's status, the routes' parent entries of its
// controller name (package routestatus), each scope's bootstrap ConfigMap and Events
// (events.k8s.io, in the scope's namespace). The ConfigMaps live in every
// scope's namespace under names the scopes choose, so RBAC cannot narrow the
// writes to them (resourceNames cannot apply to create, nor follow scopes as
// they come): --bootstrap-configmaps=false turns the ConfigMaps off, and the
// chart then leaves this rule out.

// +kubebuilder:rbac:groups=xds.scopeplane.dev,resources=proxyscopes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes/status;grpcroutes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// The metrics endpoint (--metrics-secure) asks the API server who a caller
// is and whether it may get /metrics; the xDS server (--xds-auth=token)
// reviews proxies' tokens whose signing key it does not know. It reads the
// service-account issuer's discovery document and keys, to verify the
// others itself, through Kubernetes' default binding of
// system:service-account-issuer-discovery to every ServiceAccount.

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Leader election (--leader-elect) holds a Lease and records Events about it
// (core/v1), and every replica publishes its proxies' feedback in a
// ConfigMap that the leader reads (package replicafeedback), all in the
// pod's namespace only: a namespaced Role, which the chart installs in the
// release namespace when leader election is on. client-go's Lease lock only
// gets, creates and updates (a leader that steps down updates the Lease to
// release it); a replica deletes its ConfigMap when it stops.

// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=scopeplane-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",namespace=scopeplane-system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=scopeplane-system,resources=configmaps,verbs=get;list;watch;create;update;delete
