// Package catalog holds the world as the model sees it (Services,
// namespaces, scopes) and, for every scope, the xDS resources its proxies
// must receive. It is the incremental step of the pipeline: a change to one
// Service re-translates only that Service, once per listener mode in use,
// and touches only the scopes that select it (or selected it); a scope
// change recomputes only that scope. What changed is recorded per scope and
// resource name, and handed downstream by Take, so that the snapshot layer
// re-versions only the resources that changed.
package catalog

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Set is a scope's resources: type → resource name → resource. The
// resources are shared and read-only.
type Set [xdstype.Count]map[string]proto.Message

// Resolution is what a scope's spec resolved to when its update was taken:
// the record of inputs that travels with the scope's resources to the
// snapshot, so that its status describes what is served, not what the
// catalog holds a coalescing window ahead of it.
type Resolution struct {
	// Generation is the ProxyScope generation the resources were built from.
	Generation int64
	// Invalid says why the spec could not be converted (a label selector
	// that does not parse); the scope then serves nothing.
	Invalid          string
	SelectedServices int
	Clusters         int
	Endpoints        int
	// MissingNamespaces lists namespaces that selections name and that do
	// not exist, sorted.
	MissingNamespaces []string
	// RefusedNamespaces lists the other namespaces whose Services the
	// selections reach but which gave no consent (see CrossNamespace),
	// sorted: a namespace named explicitly that grants the scope nothing, or
	// one holding a matched Service that is not granted.
	RefusedNamespaces []string
	// GrantsUnavailable says consent cannot be given at all: the
	// ReferenceGrant API is not served by the cluster.
	GrantsUnavailable bool
	// Routes counts the mesh routes that apply to the selected Services;
	// RouteBackends the Services served only as their backends.
	Routes, RouteBackends int
	// RoutesNotAccepted names, sorted, the routes that would apply but are
	// refused, with the reason ("Kind namespace/name: reason").
	RoutesNotAccepted []string
}

// CrossNamespace is how the catalog treats a selection of Services outside
// the scope's own namespace.
type CrossNamespace int

const (
	// CrossNamespaceGrant serves another namespace's Service only where
	// that namespace grants it (SetGrants); the default.
	CrossNamespaceGrant CrossNamespace = iota
	// CrossNamespaceAllow serves every selected Service, for clusters whose
	// namespaces trust each other.
	CrossNamespaceAllow
)

// String is the policy's flag value: grant or allow.
func (m CrossNamespace) String() string {
	if m == CrossNamespaceAllow {
		return "allow"
	}
	return "grant"
}

// Set parses a flag value (flag.Value): grant or allow.
func (m *CrossNamespace) Set(s string) error {
	switch s {
	case "grant":
		*m = CrossNamespaceGrant
	case "allow":
		*m = CrossNamespaceAllow
	default:
		return fmt.Errorf("%q is neither grant nor allow", s)
	}
	return nil
}

// Update is what changed in one scope since the previous Take.
type Update struct {
	Key model.Key
	// Scope is the scope's current spec; nil when the scope was deleted or
	// its spec rejected (Resolution.Invalid then says why).
	Scope *model.Scope
	// Resolution is what the spec resolved to.
	Resolution Resolution
	// Reset says the scope is new (or was deleted and created again since
	// the previous Take): Upserted is its complete set and anything held for
	// an earlier scope of that name must be dropped.
	Reset bool
	// Upserted holds the resources that were added or changed, by type and name.
	Upserted Set
	// From holds the provenance of the upserted resources that have one, by
	// type and name: the Service port each was translated from, shared and
	// read-only. A scope's own resources (an Envoy-mode listener and route
	// configuration) have none.
	From [xdstype.Count]map[string]*model.Origin
	// Removed holds the names that left the scope, by type, sorted.
	Removed [xdstype.Count][]string
	// Places holds what changed in the views from particular places (see
	// translate.PlaceEndpoints); on Reset, every place's complete view.
	Places map[model.Place]PlaceChanges
}

// PlaceChanges is what changed in a scope's view from one place: the
// assignments added or changed, by name, and the names removed, sorted.
type PlaceChanges struct {
	Upserted map[string]proto.Message
	Removed  []string
}

