package testkit

import (
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// ServiceParent is a route's parentRef to a Service (group "" and kind
// Service, as a mesh route must spell them), in namespace ns and on port
// when they are not empty and not 0.
func ServiceParent(ns, name string, port int32) gatewayv1.ParentReference {
	p := gatewayv1.ParentReference{Group: ptr.To(gatewayv1.Group("")), Kind: ptr.To(gatewayv1.Kind("Service")), Name: gatewayv1.ObjectName(name)}
	if ns != "" {
		p.Namespace = ptr.To(gatewayv1.Namespace(ns))
	}
	if port != 0 {
		p.Port = ptr.To(port)
	}
	return p
}

// BackendRef is a route's backendRef to port of a Service, in namespace
// ns when it is not empty.
func BackendRef(ns, name string, port int32) gatewayv1.BackendRef {
	b := gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Port: ptr.To(port)}}
	if ns != "" {
		b.Namespace = ptr.To(gatewayv1.Namespace(ns))
	}
	return b
}
