// Package v1alpha1 holds the ProxyScope API: which Services a group of xDS
// proxies may see, in which xDS protocol they receive them, and what the
// control plane observed while serving them.
//
// +kubebuilder:object:generate=true
// +groupName=xds.scopeplane.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "xds.scopeplane.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ProxyScope{}, &ProxyScopeList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