// Placed is a scope's views from particular places: place → assignment
// name → assignment, shared and read-only.
type Placed map[model.Place]map[string]proto.Message

// Catalog is safe for concurrent use: the reconcilers write to it, the
// snapshot builder takes changes from it.
type Catalog struct {
	mu         sync.Mutex
	services   map[model.Key]*serviceEntry
	byNS       map[string]map[model.Key]*serviceEntry
	namespaces map[string]map[string]string
	scopes     map[model.Key]*scopeEntry
	// reach indexes scopes by the namespaces they can select in.
	reach reach
	// grants holds each namespace's consent to scopes of other namespaces.
	grants map[string]model.Grants
	// crossNS is the cross-namespace policy; grantsUnavailable records that
	// no ReferenceGrant can exist, which the resolution reports.
	crossNS           CrossNamespace
	grantsUnavailable bool
	// deleted holds scopes deleted (zero Resolution) or rejected since the
	// previous Take.
	deleted map[model.Key]Resolution
	// rejected holds the scopes whose latest spec was rejected: downstream
	// keeps their resolution, so their deletion must be handed on too.
	rejected map[model.Key]struct{}
	dirty    *keyset.Set
	// now starts protocol transitions; tests replace it.
	now func() time.Time
	// routes holds the mesh routes; byParent indexes them by the Services
	// they attach to, byBackend by the Services their rules name.
	routes    map[model.RouteRef]*model.Route
	byParent  map[model.Key]map[model.RouteRef]*model.Route
	byBackend map[model.Key]map[model.RouteRef]struct{}
	// routeGrants holds each namespace's consent to routes of other
	// namespaces, by route kind.
	routeGrants map[string]map[model.RouteKind]model.Grants
	// backendGrace is how long a route backend no route reaches any more
	// stays served (see syncBackends).
	backendGrace time.Duration
	// routeWarmUp is how long a ProxylessGRPC Service's route
	// configurations warm up new clusters before they route to them (see
	// warmUp); zero or less, they route at once. warming holds the
	// Services with a translation warming up.
	routeWarmUp time.Duration
	warming     map[*serviceEntry]struct{}
	// reachVersion counts the changes that may change Reach, each
	// signalled on reachSignal.
	reachVersion uint64
	reachSignal  chan struct{}
}

type serviceEntry struct {
	svc *model.Service
	// cat is the catalog the entry belongs to, whose routes its
	// translations read.
	cat *Catalog
	// frags caches the Service's translation per key in use.
	frags fragments
	// scopes are the scopes that select the Service; backendOf those that
	// serve it only as a mesh route's backend.
	scopes    scopeSet
	backendOf map[model.Key]struct{}
	// consumers holds the namespaces whose consumer routes attach to the
	// Service: their scopes get a translation of their own.
	consumers map[string]struct{}
}

// fragments are a Service's translations by key: a slice searched in
// order, not a map, since a Service has one in most worlds (every scope
// that selects it shares a profile) and rarely more than a few, and a map
// would hold several hundred bytes for each of a hundred thousand
// Services.
type fragments []keyedFragment

type keyedFragment struct {
	key  fragKey
	frag *translate.Fragment
	// warm is set while frag is a warm-up (translate.WarmUp) served
	// before the translation it holds.
	warm *warming
}

// warming is a Service's translation served once a warm-up that began at
// since is over: after until (see warmUp).
type warming struct {
	final        *translate.Fragment
	since, until time.Time
}

// get returns the translation served for k, or nil.
func (fs fragments) get(k fragKey) *translate.Fragment {
	if i := fs.index(k); i >= 0 {
		return fs[i].frag
	}
	return nil
}

// index returns where the translation for k is, or -1.
func (fs fragments) index(k fragKey) int {
	for i := range fs {
		if fs[i].key == k {
			return i
		}
	}
	return -1
}

// set records f as the translation for k, which it does not hold.
func (fs *fragments) set(k fragKey, f *translate.Fragment) {
	*fs = append(*fs, keyedFragment{key: k, frag: f})
}

