package controllers

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// everyReplica makes a controller run on every replica, not only on the
// leader: every replica builds snapshots and serves xDS.
var everyReplica = controller.Options{NeedLeaderElection: ptr.To(false)}

// Setup registers every reconciler with the manager, feeding cat, and
// returns the tracker that tells when the first full sync is done. With
// crossNS CrossNamespaceGrant it watches ReferenceGrants when the cluster
// serves them; when it does not, cross-namespace selections are refused
// (the scopes' status says why) until the control plane restarts after the
// CRD is installed. It watches HTTPRoutes and GRPCRoutes
// (gateway.networking.k8s.io/v1), each kind when the cluster serves it
// (InitialSync.RouteKinds), likewise until a restart. Of the ProxyScopes it
// records only those of this replica's shard (shards; the zero value is
// every scope). It reads Services and EndpointSlices from services, which
// it adds to the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, cat *catalog.Catalog, crossNS catalog.CrossNamespace, shards shard.Shards, services *servicecache.Caches) (*InitialSync, error) {
	sync := NewInitialSync(mgr.GetCache(), services)
	watchGrants := false
	if crossNS == catalog.CrossNamespaceGrant {
		served, err := grantsServed(mgr.GetRESTMapper())
		if err != nil {
			return nil, fmt.Errorf("looking up the ReferenceGrant API: %w", err)
		}
		if !served {
			log.FromContext(ctx).Info("the cluster does not serve ReferenceGrants (gateway.networking.k8s.io/v1beta1): cross-namespace selections are refused; install the CRD and restart to permit them")
		}
		watchGrants = served
		sync.grants = served
	}
	routes, err := routeKindsServed(mgr.GetRESTMapper())
	if err != nil {
		return nil, err
	}
	sync.routes = routes
	for _, k := range []model.RouteKind{model.HTTPRoute, model.GRPCRoute} {
		if !slices.Contains(sync.routes, k) {
			log.FromContext(ctx).Info("the cluster does not serve " + string(k) + "s (gateway.networking.k8s.io/v1): they are not read; install the CRD and restart to route by them")
		}
	}
	cat.SetCrossNamespace(crossNS, crossNS == catalog.CrossNamespaceGrant && !watchGrants)
	for _, r := range []manager.Runnable{services, sync} {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	reader := mgr.GetCache()
	if watchGrants {
		if err := (&ReferenceGrantReconciler{Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	for _, k := range sync.routes {
		if err := (&RouteReconciler{Kind: k, Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	if err := (&ServiceReconciler{Services: services, Catalog: cat}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&NamespaceReconciler{Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&ProxyScopeReconciler{Reader: reader, Catalog: cat, Sync: sync, Shards: shards}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return sync, nil
}
