package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
)

// NamespaceReconciler records namespace labels, which namespaceSelectors
// match, and which namespaces exist, which the Accepted condition reports.
type NamespaceReconciler struct {
	Reader  client.Reader
	Catalog *catalog.Catalog
	Sync    *InitialSync
}

// Reconcile records the namespace's labels, or its deletion.
func (r *NamespaceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := &corev1.Namespace{}
	if err := r.Reader.Get(ctx, req.NamespacedName, ns); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Catalog.DeleteNamespace(req.Name)
	} else {
		start := time.Now()
		r.Catalog.UpsertNamespace(ns.Name, ns.Labels)
		metrics.Translation.WithLabelValues("Namespace").Observe(time.Since(start).Seconds())
	}
	r.Sync.Done(kindNamespace, req.NamespacedName)
	return ctrl.Result{}, nil
}

// SetupWithManager watches Namespaces.
func (r *NamespaceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("namespace").
		WithOptions(everyReplica).For(&corev1.Namespace{}).Complete(r)
}
