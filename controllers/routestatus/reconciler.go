package routestatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/controllers/status"
	"github.com/scopeplane/scopeplane/xds/model"
)

// The routes' field indexes in the informer cache, which map a change of a
// Service or of a namespace's ReferenceGrants to the routes it concerns.
const (
	// serviceIndex holds "namespace/name" of every Service a route names,
	// as a parent or as a backend.
	serviceIndex = "scopeplane.dev/route-services"
	// backendNamespaceIndex holds the namespaces, other than its own, of
	// a route's backends: those whose ReferenceGrants it needs.
	backendNamespaceIndex = "scopeplane.dev/route-backend-namespaces"
)

// Index registers the routes' field indexes for the route kinds watched,
// on the manager's cache: once per manager, before it starts, since the
// cache cannot index an informer already running (the leader's
// Reconcilers, built anew each term, only read them).
func Index(ctx context.Context, indexer client.FieldIndexer, kinds []model.RouteKind) error {
	for _, k := range kinds {
		obj, _ := convert.RouteObject(k)
		if err := indexer.IndexField(ctx, obj, serviceIndex, func(o client.Object) []string {
			r, _ := convert.Route(o)
			return routeServices(r)
		}); err != nil {
			return fmt.Errorf("indexing %ss by Service: %w", k, err)
		}
		if err := indexer.IndexField(ctx, obj, backendNamespaceIndex, func(o client.Object) []string {
			r, _ := convert.Route(o)
			var out []string
			for _, rule := range r.Rules {
				for _, b := range rule.Refs() {
					if b.Invalid == "" && b.Service.Namespace != r.Key.Namespace && !slices.Contains(out, b.Service.Namespace) {
						out = append(out, b.Service.Namespace)
					}
				}
			}
			return out
		}); err != nil {
			return fmt.Errorf("indexing %ss by backend namespace: %w", k, err)
		}
	}
	return nil
}

// routeServices are the Services a route names, parents and backends.
func routeServices(r *model.Route) []string {
	var out []string
	add := func(k model.Key) {
		if s := k.String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, p := range r.Parents {
		add(p.Service)
	}
	for _, rule := range r.Rules {
		for _, b := range rule.Refs() {
			if b.Invalid == "" {
				add(b.Service)
			}
		}
	}
	return out
}

// Reconciler writes the status.parents entries of one route kind. It runs
// on the leader only, reads routes, Services and ReferenceGrants from the
// informer cache (indexed by Index), and writes with the route's
// resourceVersion: the list is atomic, so a conflict is read again from
// the API server and recomputed.
type Reconciler struct {
	Kind model.RouteKind
	// Client reads from the cache and writes to the API server;
	// APIReader reads from the API server, after a conflict.
	Client    client.Client
	APIReader client.Reader
	// Services are the Service caches, which hold every namespace a route
	// names (see catalog.Reach).
	Services *servicecache.Caches
	// ControllerName names the entries this control plane writes.
	ControllerName string
	Consent        Consent
	// Kinds are the route kinds watched (and indexed).
	Kinds []model.RouteKind
	// Grants says ReferenceGrants are watched, so their changes count.
	Grants bool
	// Omissions, when set, says what of a route proxyless gRPC clients are
	// not sent (the translator's account), for the accepted entries'
	// messages.
	Omissions func(*model.Route) []string
	// Invalid, when set, says which of a route's entries fail Envoy's
	// validation (the translator's account), for PartiallyInvalid.
	Invalid func(*model.Route) []string
	// Writes, when set, paces the writes (the ProxyScope status's limiter).
	Writes *rate.Limiter
	// Workers is how many routes are reconciled at once (one when zero).
	Workers int
}

// errNotWatched says a namespace a route names is not followed by the
// Service caches yet, so that a Service of it cannot be told missing.
var errNotWatched = errors.New("the Services of the namespace are not read yet")

// notWatchedRetry is when a route naming such a namespace is looked at
// again.
const notWatchedRetry = time.Second

// Reconcile computes the route's entries and writes them when they changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj, _ := convert.RouteObject(r.Kind)
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	_, changed, err := r.next(ctx, obj)
	if errors.Is(err, errNotWatched) {
		// The Service caches follow the route's namespaces once the
		// catalog holds it: tell nothing before.
		return ctrl.Result{RequeueAfter: notWatchedRetry}, nil
	}
	if err != nil || !changed {
		return ctrl.Result{}, err
	}
	if r.Writes != nil {
		if err := r.Writes.Wait(ctx); err != nil {
			return ctrl.Result{}, fmt.Errorf("waiting to write the status of %s %s: %w", r.Kind, req, err)
		}
	}
	// The wait can be long, and a conflict says the cache is behind: what
	// is written is computed again from the object it replaces.
	var reader client.Reader = r.Client
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, _ := convert.RouteObject(r.Kind)
		if err := reader.Get(ctx, req.NamespacedName, obj); err != nil {
			return err
		}
		parents, changed, err := r.next(ctx, obj)
		if err != nil || !changed {
			return err
		}
		_, st := convert.RouteStatus(obj)
		st.Parents = parents
		err = r.Client.Status().Update(ctx, obj)
		if apierrors.IsConflict(err) && r.APIReader != nil {
			reader = r.APIReader
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("writing the status of %s %s: %w", r.Kind, req, err)
	}
	return ctrl.Result{}, nil
}