// keepBackends drops every translation but the backend parts.
func (fs *fragments) keepBackends() {
	*fs = slices.DeleteFunc(*fs, func(kf keyedFragment) bool { return !kf.key.backend })
}

// fragKey is what a Service's translation depends on besides the Service:
// the scopes' profile, which routes apply (a consumer namespace's, or ""
// for the producer's), and whether it is the backend part only.
type fragKey struct {
	profile  translate.Profile
	consumer string
	backend  bool
}

type scopeEntry struct {
	scope *model.Scope
	// cat is the catalog the scope belongs to, whose routes decide which
	// Services it serves as route backends.
	cat      *Catalog
	services map[model.Key]*serviceEntry
	// backends holds the Services served only as mesh route backends
	// (their clusters and assignments), which the scope does not select;
	// backendsStale says they must be settled again before a Take.
	backends      map[model.Key]*serviceEntry
	backendsStale bool
	// leaving holds the backends no route of the scope's Services reaches
	// any more, still served for the catalog's backendGrace from when
	// they began to leave (see syncBackends).
	leaving map[model.Key]time.Time
	// refused holds the Services the selections match that their
	// namespaces do not grant to the scope.
	refused map[model.Key]struct{}
	res     [xdstype.Count]map[string]held
	// changed holds, per type, the names upserted or removed since the last Take.
	changed [xdstype.Count]map[string]struct{}
	// places and placeChanged are res and changed of the place views.
	places       Placed
	placeChanged map[model.Place]map[string]struct{}
	// touched records that a resource changed since the last takeTouched.
	touched bool
	// created records that the scope was created since the last Take.
	created bool
	// endpoints counts the endpoints of the scope's assignments.
	endpoints int
	// routesStale records, in Envoy mode, that the set of virtual hosts
	// changed and the listener and route configuration must be re-assembled.
	routesStale bool
	// stampSrc holds, per type, the unstamped listener, route
	// configuration or cluster each stored one was stamped from (see
	// stamped).
	stampSrc [xdstype.Count]map[string]proto.Message
}

// New returns an empty catalog.
func New() *Catalog {
	return &Catalog{
		services:   map[model.Key]*serviceEntry{},
		byNS:       map[string]map[model.Key]*serviceEntry{},
		namespaces: map[string]map[string]string{},
		scopes:     map[model.Key]*scopeEntry{},
		reach:      newReach(),
		grants:     map[string]model.Grants{},
		deleted:    map[model.Key]Resolution{},
		rejected:   map[model.Key]struct{}{},
		dirty:      keyset.New(),
		now:        time.Now,

		routes:      map[model.RouteRef]*model.Route{},
		byParent:    map[model.Key]map[model.RouteRef]*model.Route{},
		byBackend:   map[model.Key]map[model.RouteRef]struct{}{},
		routeGrants: map[string]map[model.RouteKind]model.Grants{},
		warming:     map[*serviceEntry]struct{}{},
		reachSignal: make(chan struct{}, 1),
	}
}

// Changed receives a value after changes were recorded and not yet taken.
// Several changes may be signalled once, which is how they coalesce.
func (c *Catalog) Changed() <-chan struct{} { return c.dirty.Changed() }

func (c *Catalog) markDirty(k model.Key) { c.dirty.Add(k) }

// fragment returns the Service's translation for k, cached.
func (e *serviceEntry) fragment(k fragKey) *translate.Fragment {
	if f := e.frags.get(k); f != nil {
		return f
	}
	f := e.translation(k)
	e.frags.set(k, f)
	return f
}

// translation translates the Service for k, uncached.
func (e *serviceEntry) translation(k fragKey) *translate.Fragment {
	var f translate.Fragment
	if k.backend {
		f = e.fragment(fragKey{profile: k.profile}).BackendPart()
	} else {
		f = translate.RoutedService(e.svc, k.profile, e.cat.routing(e.svc.Key, k.consumer))
	}
	return &f
}

