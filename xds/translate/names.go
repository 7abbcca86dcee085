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
// listeners "<svc>.<ns>[.svc.cluster.local]:<port>" and route
// configurations "<svc>.<ns>.svc.cluster.local:<port>"; in ProxylessGRPC
// mode clusters, assignments and route configurations end in "@<uid>".
// Envoy-mode virtual hosts are "http-<listener port>/<svc>.<ns>:<port>". Envoy-mode listeners and route configurations
// ("http-<port>") belong to the scope, not to one Service: false.
func ServiceOf(t xdstype.Type, name string) (model.Key, bool) {
	if t == xdstype.VirtualHost {
		_, host, ok := strings.Cut(name, "/")
		if !ok {
			return model.Key{}, false
		}
		name = host
	}
	name, _, _ = strings.Cut(name, "@") // a gRPC-mode incarnation
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

// clusterName is the name of a Service port's cluster and assignment:
// model.ClusterName, and in ProxylessGRPC mode "@<uid>" after it when the
// Service has a UID (see GRPCRouteName for why).
func clusterName(svc *model.Service, port int32, mode model.ListenerMode) string {
	name := model.ClusterName(svc.Key, port)
	if mode == model.ListenerProxylessGRPC && svc.UID != "" {
		name += "@" + svc.UID
	}
	return name
}
