package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
)

// RouteReconciler records the routes of one kind (HTTPRoute or GRPCRoute)
// whose parents are Services: Gateway API's mesh routes. A route with no
// Service parent is not the mesh's, and is recorded as absent.
type RouteReconciler struct {
	Kind    model.RouteKind
	Reader  client.Reader
	Catalog *catalog.Catalog
	Sync    *InitialSync
}

// Reconcile records the route's current rules, or its deletion.
func (r *RouteReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ref := model.RouteRef{Kind: r.Kind, Key: model.Key{Namespace: req.Namespace, Name: req.Name}}
	obj, _ := convert.RouteObject(r.Kind)
	if err := r.Reader.Get(ctx, req.NamespacedName, obj); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		r.Catalog.DeleteRoute(ref)
		r.Sync.Done(routeKind(r.Kind), req.NamespacedName)
		return ctrl.Result{}, nil
	}
	start := time.Now()
	route, _ := convert.Route(obj)
	if len(route.Parents) == 0 {
		r.Catalog.DeleteRoute(ref)
	} else {
		r.Catalog.UpsertRoute(route)
	}
	metrics.Translation.WithLabelValues(string(r.Kind)).Observe(time.Since(start).Seconds())
	r.Sync.Done(routeKind(r.Kind), req.NamespacedName)
	return ctrl.Result{}, nil
}

// SetupWithManager watches the routes of the kind; only spec changes
// matter here, so that status writes do not loop back.
func (r *RouteReconciler) SetupWithManager(mgr ctrl.Manager) error {
	obj, _ := convert.RouteObject(r.Kind)
	return ctrl.NewControllerManagedBy(mgr).
		Named(strings.ToLower(string(r.Kind))).
		WithOptions(everyReplica).
		For(obj, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// routeKind is the InitialSync kind of a route kind.
func routeKind(k model.RouteKind) kind {
	if k == model.GRPCRoute {
		return kindGRPCRoute
	}
	return kindHTTPRoute
}

// routeKindsServed returns the route kinds the cluster serves at
// gateway.networking.k8s.io/v1, each looked up on its own (a cluster may
// have installed one CRD and not the other). As grantsServed, only a "no
// such kind" answer means no.
func routeKindsServed(mapper meta.RESTMapper) ([]model.RouteKind, error) {
	var out []model.RouteKind
	for _, k := range []model.RouteKind{model.HTTPRoute, model.GRPCRoute} {
		_, err := mapper.RESTMapping(schema.GroupKind{Group: gatewayv1.GroupName, Kind: string(k)}, gatewayv1.GroupVersion.Version)
		switch {
		case err == nil:
			out = append(out, k)
		case !meta.IsNoMatchError(err):
			return nil, fmt.Errorf("looking up the %s API: %w", k, err)
		}
	}
	return out, nil
}