// UpsertService records the Service's current state (with its endpoints),
// re-translates it and updates the scopes that select it now or did before.
func (c *Catalog) UpsertService(svc *model.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.services[svc.Key]
	if !ok {
		e = &serviceEntry{svc: svc, cat: c}
		c.noteConsumers(e)
		c.services[svc.Key] = e
		if c.byNS[svc.Key.Namespace] == nil {
			c.byNS[svc.Key.Namespace] = map[model.Key]*serviceEntry{}
		}
		c.byNS[svc.Key.Namespace][svc.Key] = e
	}
	if ok && reflect.DeepEqual(e.svc, svc) {
		return // a resync or a change to a field the model does not carry
	}
	old, before := e.frags, e.svc
	e.svc = svc
	e.frags = make(fragments, 0, len(old))
	c.keepWarming(e, old)
	nsLabels, nsKnown := c.namespaces[svc.Key.Namespace]
	// A scope selects the Service, or did, only where it can reach the
	// Service's namespace.
	c.reach.each(svc.Key.Namespace, func(key model.Key, sc *scopeEntry) {
		_, was := sc.services[svc.Key]
		is, refusal := c.admits(sc, svc, nsLabels, nsKnown)
		switch {
		case was && is:
			sc.replaceService(e, old.get(sc.keyOf(e)))
		case is:
			sc.addService(e)
		case was:
			sc.removeService(e, old.get(sc.keyOf(e)))
		}
		if sc.settle() || refusal {
			c.markDirty(key)
		}
	})
	for key := range e.backendOf {
		sc := c.scopes[key]
		sc.replaceBackend(e, old.get(sc.backendKey()))
		if sc.settle() {
			c.markDirty(key)
		}
	}
	if !ok || routeIdentityChanged(before, svc) {
		// The routes that name it as a backend now reach it, or reach it
		// under other cluster names.
		c.retranslateBackendParents(svc.Key)
	}
}

// DeleteService removes the Service from every scope that selected it.
func (c *Catalog) DeleteService(key model.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.services[key]
	if !ok {
		return
	}
	delete(c.services, key)
	delete(c.warming, e)
	delete(c.byNS[key.Namespace], key)
	if len(c.byNS[key.Namespace]) == 0 {
		delete(c.byNS, key.Namespace)
	}
	for _, sk := range e.scopes.keys() {
		sc := c.scopes[sk]
		sc.removeService(e, e.frags.get(sc.keyOf(e)))
		if sc.settle() {
			c.markDirty(sk)
		}
	}
	for sk := range e.backendOf {
		sc := c.scopes[sk]
		sc.dropBackend(e)
		if sc.settle() {
			c.markDirty(sk)
		}
	}
	c.retranslateBackendParents(key)
	c.reach.each(key.Namespace, func(sk model.Key, sc *scopeEntry) {
		if _, ok := sc.refused[key]; ok {
			delete(sc.refused, key)
			c.markDirty(sk)
		}
	})
}

// UpsertNamespace records a namespace's labels and re-evaluates, for the
// scopes that select by namespace labels, the Services of that namespace.
func (c *Catalog) UpsertNamespace(name string, labels map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, known := c.namespaces[name]
	if known && mapsEqual(old, labels) {
		return
	}
	c.namespaces[name] = labels
	c.reselectNamespace(name, !known)
	if !known || len(c.reach.byLabels) > 0 {
		c.reachMoved()
	}
}

// DeleteNamespace forgets a namespace; namespace selectors no longer match it.
func (c *Catalog) DeleteNamespace(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.namespaces[name]; !ok {
		return
	}
	delete(c.namespaces, name)
	c.reselectNamespace(name, true)
	c.reachMoved()
}

// reselectNamespace re-evaluates the scopes a namespace change can affect;
// existenceChanged says the namespace was created or deleted, which changes the
// resolution of scopes that name it.
func (c *Catalog) reselectNamespace(name string, existenceChanged bool) {
	nsLabels, nsKnown := c.namespaces[name]
	c.reach.each(name, func(key model.Key, sc *scopeEntry) {
		if existenceChanged && namesNamespace(sc.scope, name) {
			c.markDirty(key)
		}
		if selectsByNamespaceLabels(sc.scope) && c.reselect(sc, name, nsLabels, nsKnown) {
			c.markDirty(key)
		}
	})
}

