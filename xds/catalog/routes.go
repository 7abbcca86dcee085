package catalog

import (
	"cmp"
	"reflect"
	"slices"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
)

// UpsertRoute records a mesh route (an HTTPRoute or a GRPCRoute whose
// parents are Services) and re-translates the Services it attaches to, now
// or before, in the scopes that serve them.
func (c *Catalog) UpsertRoute(r *model.Route) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setRoute(model.RouteRef{Kind: r.Kind, Key: r.Key}, r)
}

// DeleteRoute forgets a mesh route.
func (c *Catalog) DeleteRoute(ref model.RouteRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setRoute(ref, nil)
}

// SetRouteGrants records the consent namespace ns gives, through its
// ReferenceGrants, to routes of other namespaces to name its Services as
// backends: by route kind, then as model.Grants keyed by the route's
// namespace.
func (c *Catalog) SetRouteGrants(ns string, g map[model.RouteKind]model.Grants) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if reflect.DeepEqual(c.routeGrants[ns], g) || (len(g) == 0 && len(c.routeGrants[ns]) == 0) {
		return
	}
	if len(g) == 0 {
		delete(c.routeGrants, ns)
	} else {
		c.routeGrants[ns] = g
	}
	c.reachMoved()
	parents := map[model.Key]struct{}{}
	for _, r := range c.routes {
		if r.Key.Namespace != ns && namesBackendIn(r, ns) {
			for _, p := range r.Parents {
				parents[p.Service] = struct{}{}
			}
		}
	}
	c.retranslate(parents)
}

func namesBackendIn(r *model.Route, ns string) bool {
	for i := range r.Rules {
		for _, b := range r.Rules[i].Refs() {
			if b.Service.Namespace == ns {
				return true
			}
		}
	}
	return false
}

// setRoute replaces the route ref (nil: deletes it), re-indexes it and
// re-translates the Services it attached to or attaches to.
func (c *Catalog) setRoute(ref model.RouteRef, r *model.Route) {
	old := c.routes[ref]
	if old == nil && r == nil || old != nil && r != nil && reflect.DeepEqual(old, r) {
		return
	}
	parents := map[model.Key]struct{}{}
	for _, x := range []*model.Route{old, r} {
		if x == nil {
			continue
		}
		for _, p := range x.Parents {
			parents[p.Service] = struct{}{}
		}
	}
	if old != nil {
		c.index(ref, old, false)
		delete(c.routes, ref)
	}
	if r != nil {
		c.routes[ref] = r
		c.index(ref, r, true)
	}
	c.reachMoved()
	c.retranslate(parents)
}

// index adds the route to, or removes it from, byParent and byBackend.
func (c *Catalog) index(ref model.RouteRef, r *model.Route, add bool) {
	for _, p := range r.Parents {
		byRef := c.byParent[p.Service]
		switch {
		case add && byRef == nil:
			byRef = map[model.RouteRef]*model.Route{}
			c.byParent[p.Service] = byRef
			fallthrough
		case add:
			byRef[ref] = r
		default:
			delete(byRef, ref)
			if len(byRef) == 0 {
				delete(c.byParent, p.Service)
			}
		}
	}
	for i := range r.Rules {
		for _, b := range r.Rules[i].Refs() {
			refs := c.byBackend[b.Service]
			switch {
			case add && refs == nil:
				refs = map[model.RouteRef]struct{}{}
				c.byBackend[b.Service] = refs
				fallthrough
			case add:
				refs[ref] = struct{}{}
			default:
				delete(refs, ref)
				if len(refs) == 0 {
					delete(c.byBackend, b.Service)
				}
			}
		}
	}
}

// retranslateBackendParents re-translates the Services whose routes name
// the Service key as a backend: it appeared, left, or changed what its
// clusters are called.
func (c *Catalog) retranslateBackendParents(key model.Key) {
	parents := map[model.Key]struct{}{}
	for ref := range c.byBackend[key] {
		for _, p := range c.routes[ref].Parents {
			parents[p.Service] = struct{}{}
		}
	}
	c.retranslate(parents)
}

