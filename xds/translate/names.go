package translate

import (
	"strconv"
	"strings"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// ServiceOf returns the Service a resource was translated from, read from
// its name, the inverse of the naming here and in model.ClusterName:
// clusters and assignments are "<ns>/<svc>:<port>" in both modes, gRPC API
// listeners and route configurations "<svc>.<ns>[.svc.cluster.local]:<port>".
// Envoy-mode listeners and route configurations ("http-<port>") belong to
// the scope, not to one Service: false.
func ServiceOf(t xdstype.Type, name string) (model.Key, bool) {
	host, port, ok := strings.Cut(name, ":")
	if !ok {
		return model.Key{}, false
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return model.Key{}, false
	}
	switch t {
	case xdstype.Cluster, xdstype.Endpoint:
		ns, svc, ok := strings.Cut(host, "/")
		return model.Key{Namespace: ns, Name: svc}, ok && ns != "" && svc != ""
	default:
		host = strings.TrimSuffix(host, ".svc."+ClusterDomain)
		svc, ns, ok := strings.Cut(host, ".")
		return model.Key{Namespace: ns, Name: svc}, ok && svc != "" && ns != "" && !strings.Contains(ns, ".")
	}
}
