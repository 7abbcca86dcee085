package catalog

import (
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// selectsByNamespaceLabels reports whether a namespace's labels can change
// what the scope selects.
func selectsByNamespaceLabels(s *model.Scope) bool {
	for i := range s.Selections {
		if s.Selections[i].NamespaceSelector != nil {
			return true
		}
	}
	return false
}

// namesNamespace reports whether a selection of the scope names the
// namespace explicitly (rather than by labels).
func namesNamespace(s *model.Scope, ns string) bool {
	for i := range s.Selections {
		if s.Selections[i].NamespaceSelector == nil && s.Selections[i].Namespace == ns {
			return true
		}
	}
	return false
}

// endpointCount is how many endpoints a resource adds to the scope's count.
func endpointCount(t xdstype.Type, r proto.Message) int {
	cla, ok := r.(*endpointv3.ClusterLoadAssignment)
	if t != xdstype.Endpoint || !ok {
		return 0
	}
	n := 0
	for _, l := range cla.GetEndpoints() {
		n += len(l.GetLbEndpoints())
	}
	return n
}

// held is a stored resource and its provenance (nil for the scope's own).
type held struct {
	m    proto.Message
	from *model.Origin
}

// set stores a resource translated from the Service port from (nil: the
// scope's own) unless an equal one of equal provenance is already stored,
// so that an unchanged resource keeps its identity and is not reported
// downstream.
func (sc *scopeEntry) set(t xdstype.Type, name string, r proto.Message, from *model.Origin) {
	byName := sc.res[t]
	if byName == nil {
		byName = map[string]held{}
		sc.res[t] = byName
	}
	prev, ok := byName[name]
	old := prev.m
	if translate.EpochTypes(t) && translate.Stamped(sc.scope) {
		r = sc.stamped(t, name, r, old)
	}
	if ok && (old == r || proto.Equal(old, r)) && model.SameOrigin(prev.from, from) {
		return
	}
	if ok {
		sc.endpoints -= endpointCount(t, old)
	}
	sc.endpoints += endpointCount(t, r)
	byName[name] = held{m: r, from: from}
	sc.mark(t, name)
}

// stamped returns r, a listener, route configuration or cluster, with the scope's
// epoch (translate.EpochMetadataKey), as AssembleScope stamps it: old, the
// stored copy, when it was stamped from a source equal to r at the same
// epoch, so that a Service's re-translation clones nothing unless its
// listeners or routes changed.
func (sc *scopeEntry) stamped(t xdstype.Type, name string, r, old proto.Message) proto.Message {
	if translate.HasEpoch(sc.scope, r) {
		delete(sc.stampSrc[t], name)
		return r
	}
	if src, ok := sc.stampSrc[t][name]; ok && old != nil && (src == r || proto.Equal(src, r)) && translate.HasEpoch(sc.scope, old) {
		return old
	}
	if sc.stampSrc[t] == nil {
		sc.stampSrc[t] = map[string]proto.Message{}
	}
	sc.stampSrc[t][name] = r
	return translate.WithEpoch(sc.scope, r)
}

func (sc *scopeEntry) remove(t xdstype.Type, name string) {
	old, ok := sc.res[t][name]
	if !ok {
		return
	}
	delete(sc.stampSrc[t], name)
	sc.endpoints -= endpointCount(t, old.m)
	delete(sc.res[t], name)
	sc.mark(t, name)
}

// setPlace stores the assignment proxies at place see for name, unless an
// equal one is stored; removePlace forgets it. Like set and remove, they
// record the change for Take.
func (sc *scopeEntry) setPlace(place model.Place, name string, r proto.Message) {
	byName := sc.places[place]
	if byName == nil {
		byName = map[string]proto.Message{}
		sc.places[place] = byName
	}
	if old, ok := byName[name]; ok && (old == r || proto.Equal(old, r)) {
		return
	}
	byName[name] = r
	sc.markPlace(place, name)
}

func (sc *scopeEntry) removePlace(place model.Place, name string) {
	if _, ok := sc.places[place][name]; !ok {
		return
	}
	delete(sc.places[place], name)
	if len(sc.places[place]) == 0 {
		delete(sc.places, place)
	}
	sc.markPlace(place, name)
}

func (sc *scopeEntry) markPlace(place model.Place, name string) {
	if sc.placeChanged == nil {
		sc.placeChanged = map[model.Place]map[string]struct{}{}
	}
	if sc.placeChanged[place] == nil {
		sc.placeChanged[place] = map[string]struct{}{}
	}
	sc.placeChanged[place][name] = struct{}{}
	sc.touched = true
}

func (sc *scopeEntry) mark(t xdstype.Type, name string) {
	if sc.changed[t] == nil {
		sc.changed[t] = map[string]struct{}{}
	}
	sc.changed[t][name] = struct{}{}
	sc.touched = true
}

// envoyMode reports whether the scope's listener and route configuration are
// assembled from all of its Services (Envoy mode) rather than owned by each
// Service (ProxylessGRPC mode).
func (sc *scopeEntry) envoyMode() bool { return sc.scope.Listener.Mode == model.ListenerEnvoy }

// putFragment stores the resources a Service owns in this scope, and what
// proxies at particular places see of them.
func (sc *scopeEntry) putFragment(f *translate.Fragment) {
	f.EachFrom(func(t xdstype.Type, m proto.Message, from *model.Origin) { sc.set(t, t.Info().NameOf(m), m, from) })
	for _, p := range f.Places {
		for _, cla := range p.Endpoints {
			sc.setPlace(p.Place, cla.GetClusterName(), cla)
		}
	}
}

// dropFragment removes the resources a Service owned in this scope, except
// those its new fragment (nil when the Service left) still holds.
func (sc *scopeEntry) dropFragment(old, keep *translate.Fragment) {
	if old == nil {
		return
	}
	var kept [xdstype.Count]map[string]struct{}
	if keep != nil {
		keep.Each(func(t xdstype.Type, m proto.Message) {
			if kept[t] == nil {
				kept[t] = map[string]struct{}{}
			}
			kept[t][t.Info().NameOf(m)] = struct{}{}
		})
	}
	old.Each(func(t xdstype.Type, m proto.Message) {
		name := t.Info().NameOf(m)
		if _, ok := kept[t][name]; !ok {
			sc.remove(t, name)
		}
	})
	keptAt := map[model.Place]map[string]struct{}{}
	if keep != nil {
		for _, p := range keep.Places {
			keptAt[p.Place] = map[string]struct{}{}
			for _, cla := range p.Endpoints {
				keptAt[p.Place][cla.GetClusterName()] = struct{}{}
			}
		}
	}
	for _, p := range old.Places {
		for _, cla := range p.Endpoints {
			if _, ok := keptAt[p.Place][cla.GetClusterName()]; !ok {
				sc.removePlace(p.Place, cla.GetClusterName())
			}
		}
	}
}

func (sc *scopeEntry) addService(e *serviceEntry) {
	sc.services[e.svc.Key] = e
	e.scopes.add(sc.scope.Key)
	sc.putFragment(e.fragment(sc.keyOf(e)))
	sc.routesStale = sc.envoyMode()
	sc.noteRouted()
}

func (sc *scopeEntry) removeService(e *serviceEntry, old *translate.Fragment) {
	delete(sc.services, e.svc.Key)
	e.scopes.remove(sc.scope.Key)
	sc.dropFragment(old, nil)
	if _, ok := sc.backends[e.svc.Key]; ok {
		// Still a route backend (until the backends settle): its
		// clusters and assignments stay.
		sc.putFragment(e.fragment(sc.backendKey()))
	}
	sc.routesStale = sc.envoyMode()
	sc.noteRouted()
}

// noteRouted marks the route backends the scope serves stale after its
// selection changed, when routes exist that could make them change.
func (sc *scopeEntry) noteRouted() {
	sc.backendsStale = sc.backendsStale || len(sc.cat.byParent) > 0 || len(sc.backends) > 0
}

func (sc *scopeEntry) replaceService(e *serviceEntry, old *translate.Fragment) {
	f := e.fragment(sc.keyOf(e))
	sc.dropFragment(old, f)
	sc.putFragment(f)
	if sc.envoyMode() && (old == nil || !virtualHostsEqual(old, f)) {
		sc.routesStale = true
	}
}

func virtualHostsEqual(a, b *translate.Fragment) bool {
	if len(a.Hosts) != len(b.Hosts) {
		return false
	}
	for i := range a.Hosts {
		if !proto.Equal(a.Hosts[i], b.Hosts[i]) {
			return false
		}
	}
	return true
}

// fragments returns the translation of every selected Service, and the
// backend part of every Service served as a route backend.
func (sc *scopeEntry) fragments() []*translate.Fragment {
	out := make([]*translate.Fragment, 0, len(sc.services)+len(sc.backends))
	for _, e := range sc.services {
		out = append(out, e.fragment(sc.keyOf(e)))
	}
	for _, e := range sc.backends {
		out = append(out, e.fragment(sc.backendKey()))
	}
	return out
}

// replaceTypes makes the stored resources of the given types equal to
// those of all.
func (sc *scopeEntry) replaceTypes(all *translate.Resources, types ...xdstype.Type) {
	var want [xdstype.Count]map[string]held
	for _, t := range types {
		want[t] = map[string]held{}
	}
	all.EachFrom(func(t xdstype.Type, m proto.Message, from *model.Origin) {
		if want[t] != nil {
			want[t][t.Info().NameOf(m)] = held{m: m, from: from}
		}
	})
	for _, t := range types {
		for name := range sc.res[t] {
			if _, ok := want[t][name]; !ok {
				sc.remove(t, name)
			}
		}
		for name, h := range want[t] {
			sc.set(t, name, h.m, h.from)
		}
	}
}

// reassembleRoutes re-assembles an Envoy-mode scope's scope-wide listener
// and route configuration when its set of virtual hosts changed since they
// were last assembled.
func (sc *scopeEntry) reassembleRoutes() {
	if !sc.routesStale {
		return
	}
	sc.routesStale = false
	all := translate.AssembleScope(sc.scope, sc.fragments())
	sc.replaceTypes(&all, xdstype.Listener, xdstype.Route, xdstype.VirtualHost)
}

// takeTouched reports whether any resource of the scope changed since the
// previous call, and forgets it.
func (sc *scopeEntry) takeTouched() bool {
	touched := sc.touched
	sc.touched = false
	return touched
}

// rebuild recomputes the scope's complete resource set from its Services,
// after its spec changed.
func (sc *scopeEntry) rebuild() {
	all := translate.AssembleScope(sc.scope, sc.fragments())
	sc.replaceTypes(&all, xdstype.All()...)
	sc.replacePlaces(all.Places)
	sc.routesStale = false
}

// replacePlaces makes the stored place views equal to places.
func (sc *scopeEntry) replacePlaces(places []translate.PlaceEndpoints) {
	want := map[model.Place]map[string]proto.Message{}
	for _, p := range places {
		want[p.Place] = map[string]proto.Message{}
		for _, cla := range p.Endpoints {
			want[p.Place][cla.GetClusterName()] = cla
		}
	}
	for place, byName := range sc.places {
		for name := range byName {
			if _, ok := want[place][name]; !ok {
				sc.removePlace(place, name)
			}
		}
	}
	for place, byName := range want {
		for name, m := range byName {
			sc.setPlace(place, name, m)
		}
	}
}

// settle reports whether anything in the scope changed since the previous
// settle, or its routes must be re-assembled. That is left to Take (see
// fresh), once per build: re-assembling at every Service added would make
// loading a scope of n Services one by one, as the reconcilers do at each
// start, cost n² virtual hosts.
func (sc *scopeEntry) settle() bool {
	return sc.takeTouched() || sc.routesStale || sc.backendsStale
}

// fresh re-assembles what the scope's changes made stale, before its
// resources are read.
func (sc *scopeEntry) fresh() {
	sc.syncBackends()
	sc.reassembleRoutes()
	sc.takeTouched()
}