// retranslate translates the Services again after their routes (or their
// routes' backends) changed, in every scope that serves them, and has those
// scopes settle which backends they serve. A ProxylessGRPC translation
// that routes to clusters its scopes' clients were not sent before is
// served after a warm-up (warmUp).
func (c *Catalog) retranslate(keys map[model.Key]struct{}) {
	for key := range keys {
		e, ok := c.services[key]
		if !ok {
			continue
		}
		// What each scope served, and each key's translation, before.
		old := make(map[model.Key]keyedFragment, e.scopes.len())
		for sk := range e.scopes.all() {
			k := c.scopes[sk].keyOf(e)
			if i := e.frags.index(k); i >= 0 {
				old[sk] = e.frags[i]
			}
		}
		before := slices.Clone(e.frags)
		c.noteConsumers(e)
		// The backend part depends on the Service alone: it is kept.
		e.frags.keepBackends()
		for sk := range e.scopes.all() {
			sc := c.scopes[sk]
			if k := sc.keyOf(e); e.frags.index(k) < 0 {
				// A key in use before goes on from its own translation; a
				// new one (a consumer namespace's first route) from the
				// one its first scope served.
				prev := old[sk]
				if i := before.index(k); i >= 0 {
					prev = before[i]
				}
				c.warmUp(e, k, prev)
			}
			sc.replaceService(e, old[sk].frag)
			sc.backendsStale = true
			c.markDirty(sk)
		}
		c.noteWarming(e)
	}
}

// DefaultRouteWarmUp is how long a ProxylessGRPC Service's route
// configurations name new clusters in entries no call matches before
// routing to them (SetRouteWarmUp): longer than a gRPC client on a loaded
// control plane takes to be sent the route configuration, fetch the
// clusters' CDS and EDS and build their balancers, and shorter than
// DefaultBackendGrace, so that a route edited back and forth warms up
// before its old backends leave.
const DefaultRouteWarmUp = 2 * time.Second

// SetRouteWarmUp sets how long a ProxylessGRPC Service's route
// configurations warm up new clusters (see warmUp); zero or less, not at
// all.
func (c *Catalog) SetRouteWarmUp(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.routeWarmUp = d
}

// warmUp records the Service's new translation for k after its routes
// changed, prev being what was served for k (or the scopes now using k)
// before. When the new translation's route configurations route to
// clusters prev's do not, the scopes are served a warm-up first
// (translate.WarmUp) and the translation only once the catalog's
// routeWarmUp has passed (promote): a gRPC client that routed calls to a
// cluster the moment it learnt of it failed some of them (see
// translate.WarmUp). A newer translation during a warm-up is served at its
// end, or at once if it routes only where the warm-up's routes do; one
// that adds still other clusters starts the warm-up's time again, but a
// warm-up lasts no longer than maxWarmUps times it in all, so that routes
// whose backends are re-created over and over (new cluster names each
// time) are served nonetheless.
func (c *Catalog) warmUp(e *serviceEntry, k fragKey, prev keyedFragment) {
	final := e.translation(k)
	if prev.frag == nil || c.routeWarmUp <= 0 {
		e.frags.set(k, final)
		return
	}
	warm, needed, added := translate.WarmUp(prev.frag, final)
	if !needed {
		e.frags.set(k, final)
		return
	}
	now := c.now()
	w := &warming{final: final, since: now}
	going := prev.warm != nil && prev.key == k
	if going {
		w.since, w.until = prev.warm.since, prev.warm.until
	}
	if added || !going {
		w.until = minTime(now.Add(c.routeWarmUp), w.since.Add(maxWarmUps*c.routeWarmUp))
		time.AfterFunc(w.until.Sub(now), func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.promote(e, k)
		})
	}
	e.frags = append(e.frags, keyedFragment{key: k, frag: &warm, warm: w})
	c.warming[e] = struct{}{}
}

