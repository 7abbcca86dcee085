package controllers

// The permissions the operator needs, generated into config/rbac by
// controller-gen: read the inputs of translation.

// +kubebuilder:rbac:groups="",resources=services;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=xds.scopeplane.dev,resources=proxyscopes,verbs=get;list;watch

// Leader election (--leader-elect) holds a Lease and records Events about it.

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
