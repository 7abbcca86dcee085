package controllers

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/catalog"
)

// ReferenceGrantReconciler records, per namespace, the consent its
// ReferenceGrants give to ProxyScopes of other namespaces, and to routes of
// other namespaces that name its Services as backends. A request names
// a namespace (its Name is empty): the grants of a namespace are read
// together, since any of them can permit a Service.
type ReferenceGrantReconciler struct {
	Reader  client.Reader
	Catalog *catalog.Catalog
	Sync    *InitialSync
}

// Reconcile records the namespace's grants; the catalog re-evaluates the
// other namespaces' scopes that reach into it.
func (r *ReferenceGrantReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	list := &gatewayv1beta1.ReferenceGrantList{}
	if err := r.Reader.List(ctx, list, client.InNamespace(req.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	r.Catalog.SetGrants(req.Namespace, convert.Grants(list.Items))
	r.Catalog.SetRouteGrants(req.Namespace, convert.RouteGrants(list.Items))
	r.Sync.Done(kindGrants, req.NamespacedName)
	return ctrl.Result{}, nil
}

// SetupWithManager watches ReferenceGrants, one request per namespace.
func (r *ReferenceGrantReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("referencegrant").
		WithOptions(everyReplica).
		Watches(&gatewayv1beta1.ReferenceGrant{}, handler.EnqueueRequestsFromMapFunc(grantNamespace)).
		Complete(r)
}

// grantNamespace maps a ReferenceGrant to its namespace's request.
func grantNamespace(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: grantsRequest(o.GetNamespace())}}
}

func grantsRequest(ns string) types.NamespacedName { return types.NamespacedName{Namespace: ns} }

// referenceGrants is the API the consent comes from.
var referenceGrants = schema.GroupKind{Group: gatewayv1beta1.GroupName, Kind: "ReferenceGrant"}

// grantsServed reports whether the cluster serves ReferenceGrants at
// v1beta1. Only a "no such kind" answer means no: another error (the API
// server unreachable) is returned, so that a replica does not start
// believing no namespace can consent.
func grantsServed(mapper meta.RESTMapper) (bool, error) {
	_, err := mapper.RESTMapping(referenceGrants, gatewayv1beta1.GroupVersion.Version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	}
	return false, err
}