// reselect re-evaluates the scope's selection of the Services of namespace
// ns and reports whether the scope changed (its resources or its refusals).
func (c *Catalog) reselect(sc *scopeEntry, ns string, nsLabels map[string]string, nsKnown bool) bool {
	changed := false
	for _, e := range c.byNS[ns] {
		_, was := sc.services[e.svc.Key]
		is, refusal := c.admits(sc, e.svc, nsLabels, nsKnown)
		changed = changed || refusal
		switch {
		case is && !was:
			sc.addService(e)
		case was && !is:
			sc.removeService(e, e.frags.get(sc.keyOf(e)))
		}
	}
	return sc.settle() || changed
}

// admits reports whether the scope serves the Service: a selection matches
// it and its namespace consents (the scope's own, or one that grants it).
// It records a match that is refused in the scope's refusals, and reports
// whether those changed.
func (c *Catalog) admits(sc *scopeEntry, svc *model.Service, nsLabels map[string]string, nsKnown bool) (is, refusalChanged bool) {
	matched := sc.scope.Selects(svc, nsLabels, nsKnown)
	is = matched && c.permits(sc.scope.Key.Namespace, svc.Key)
	_, wasRefused := sc.refused[svc.Key]
	switch refused := matched && !is; {
	case refused && !wasRefused:
		sc.refused[svc.Key] = struct{}{}
	case !refused && wasRefused:
		delete(sc.refused, svc.Key)
	default:
		return is, false
	}
	return is, true
}

// permits reports whether a scope of namespace from may serve the Service.
func (c *Catalog) permits(from string, svc model.Key) bool {
	return svc.Namespace == from || c.crossNS == CrossNamespaceAllow || c.grants[svc.Namespace].Permits(from, svc.Name)
}

// SetCrossNamespace sets the cross-namespace policy, and whether the
// cluster can hold ReferenceGrants at all (which only the resolution's
// message reflects: without them nothing is granted). Call it before
// recording anything.
func (c *Catalog) SetCrossNamespace(mode CrossNamespace, grantsUnavailable bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.crossNS, c.grantsUnavailable = mode, grantsUnavailable
}

// SetGrants records the consent namespace ns gives to scopes of other
// namespaces (nil or empty: none) and re-evaluates, in those scopes, the
// Services of ns: a grant adds them on the next Take, a revocation removes
// them.
func (c *Catalog) SetGrants(ns string, g model.Grants) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if reflect.DeepEqual(c.grants[ns], g) || (len(g) == 0 && len(c.grants[ns]) == 0) {
		return
	}
	if len(g) == 0 {
		delete(c.grants, ns)
	} else {
		c.grants[ns] = g
	}
	c.reachMoved()
	nsLabels, nsKnown := c.namespaces[ns]
	c.reach.each(ns, func(key model.Key, sc *scopeEntry) {
		if sc.scope.Key.Namespace == ns {
			return
		}
		if c.reselect(sc, ns, nsLabels, nsKnown) || namesNamespace(sc.scope, ns) {
			c.markDirty(key)
		}
	})
}

