// Package scheme holds the one runtime.Scheme the operator, the kubectl
// plugin, the demo and the tests share: client-go's built-in types, the
// ProxyScope API, and Gateway API's ReferenceGrant, HTTPRoute and GRPCRoute. It is its own package so that the plugin gets it without
// linking the test API server (internal/localapi imports envtest).
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
)

// Scheme knows the core Kubernetes types, the ProxyScope API and
// ReferenceGrants.
var Scheme = newScheme()

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(xdsv1alpha1.AddToScheme(s))
	utilruntime.Must(gatewayv1beta1.Install(s))
	utilruntime.Must(gatewayv1.Install(s))
	return s
}
