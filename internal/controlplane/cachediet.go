package controlplane

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/scopeplane/scopeplane/controllers/convert"
)

// lastApplied is the annotation in which kubectl apply keeps the whole
// object it last applied: often as large as the rest of the object.
const lastApplied = corev1.LastAppliedConfigAnnotation

// trimMeta is the cache's default transform, for every kind it holds
// (and for the kinds with a transform of their own, after it): it drops
// metadata.managedFields, which nothing in scopeplane reads, and kubectl's
// last-applied-configuration annotation from every kind but ConfigMaps.
//
// Dropping them is safe for what scopeplane writes from a cached copy:
//   - ProxyScope status is patched with a JSON merge patch computed between
//     two versions of the cached copy (status.Reconciler), so the patch
//     carries neither field and the API server keeps both.
//   - Route status (package routestatus) is written with an update of the
//     status subresource, which changes nothing but the status.
//   - Bootstrap ConfigMaps are updated whole from the cached copy
//     (controllerutil.CreateOrUpdate): an update without managedFields
//     keeps the server's (the API server takes them from the stored object
//     when a request has none), but an update without an annotation
//     removes it, so ConfigMaps keep their annotations.
//   - Secrets are read from the API server, not the cache; the Lease and
//     the replicas' feedback ConfigMaps are written without reading them
//     from this cache.
//
// TestCacheDietKeepsWhatIsWritten checks both writes on a real API server.
func trimMeta(obj any) (any, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return obj, nil // a tombstone, or not an object: nothing to trim
	}
	if m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	if _, isConfigMap := obj.(*corev1.ConfigMap); !isConfigMap {
		if a := m.GetAnnotations(); a != nil {
			if _, ok := a[lastApplied]; ok {
				trimmed := make(map[string]string, len(a)-1)
				for k, v := range a {
					if k != lastApplied {
						trimmed[k] = v
					}
				}
				if len(trimmed) == 0 {
					trimmed = nil
				}
				m.SetAnnotations(trimmed)
			}
		}
	}
	return obj, nil
}

// stripService is the Service cache's transform: Services are kept as
// convert.Service reads them (convert.StripService says what is dropped
// and why), since a cluster's Services are most of what the cache holds.
func stripService(obj any) (any, error) {
	if svc, ok := obj.(*corev1.Service); ok {
		return convert.StripService(svc), nil
	}
	return trimMeta(obj)
}

// stripEndpointSlice is the EndpointSlice cache's transform, as
// stripService (convert.StripEndpointSlice).
func stripEndpointSlice(obj any) (any, error) {
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		return convert.StripEndpointSlice(s), nil
	}
	return trimMeta(obj)
}
