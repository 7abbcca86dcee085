package controllers

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/scopeplane/scopeplane/xds/catalog"
)

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
