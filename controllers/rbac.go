package controllers

// The permissions the operator needs, generated into config/rbac by
// controller-gen: read the inputs of translation.

// +kubebuilder:rbac:groups="",resources=services;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=xds.scopeplane.dev,resources=proxyscopes,verbs=get;list;watch

// The leader writes each scope's status, its bootstrap ConfigMap and Events.

// +kubebuilder:rbac:groups=xds.scopeplane.dev,resources=proxyscopes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Leader election (--leader-elect) holds a Lease and records Events about it.

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
