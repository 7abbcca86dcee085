package controllers

import (
	"context"

	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/scopeplane/scopeplane/xds/catalog"
)

// everyReplica makes a controller run on every replica, not only on the
// leader: every replica builds snapshots and serves xDS.
var everyReplica = controller.Options{NeedLeaderElection: ptr.To(false)}

// Setup registers every reconciler with the manager, feeding cat, and
// returns the tracker that tells when the first full sync is done.
func Setup(ctx context.Context, mgr ctrl.Manager, cat *catalog.Catalog) (*InitialSync, error) {
	sync := NewInitialSync(mgr.GetCache())
	if err := mgr.Add(sync); err != nil {
		return nil, err
	}
	reader := mgr.GetCache()
	if err := (&ServiceReconciler{Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(ctx, mgr); err != nil {
		return nil, err
	}
	if err := (&NamespaceReconciler{Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&ProxyScopeReconciler{Reader: reader, Catalog: cat, Sync: sync}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return sync, nil
}
