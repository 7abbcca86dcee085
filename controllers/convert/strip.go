package convert

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StripService returns the part of svc that Service reads, for the
// informer cache to hold instead of the whole object: at 100,000 Services
// the rest is most of the cache. scopeplane never writes a Service, so
// nothing it drops can be lost by a write from the cached copy.
//
// Kept: the identity and lifecycle metadata (name, namespace, UID,
// resourceVersion, generation, creation and deletion timestamps), the
// labels (selections match them), spec.type, spec.externalName,
// spec.trafficDistribution and of each port its name, protocol,
// appProtocol, port and targetPort.
//
// Dropped, because nothing in scopeplane reads them: every annotation
// (kubectl's last-applied-configuration alone repeats the whole object),
// managedFields (a second copy of every field's owner), owner references
// and finalizers; spec.selector (EndpointSlices, not the selector, say
// which Pods back a Service), the cluster and external IPs and their
// families, load balancer fields, session affinity, the traffic policies
// and health check node port, each port's nodePort; and the whole status
// (load balancer ingress, conditions). Endpoints come from EndpointSlices,
// addresses of the Service itself are never served.
//
// TestStripServiceKeepsWhatServiceReads holds it: a Service with every
// field filled converts to the same model before and after.
func StripService(svc *corev1.Service) *corev1.Service {
	out := &corev1.Service{
		TypeMeta:   svc.TypeMeta,
		ObjectMeta: keptMeta(&svc.ObjectMeta, svc.Labels),
		Spec: corev1.ServiceSpec{
			Type:                svc.Spec.Type,
			ExternalName:        svc.Spec.ExternalName,
			TrafficDistribution: svc.Spec.TrafficDistribution,
		},
	}
	if len(svc.Spec.Ports) > 0 {
		out.Spec.Ports = make([]corev1.ServicePort, len(svc.Spec.Ports))
		for i, p := range svc.Spec.Ports {
			out.Spec.Ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port, TargetPort: p.TargetPort}
		}
	}
	return out
}

// StripEndpointSlice returns the part of s that Service reads, for the
// informer cache to hold instead of the whole object. scopeplane never
// writes an EndpointSlice.
//
// Kept: the identity and lifecycle metadata, the label
// kubernetes.io/service-name (which Service the slice belongs to: the
// cache's index and the watch's mapping read it), the address type, the
// ports, and of each endpoint its addresses, conditions, zone, node name
// and hints.
//
// Dropped, because nothing in scopeplane reads them: every other label
// (the EndpointSlice controller copies the Service's labels onto its
// slices) and every annotation (the controller's
// endpoints.kubernetes.io/last-change-trigger-time, kubectl's
// last-applied-configuration), managedFields, owner references and
// finalizers; and of each endpoint its targetRef (the Pod's kind,
// namespace, name and UID: the largest part of an endpoint), hostname and
// deprecatedTopology.
func StripEndpointSlice(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	var labels map[string]string
	if name, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
		labels = map[string]string{discoveryv1.LabelServiceName: name}
	}
	out := &discoveryv1.EndpointSlice{
		TypeMeta:    s.TypeMeta,
		ObjectMeta:  keptMeta(&s.ObjectMeta, labels),
		AddressType: s.AddressType,
		Ports:       s.Ports,
	}
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			out.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, Zone: e.Zone, NodeName: e.NodeName, Hints: e.Hints}
		}
	}
	return out
}

// keptMeta is the metadata a stripped object keeps: what identifies it
// and its version (the cache and the reconcilers key on them), its
// lifecycle, and the labels given.
func keptMeta(m *metav1.ObjectMeta, labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp, Labels: labels,
	}
}
