package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// ProxyScopeReconciler records each ProxyScope's protocol, listener and
// selections; the catalog recomputes that scope alone.
type ProxyScopeReconciler struct {
	Reader  client.Reader
	Catalog *catalog.Catalog
	Sync    *InitialSync
	// Shards is this replica's shard: a scope of another shard is
	// recorded as absent, so that the catalog translates, and the replica
	// holds, only its shard's scopes and the Services they select.
	Shards shard.Shards
}

// Reconcile records the scope's spec, or its deletion. A spec whose selector
// cannot be parsed is recorded as rejected, with the reason its status
// shows: its proxies get nothing rather than a guess, and retrying cannot
// fix it, so no error is returned; the next edit of the spec reconciles it
// again.
func (r *ProxyScopeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := model.Key{Namespace: req.Namespace, Name: req.Name}
	if !r.Shards.Owns(key) {
		r.Catalog.DeleteScope(key)
		r.Sync.Done(kindProxyScope, req.NamespacedName)
		return ctrl.Result{}, nil
	}
	ps := &xdsv1alpha1.ProxyScope{}
	if err := r.Reader.Get(ctx, req.NamespacedName, ps); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Catalog.DeleteScope(key)
		r.Sync.Done(kindProxyScope, req.NamespacedName)
		return ctrl.Result{}, nil
	}
	scope, err := convert.Scope(ps)
	if err != nil {
		log.FromContext(ctx).Info("ProxyScope has an invalid selector; serving nothing for it", "error", err.Error())
		r.Catalog.RejectScope(key, ps.Generation, err.Error())
	} else {
		start := time.Now()
		r.Catalog.UpsertScope(scope)
		metrics.Translation.WithLabelValues("ProxyScope").Observe(time.Since(start).Seconds())
	}
	r.Sync.Done(kindProxyScope, req.NamespacedName)
	return ctrl.Result{}, nil
}

// SetupWithManager watches ProxyScopes.
func (r *ProxyScopeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	// Only spec changes matter here; status writes must not loop back.
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxyscope").
		WithOptions(everyReplica).
		For(&xdsv1alpha1.ProxyScope{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}