// UpsertScope records a scope's spec and recomputes that scope alone: which
// Services it selects and its complete resource set. The scope's Transition
// is honoured only for a scope the catalog has not seen yet (after a restart,
// the one the status shows); a known scope's transition is the catalog's
// own, started when it saw the protocol change.
func (c *Catalog) UpsertScope(scope *model.Scope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc, ok := c.scopes[scope.Key]
	if ok {
		old, kept := sc.scope, sc.scope.Transition
		scope.Transition = nil
		switch {
		case old.Protocol != scope.Protocol && scope.TransitionWindow > 0:
			// The previous protocol's proxies are served a while longer.
			now := c.now()
			scope.Transition = &model.Transition{From: old.Protocol, Since: now, Until: now.Add(scope.TransitionWindow)}
		case old.Protocol == scope.Protocol && kept != nil && c.now().Before(kept.Until):
			// Kept through other edits; a new window moves its end (0
			// ends it). One that has ended is dropped, so the spec no
			// longer carries it: an Envoy-mode Delta scope then moves its
			// virtual hosts to VHDS (see translate.VHDS).
			tr := *kept
			tr.Until = tr.Since.Add(scope.TransitionWindow)
			scope.Transition = &tr
		}
	}
	if ok && reflect.DeepEqual(sc.scope, scope) {
		return
	}
	if !ok {
		sc = &scopeEntry{created: true}
		c.scopes[scope.Key] = sc
		delete(c.deleted, scope.Key)
		delete(c.rejected, scope.Key)
	}
	for _, e := range sc.services {
		e.scopes.remove(scope.Key)
	}
	for _, e := range sc.backends {
		delete(e.backendOf, scope.Key)
	}
	if ok {
		c.reach.remove(sc)
	}
	sc.scope = scope
	sc.cat = c
	c.reach.add(sc)
	c.reachMoved()
	if sc.places == nil {
		sc.places = Placed{}
	}
	sc.services = map[model.Key]*serviceEntry{}
	sc.backends = map[model.Key]*serviceEntry{}
	sc.leaving = nil // the backends are chosen again, from the routes served
	sc.refused = map[model.Key]struct{}{}
	c.eachReachable(scope, func(e *serviceEntry) {
		nsLabels, nsKnown := c.namespaces[e.svc.Key.Namespace]
		if is, _ := c.admits(sc, e.svc, nsLabels, nsKnown); is {
			sc.services[e.svc.Key] = e
			e.scopes.add(scope.Key)
		}
	})
	sc.backends = sc.wantedBackends()
	for _, e := range sc.backends {
		e.serveAsBackend(scope.Key)
	}
	sc.rebuild()
	sc.takeTouched()
	// Reported even when no resource changed: downstream serves the spec too
	// (protocol, generation), and must learn a new scope exists.
	c.markDirty(scope.Key)
}

// eachReachable calls fn for every Service of the namespaces the scope's
// selections can reach: those they name, or every namespace when one
// selects namespaces by labels.
func (c *Catalog) eachReachable(scope *model.Scope, fn func(*serviceEntry)) {
	if selectsByNamespaceLabels(scope) {
		for _, e := range c.services {
			fn(e)
		}
		return
	}
	seen := map[string]bool{}
	for i := range scope.Selections {
		ns := scope.Selections[i].Namespace
		if seen[ns] {
			continue
		}
		seen[ns] = true
		for _, e := range c.byNS[ns] {
			fn(e)
		}
	}
}

// DeleteScope forgets a scope; the next Take reports it deleted.
func (c *Catalog) DeleteScope(key model.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc, ok := c.scopes[key]
	_, wasRejected := c.rejected[key]
	if !ok && !wasRejected {
		return
	}
	if ok {
		sc.forget()
		c.reach.remove(sc)
		delete(c.scopes, key)
		c.reachMoved()
	}
	delete(c.rejected, key)
	c.deleted[key] = Resolution{}
	c.markDirty(key)
}

// RejectScope records that a scope's spec of generation could not be
// converted, and why: the scope serves nothing until a later generation is
// upserted, and the next Take reports it like a deletion that carries the
// reason.
func (c *Catalog) RejectScope(key model.Key, generation int64, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc, ok := c.scopes[key]; ok {
		sc.forget()
		c.reach.remove(sc)
		delete(c.scopes, key)
		c.reachMoved()
	}
	c.rejected[key] = struct{}{}
	c.deleted[key] = Resolution{Generation: generation, Invalid: reason}
	c.markDirty(key)
}