// next is the route's status.parents now, and whether it differs from
// what obj holds.
func (r *Reconciler) next(ctx context.Context, obj client.Object) ([]gatewayv1.RouteParentStatus, bool, error) {
	route, _ := convert.Route(obj)
	refs, st := convert.RouteStatus(obj)
	in := &Inputs{
		ControllerName: gatewayv1.GatewayController(r.ControllerName), Route: route, ParentRefs: refs,
		Services: map[model.Key]*corev1.Service{}, Consent: r.Consent, Now: metav1.Now(),
	}
	for _, s := range routeServices(route) {
		ns, name, _ := strings.Cut(s, "/")
		if !r.Services.Watches(ns) {
			// A namespace that does not exist is not watched, and holds
			// no Service; one that does is not watched yet.
			err := r.Client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, false, err
			}
			return nil, false, fmt.Errorf("%w: %s", errNotWatched, ns)
		}
		svc := &corev1.Service{}
		if err := r.Services.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, false, err
		}
		in.Services[model.Key{Namespace: ns, Name: name}] = svc
	}
	if r.Omissions != nil {
		in.ProxylessOmissions = r.Omissions(route)
	}
	if r.Invalid != nil {
		in.Invalid = r.Invalid(route)
	}
	if !in.Consent.Allow && !in.Consent.Unavailable {
		in.Consent.Grants = map[string]model.Grants{}
		for _, rule := range route.Rules {
			for _, b := range rule.Refs() {
				ns := b.Service.Namespace
				if _, done := in.Consent.Grants[ns]; done || ns == route.Key.Namespace || b.Invalid != "" {
					continue
				}
				list := &gatewayv1beta1.ReferenceGrantList{}
				if err := r.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
					return nil, false, err
				}
				in.Consent.Grants[ns] = convert.RouteGrants(list.Items)[route.Kind]
			}
		}
	}
	if route.Kind == model.HTTPRoute && slices.Contains(r.Kinds, model.GRPCRoute) {
		seen := map[model.Key]bool{}
		for _, p := range route.Parents {
			list := &gatewayv1.GRPCRouteList{}
			if err := r.Client.List(ctx, list, client.InNamespace(route.Key.Namespace), client.MatchingFields{serviceIndex: p.Service.String()}); err != nil {
				return nil, false, err
			}
			for i := range list.Items {
				if g := convert.GRPCRoute(&list.Items[i]); !seen[g.Key] {
					seen[g.Key] = true
					in.GRPCRoutes = append(in.GRPCRoutes, g)
				}
			}
		}
	}
	next := Parents(st.Parents, in)
	return next, !parentsEqual(st.Parents, next), nil
}

// SetupWithManager runs the reconciler for every route of the kind whose
// spec or whose entries of this controller changed, and for the routes that name a Service that changed, that
// have backends in a namespace whose ReferenceGrants changed, or (for
// HTTPRoutes) that share a parent Service with a GRPCRoute that changed.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	obj, _ := convert.RouteObject(r.Kind)
	workers := max(r.Workers, 1)
	b := ctrl.NewControllerManagedBy(mgr).
		Named(strings.ToLower(string(r.Kind))+"-status").
		WithOptions(controller.Options{RateLimiter: status.RetryLimiter(), MaxConcurrentReconciles: workers}).
		For(obj, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, r.oursChanged()))).
		WatchesRawSource(r.Services.Source(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.routes(ctx, "", client.MatchingFields{serviceIndex: client.ObjectKeyFromObject(o).String()})
		})))
	if r.Grants {
		b = b.Watches(&gatewayv1beta1.ReferenceGrant{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.routes(ctx, "", client.MatchingFields{backendNamespaceIndex: o.GetNamespace()})
		}))
	}
	if r.Kind == model.HTTPRoute && slices.Contains(r.Kinds, model.GRPCRoute) {
		b = b.Watches(&gatewayv1.GRPCRoute{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			g, _ := convert.Route(o)
			var out []reconcile.Request
			for _, p := range g.Parents {
				out = append(out, r.routes(ctx, g.Key.Namespace, client.MatchingFields{serviceIndex: p.Service.String()})...)
			}
			return out
		}))
	}
	return b.Complete(r)
}

// oursChanged passes an update that changed this controller's entries:
// another writer that dropped or altered them gets them written back (an
// update by this writer itself costs one reconcile that writes nothing).
func (r *Reconciler) oursChanged() predicate.Funcs {
	ours := func(o client.Object) []gatewayv1.RouteParentStatus {
		var out []gatewayv1.RouteParentStatus
		if _, st := convert.RouteStatus(o); st != nil {
			for _, e := range st.Parents {
				if string(e.ControllerName) == r.ControllerName {
					out = append(out, e)
				}
			}
		}
		return out
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !parentsEqual(ours(e.ObjectOld), ours(e.ObjectNew))
	}}
}

// routes lists the routes of the kind an index value names, in namespace
// ns ("" for all).
func (r *Reconciler) routes(ctx context.Context, ns string, match client.MatchingFields) []reconcile.Request {
	_, list := convert.RouteObject(r.Kind)
	if err := r.Client.List(ctx, list, client.InNamespace(ns), match); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the routes a change concerns", "kind", r.Kind)
		return nil
	}
	items, _ := meta.ExtractList(list)
	out := make([]reconcile.Request, 0, len(items))
	for _, o := range items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o.(client.Object))})
	}
	return out
}
