package translate

import (
	"github.com/scopeplane/scopeplane/xds/model"
)

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