// maxWarmUps bounds a warm-up that added clusters keep going, in warm-up
// times from its start.
const maxWarmUps = 3

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// keepWarming carries the warm-ups of old, the Service's translations
// before the Service itself changed (an endpoint, a port), over to its new
// ones: each new translation is served after the warm-up's routes, with
// the Service's new clusters and endpoints, at the same end. A Service's
// endpoints change all the time; without this, any change of them during
// a warm-up would cut it short.
func (c *Catalog) keepWarming(e *serviceEntry, old fragments) {
	warm := false
	for _, kf := range old {
		if kf.warm == nil {
			continue
		}
		final := e.translation(kf.key)
		served, needed, _ := translate.WarmUp(kf.frag, final)
		if !needed {
			// Over: the backends only its routes reached begin to leave.
			e.frags.set(kf.key, final)
			for sk := range e.scopes.all() {
				if sc := c.scopes[sk]; sc.keyOf(e) == kf.key {
					sc.backendsStale = true
				}
			}
			continue
		}
		e.frags = append(e.frags, keyedFragment{key: kf.key, frag: &served, warm: &warming{final: final, since: kf.warm.since, until: kf.warm.until}})
		warm = true
	}
	if !warm {
		delete(c.warming, e)
	}
}

// promote serves, in place of the warm-up for k, the translation it
// preceded, once the warm-up is over and neither the Service nor its
// routes changed since (a change replaced it, and set its own end). The
// route backends that only the warm-up's routes reached begin to leave
// then (see wantedBackends).
func (c *Catalog) promote(e *serviceEntry, k fragKey) {
	i := e.frags.index(k)
	if c.services[e.svc.Key] != e || i < 0 || e.frags[i].warm == nil || c.now().Before(e.frags[i].warm.until) {
		return
	}
	served := e.frags[i].frag
	e.frags[i] = keyedFragment{key: k, frag: e.frags[i].warm.final}
	c.noteWarming(e)
	for sk := range e.scopes.all() {
		sc := c.scopes[sk]
		if sc.keyOf(e) != k {
			continue
		}
		sc.replaceService(e, served)
		sc.backendsStale = true
		c.markDirty(sk)
	}
}

// noteWarming keeps the Service in the catalog's warming set while, and
// only while, it has a warm-up.
func (c *Catalog) noteWarming(e *serviceEntry) {
	if slices.ContainsFunc(e.frags, func(kf keyedFragment) bool { return kf.warm != nil }) {
		c.warming[e] = struct{}{}
	} else {
		delete(c.warming, e)
	}
}

// noteConsumers records the namespaces whose consumer routes attach to the
// Service.
func (c *Catalog) noteConsumers(e *serviceEntry) {
	e.consumers = nil
	for _, r := range c.byParent[e.svc.Key] {
		if r.Refused == "" && r.Consumer(e.svc.Key) {
			if e.consumers == nil {
				e.consumers = map[string]struct{}{}
			}
			e.consumers[r.Key.Namespace] = struct{}{}
		}
	}
}

// consumerFor is which routes of the Service apply to scopes of namespace
// ns: that namespace's consumer routes when it has any, else the
// producer's ("").
func (e *serviceEntry) consumerFor(ns string) string {
	if _, ok := e.consumers[ns]; ok && ns != e.svc.Key.Namespace {
		return ns
	}
	return ""
}

// routing resolves the routes of the Service that apply to the scopes of
// consumer ("" for the producer's routes), with the backends they may
// reach; nil when none applies.
func (c *Catalog) routing(svc model.Key, consumer string) *translate.Routing {
	ns := cmp.Or(consumer, svc.Namespace)
	var rt *translate.Routing
	for _, r := range c.byParent[svc] {
		if r.Refused != "" || r.Key.Namespace != ns {
			continue
		}
		if rt == nil {
			rt = &translate.Routing{Backends: map[model.Key]*model.Service{}}
		}
		rt.Routes = append(rt.Routes, r)
		for i := range r.Rules {
			for _, b := range r.Rules[i].Refs() {
				if e, ok := c.services[b.Service]; ok && b.Invalid == "" && c.routePermits(r, b.Service) {
					rt.Backends[b.Service] = e.svc
				}
			}
		}
	}
	if rt != nil {
		slices.SortFunc(rt.Routes, (*model.Route).Compare)
	}
	return rt
}