// Take returns what changed in every scope since the previous Take, and
// forgets it: each change is handed downstream once.
func (c *Catalog) Take() []Update {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := c.dirty.Take()
	out := make([]Update, 0, len(keys))
	for _, key := range keys {
		if res, gone := c.deleted[key]; gone {
			out = append(out, Update{Key: key, Resolution: res})
			delete(c.deleted, key)
			continue
		}
		sc := c.scopes[key]
		sc.fresh()
		u := Update{Key: key, Scope: sc.scope, Reset: sc.created, Resolution: c.resolution(sc)}
		sc.created = false
		for t, names := range sc.changed {
			for name := range names {
				if r, ok := sc.res[t][name]; ok {
					if u.Upserted[t] == nil {
						u.Upserted[t] = map[string]proto.Message{}
					}
					u.Upserted[t][name] = r.m
					if r.from != nil {
						if u.From[t] == nil {
							u.From[t] = map[string]*model.Origin{}
						}
						u.From[t][name] = r.from
					}
				} else {
					u.Removed[t] = append(u.Removed[t], name)
				}
			}
			slices.Sort(u.Removed[t])
		}
		sc.changed = [xdstype.Count]map[string]struct{}{}
		for place, names := range sc.placeChanged {
			pc := PlaceChanges{}
			for name := range names {
				if r, ok := sc.places[place][name]; ok {
					if pc.Upserted == nil {
						pc.Upserted = map[string]proto.Message{}
					}
					pc.Upserted[name] = r
				} else {
					pc.Removed = append(pc.Removed, name)
				}
			}
			slices.Sort(pc.Removed)
			if u.Places == nil {
				u.Places = map[model.Place]PlaceChanges{}
			}
			u.Places[place] = pc
		}
		sc.placeChanged = nil
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b Update) int { return a.Key.Compare(b.Key) })
	return out
}

// Resources returns a copy of a scope's complete resource set, and whether
// the scope exists.
func (c *Catalog) Resources(key model.Key) (Set, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc, ok := c.scopes[key]
	if !ok {
		return Set{}, false
	}
	sc.fresh()
	var out Set
	for t, byName := range sc.res {
		if byName == nil {
			continue
		}
		out[t] = make(map[string]proto.Message, len(byName))
		for name, r := range byName {
			out[t][name] = r.m
		}
	}
	return out, true
}

// Places returns a copy of a scope's views from particular places (nil
// when the scope does not exist).
func (c *Catalog) Places(key model.Key) Placed {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc, ok := c.scopes[key]
	if !ok {
		return nil
	}
	out := make(Placed, len(sc.places))
	for place, byName := range sc.places {
		out[place] = maps.Clone(byName)
	}
	return out
}

// resolution is what the scope's spec resolves to now.
func (c *Catalog) resolution(sc *scopeEntry) Resolution {
	r := Resolution{
		Generation:       sc.scope.Generation,
		SelectedServices: len(sc.services),
		Clusters:         len(sc.res[xdstype.Cluster]),
		Endpoints:        sc.endpoints,
	}
	// The resolution says no more about another namespace than the scope's
	// author may learn there: a namespace without consent is refused alike
	// whether it exists or not (one that grants anything exists), and
	// Services refused there are reported only for namespaces a selection
	// names, never for those a namespaceSelector reaches, so that no
	// selector finds out which namespaces hold matching Services.
	from := sc.scope.Key.Namespace
	named := map[string]bool{}
	for i := range sc.scope.Selections {
		s := &sc.scope.Selections[i]
		if s.NamespaceSelector != nil {
			continue
		}
		named[s.Namespace] = true
		if !c.consents(s.Namespace, from) {
			if !slices.Contains(r.RefusedNamespaces, s.Namespace) {
				r.RefusedNamespaces = append(r.RefusedNamespaces, s.Namespace)
			}
			continue
		}
		if _, ok := c.namespaces[s.Namespace]; !ok && !slices.Contains(r.MissingNamespaces, s.Namespace) {
			r.MissingNamespaces = append(r.MissingNamespaces, s.Namespace)
		}
	}
	for k := range sc.refused {
		if named[k.Namespace] && !slices.Contains(r.RefusedNamespaces, k.Namespace) {
			r.RefusedNamespaces = append(r.RefusedNamespaces, k.Namespace)
		}
	}
	slices.Sort(r.MissingNamespaces)
	slices.Sort(r.RefusedNamespaces)
	r.GrantsUnavailable = len(r.RefusedNamespaces) > 0 && c.grantsUnavailable
	c.resolveRoutes(sc, &r)
	return r
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
