// Package v1alpha1 holds the ProxyScope API: which Services a group of xDS
// proxies may see, in which xDS protocol they receive them, and what the
// control plane observed while serving them.
//
// +kubebuilder:object:generate=true
// +groupName=xds.scopeplane.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "xds.scopeplane.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