// routePermits reports whether the route may send requests to the Service:
// one of its own namespace, or one whose namespace grants the route's kind
// and namespace (Gateway API's ReferenceGrant), unless the policy allows
// every namespace.
func (c *Catalog) routePermits(r *model.Route, svc model.Key) bool {
	return svc.Namespace == r.Key.Namespace || c.crossNS == CrossNamespaceAllow ||
		c.routeGrants[svc.Namespace][r.Kind].Permits(r.Key.Namespace, svc.Name)
}

// routeIdentityChanged reports whether a Service changed what routes that
// name it as a backend translate to: its UID (in proxyless cluster names)
// or its ports.
func routeIdentityChanged(a, b *model.Service) bool {
	if a.UID != b.UID || len(a.Ports) != len(b.Ports) {
		return true
	}
	for i := range a.Ports {
		if a.Ports[i].Port != b.Ports[i].Port || a.Ports[i].Protocol != b.Ports[i].Protocol {
			return true
		}
	}
	return false
}

// wantedBackends returns the Services the scope must serve as route
// backends: those the routes it serves of its selected Services may reach
// (RoutesTo of what it serves of them: during a warm-up, the older routes'
// too), that it does not select.
func (sc *scopeEntry) wantedBackends() map[model.Key]*serviceEntry {
	c := sc.cat
	out := map[model.Key]*serviceEntry{}
	visit := func(e *serviceEntry) {
		for _, k := range e.fragment(sc.keyOf(e)).RoutesTo {
			if _, selected := sc.services[k]; !selected {
				if b, ok := c.services[k]; ok {
					out[k] = b
				}
			}
		}
	}
	sc.eachRouted(visit)
	for e := range c.warming {
		if _, routed := c.byParent[e.svc.Key]; !routed && sc.services[e.svc.Key] == e {
			visit(e) // its routes are gone, its warm-up's are not
		}
	}
	return out
}

// eachRouted calls fn for each selected Service that routes attach to,
// walking the smaller of the scope's Services and the routed ones.
func (sc *scopeEntry) eachRouted(fn func(*serviceEntry)) {
	byParent := sc.cat.byParent
	if len(byParent) < len(sc.services) {
		for k := range byParent {
			if e, ok := sc.services[k]; ok {
				fn(e)
			}
		}
		return
	}
	for _, e := range sc.services {
		if _, ok := byParent[e.svc.Key]; ok {
			fn(e)
		}
	}
}

// DefaultBackendGrace is how long the control plane keeps serving a route
// backend after no route reaches it any more (SetBackendGrace): longer
// than a call routed there just before takes to be retried (gRPC's
// retries back off 25 ms, then up to 250 ms, for at most 5 attempts).
const DefaultBackendGrace = 5 * time.Second

// SetBackendGrace sets how long a route backend no route reaches any more
// stays served (see syncBackends); zero, until the next Take.
func (c *Catalog) SetBackendGrace(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backendGrace = d
}

// syncBackends makes the Services served as route backends those wanted.
// One no route reaches any more stays served for the catalog's
// backendGrace, and at least until the Take after the routes stopped
// naming it, never leaving in the same revision: a proxy is pushed the
// routes that no longer use its clusters first, and only after it
// answered them (a stream pushes only once its proxy answered the last
// push) the clusters' removal. A gRPC client applies route changes apart
// from its xDS stream and still routes, and retries, calls by the old
// routes for a while: sent at once, the removal failed such calls (gRPC
// C-core 1.51: "CDS resource ... does not exist"; grpc-go 1.85: a call
// whose retries all failed).
func (sc *scopeEntry) syncBackends() {
	if !sc.backendsStale {
		return
	}
	sc.backendsStale = false
	c := sc.cat
	want := sc.wantedBackends()
	now := c.now()
	for k, e := range sc.backends {
		if _, wanted := want[k]; wanted {
			delete(sc.leaving, k)
			continue
		}
		since, left := sc.leaving[k]
		switch {
		case !left:
			if sc.leaving == nil {
				sc.leaving = map[model.Key]time.Time{}
			}
			sc.leaving[k] = now
			c.settleLater(sc)
		case now.Sub(since) >= c.backendGrace:
			sc.dropBackend(e)
		}
	}
	for k, e := range want {
		if _, ok := sc.backends[k]; !ok {
			sc.backends[k] = e
			e.serveAsBackend(sc.scope.Key)
			sc.putFragment(e.fragment(sc.backendKey()))
		}
	}
}

