package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/xds/model"
)

type kind uint8

const (
	kindNamespace kind = iota
	kindProxyScope
	// kindGrants is a namespace's ReferenceGrants, reconciled together.
	kindGrants
	kindHTTPRoute
	kindGRPCRoute
)

type objectRef struct {
	kind kind
	name types.NamespacedName
}

// InitialSync tells when the catalog holds the whole cluster: the caches
// have synced and every object they listed then has been reconciled once;
// then the Service caches of the namespaces the scopes reach have done the
// same (servicecache.Caches.Await), a set known only once the scopes,
// namespaces and routes are in the catalog. Until then a replica would
// serve partial configuration (a restart once did exactly that
// elsewhere), so /readyz fails. Tracking reconciles, rather
// than loading the caches into the catalog separately, cannot race with the
// reconcilers and overwrite a newer object with an older one.
type InitialSync struct {
	cache    cache.Cache
	services *servicecache.Caches
	// grants says ReferenceGrants are watched, so their namespaces count.
	grants bool
	// routes are the route kinds watched (those the cluster serves).
	routes []model.RouteKind

	mu      sync.Mutex
	listed  bool
	pending map[objectRef]struct{}
	done    map[objectRef]struct{} // reconciled before the listing was taken
	// reconciled is closed once every object listed was reconciled;
	// complete once the Services are in the catalog too.
	reconciled chan struct{}
	complete   chan struct{}
}

// NewInitialSync returns a tracker over the manager's cache and the
// Service caches; add it to the manager as a Runnable.
func NewInitialSync(c cache.Cache, services *servicecache.Caches) *InitialSync {
	return &InitialSync{cache: c, services: services, pending: map[objectRef]struct{}{}, done: map[objectRef]struct{}{},
		reconciled: make(chan struct{}), complete: make(chan struct{})}
}

// Done records that an object was reconciled.
func (s *InitialSync) Done(k kind, name types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := objectRef{k, name}
	if !s.listed {
		s.done[ref] = struct{}{}
		return
	}
	delete(s.pending, ref)
	s.checkLocked()
}

func (s *InitialSync) checkLocked() {
	if s.listed && len(s.pending) == 0 {
		select {
		case <-s.reconciled:
		default:
			close(s.reconciled)
		}
	}
}

// Start waits for the caches to sync and lists what they hold, then, once
// that is reconciled, for the Service caches.
func (s *InitialSync) Start(ctx context.Context) error {
	if !s.cache.WaitForCacheSync(ctx) {
		return errors.New("the informer caches did not sync")
	}
	var refs []objectRef
	add := func(k kind, objs []client.Object) {
		for _, o := range objs {
			refs = append(refs, objectRef{k, client.ObjectKeyFromObject(o)})
		}
	}
	nss, pss := &corev1.NamespaceList{}, &xdsv1alpha1.ProxyScopeList{}
	for _, l := range []client.ObjectList{nss, pss} {
		if err := s.cache.List(ctx, l); err != nil {
			return fmt.Errorf("listing the cache: %w", err)
		}
	}
	add(kindNamespace, ptrs(nss.Items))
	add(kindProxyScope, ptrs(pss.Items))
	if s.grants {
		rgs := &gatewayv1beta1.ReferenceGrantList{}
		if err := s.cache.List(ctx, rgs); err != nil {
			return fmt.Errorf("listing the cache: %w", err)
		}
		seen := map[string]bool{}
		for i := range rgs.Items {
			if ns := rgs.Items[i].Namespace; !seen[ns] {
				seen[ns] = true
				refs = append(refs, objectRef{kindGrants, grantsRequest(ns)})
			}
		}
	}

	for _, k := range s.routes {
		_, list := convert.RouteObject(k)
		if err := s.cache.List(ctx, list); err != nil {
			return fmt.Errorf("listing the cache: %w", err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return fmt.Errorf("listing the cache: %w", err)
		}
		for _, o := range items {
			refs = append(refs, objectRef{routeKind(k), client.ObjectKeyFromObject(o.(client.Object))})
		}
	}

	s.mu.Lock()
	for _, r := range refs {
		if _, ok := s.done[r]; !ok {
			s.pending[r] = struct{}{}
		}
	}
	s.done = nil
	s.listed = true
	s.checkLocked()
	s.mu.Unlock()
	select {
	case <-s.reconciled:
	case <-ctx.Done():
		return nil
	}
	if s.services.Await(ctx) != nil {
		return nil // it ends only with ctx
	}
	close(s.complete)
	<-ctx.Done()
	return nil
}

// RouteKinds returns the route kinds watched: those the cluster served
// when the control plane started.
func (s *InitialSync) RouteKinds() []model.RouteKind { return s.routes }

// GrantsWatched reports whether ReferenceGrants are watched: consent is
// asked for (--cross-namespace=grant) and the cluster serves them.
func (s *InitialSync) GrantsWatched() bool { return s.grants }

// NeedLeaderElection is false: every replica tracks its own sync.
func (s *InitialSync) NeedLeaderElection() bool { return false }

// Reconciled is closed once every object the manager's cache listed at its
// sync was reconciled: the namespaces the scopes reach are known from then
// on, and the Service caches list them.
func (s *InitialSync) Reconciled() <-chan struct{} { return s.reconciled }

// Synced is closed once every object listed at cache sync was reconciled,
// and the Services of the namespaces the scopes reach then too.
func (s *InitialSync) Synced() <-chan struct{} { return s.complete }

// Check is a readiness check (healthz.Checker) that fails until Synced.
func (s *InitialSync) Check(*http.Request) error {
	select {
	case <-s.complete:
		return nil
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.listed {
		return errors.New("informer caches are syncing")
	}
	if len(s.pending) > 0 {
		return fmt.Errorf("%d objects not yet reconciled", len(s.pending))
	}
	if listing := s.services.Listing(); len(listing) > 0 {
		return fmt.Errorf("the Services of these namespaces are not all reconciled yet: %s", strings.Join(listing, ", "))
	}
	return errors.New("the Service caches are starting")
}

func ptrs[T any, P interface {
	*T
	client.Object
}](items []T) []client.Object {
	out := make([]client.Object, len(items))
	for i := range items {
		out[i] = P(&items[i])
	}
	return out
}
