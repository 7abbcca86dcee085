// Package controllers holds the reconcilers that feed the catalog: they read
// Services, EndpointSlices, Namespaces, ProxyScopes, ReferenceGrants and
// Gateway API's mesh routes (HTTPRoutes and GRPCRoutes whose parents are
// Services) from the informer cache, convert them to the model (package
// convert) and record the change.
// They build no Envoy resources; the pipeline downstream of the catalog does.
package controllers

import (
	"context"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
)

// ServiceReconciler records a Service together with all of its
// EndpointSlices: endpoints are merged per Service, so a change to any slice
// reconciles the Service it belongs to.
type ServiceReconciler struct {
	// Services are the caches it reads, and tells what it reconciled.
	Services *servicecache.Caches
	Catalog  *catalog.Catalog
}

// Reconcile records the Service's current state, or its deletion.
func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := model.Key{Namespace: req.Namespace, Name: req.Name}
	svc := &corev1.Service{}
	// The cache's own copies, not deep copies: convert only reads them, and
	// the model keeps nothing of them that the informer would change in
	// place (it replaces an object on update).
	if err := r.Services.Get(ctx, req.NamespacedName, svc, client.UnsafeDisableDeepCopy); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Catalog.DeleteService(key)
		if !servicecache.NotWatched(err) {
			r.Services.Done(req.NamespacedName)
		}
		return ctrl.Result{}, nil
	}
	list := &discoveryv1.EndpointSliceList{}
	if err := r.Services.List(ctx, list, client.InNamespace(req.Namespace), client.MatchingFields{servicecache.SliceServiceIndex: req.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	slices := make([]*discoveryv1.EndpointSlice, len(list.Items))
	for i := range list.Items {
		slices[i] = &list.Items[i]
	}
	start := time.Now()
	r.Catalog.UpsertService(convert.Service(svc, slices))
	metrics.Translation.WithLabelValues("Service").Observe(time.Since(start).Seconds())
	r.Services.Done(req.NamespacedName)
	return ctrl.Result{}, nil
}

// SetupWithManager watches both kinds in every Service cache.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	// A start reconciles every Service of the cluster before anything is
	// served: reading, converting and translating them on every processor
	// (the catalog serialises only its own updates) shortens it.
	opts := everyReplica
	opts.MaxConcurrentReconciles = runtime.GOMAXPROCS(0)
	return ctrl.NewControllerManagedBy(mgr).
		Named("service").
		WithOptions(opts).
		WatchesRawSource(r.Services.Source(&corev1.Service{}, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(r.Services.Source(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(sliceToService))).
		Complete(r)
}

// sliceToService maps an EndpointSlice to the Service it belongs to.
func sliceToService(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[discoveryv1.LabelServiceName]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}