// settleLater has the scope settle its backends again once the grace of
// one that began to leave is over: at the next Take when there is none.
func (c *Catalog) settleLater(sc *scopeEntry) {
	key := sc.scope.Key
	if c.backendGrace <= 0 {
		sc.backendsStale = true
		c.markDirty(key)
		return
	}
	time.AfterFunc(c.backendGrace, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.scopes[key] == sc {
			sc.backendsStale = true
			c.markDirty(key)
		}
	})
}

// dropBackend stops serving the Service as a route backend, keeping what
// the scope now serves of it as a selected Service.
func (sc *scopeEntry) dropBackend(e *serviceEntry) {
	sc.cat.reachMoved()
	delete(sc.backends, e.svc.Key)
	delete(sc.leaving, e.svc.Key)
	delete(e.backendOf, sc.scope.Key)
	var keep *translate.Fragment
	if _, selected := sc.services[e.svc.Key]; selected {
		keep = e.fragment(sc.keyOf(e))
	}
	sc.dropFragment(e.frags.get(sc.backendKey()), keep)
}

// replaceBackend serves the new translation of a Service served as a
// route backend, in place of old.
func (sc *scopeEntry) replaceBackend(e *serviceEntry, old *translate.Fragment) {
	f := e.fragment(sc.backendKey())
	sc.dropFragment(old, f)
	sc.putFragment(f)
}

// keyOf is the key of the Service's translation the scope serves.
func (sc *scopeEntry) keyOf(e *serviceEntry) fragKey {
	return fragKey{profile: translate.ProfileOf(sc.scope), consumer: e.consumerFor(sc.scope.Key.Namespace)}
}

// backendKey is the key of the backend part the scope serves of a Service
// it serves only as a route backend.
func (sc *scopeEntry) backendKey() fragKey {
	return fragKey{profile: translate.ProfileOf(sc.scope), backend: true}
}

// forget unlinks the scope from the Services it serves, as it goes away.
func (sc *scopeEntry) forget() {
	for _, e := range sc.services {
		e.scopes.remove(sc.scope.Key)
	}
	for _, e := range sc.backends {
		delete(e.backendOf, sc.scope.Key)
	}
}

// resolveRoutes counts, for the resolution, the routes that apply to the
// scope's selected Services, those refused, and the route backends served.
func (c *Catalog) resolveRoutes(sc *scopeEntry, r *Resolution) {
	r.RouteBackends = len(sc.backends)
	if len(c.byParent) == 0 {
		return
	}
	seen := map[model.RouteRef]struct{}{}
	sc.eachRouted(func(e *serviceEntry) {
		key := e.svc.Key
		byRef := c.byParent[key]
		ns := cmp.Or(e.consumerFor(sc.scope.Key.Namespace), key.Namespace)
		for ref, route := range byRef {
			if _, dup := seen[ref]; dup || route.Key.Namespace != ns {
				continue
			}
			seen[ref] = struct{}{}
			if route.Refused != "" {
				r.RoutesNotAccepted = append(r.RoutesNotAccepted, ref.String()+": "+route.Refused)
			} else {
				r.Routes++
			}
		}
	})
	slices.Sort(r.RoutesNotAccepted)
}

// serveAsBackend records that the scope serves the Service as a route
// backend. The set is made on first use: most Services are nobody's
// backend.
func (e *serviceEntry) serveAsBackend(scope model.Key) {
	if e.backendOf == nil {
		e.backendOf = map[model.Key]struct{}{}
	}
	e.backendOf[scope] = struct{}{}
}
