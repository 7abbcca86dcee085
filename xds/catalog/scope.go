package catalog

import (
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
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

// set stores a resource unless an equal one is already stored, so that an
// unchanged resource keeps its identity and is not reported downstream.
func (sc *scopeEntry) set(typ, name string, r proto.Message) {
	byName := sc.res[typ]
	if byName == nil {
		byName = map[string]proto.Message{}
		sc.res[typ] = byName
	}
	if old, ok := byName[name]; ok && (old == r || proto.Equal(old, r)) {
		return
	}
	byName[name] = r
	sc.mark(typ, name)
}

func (sc *scopeEntry) remove(typ, name string) {
	if _, ok := sc.res[typ][name]; !ok {
		return
	}
	delete(sc.res[typ], name)
	sc.mark(typ, name)
}

func (sc *scopeEntry) mark(typ, name string) {
	if sc.changed[typ] == nil {
		sc.changed[typ] = map[string]struct{}{}
	}
	sc.changed[typ][name] = struct{}{}
	sc.touched = true
}

// envoyMode reports whether the scope's listener and route configuration are
// assembled from all of its Services (Envoy mode) rather than owned by each
// Service (ProxylessGRPC mode).
func (sc *scopeEntry) envoyMode() bool { return sc.scope.Listener.Mode == model.ListenerEnvoy }

// putFragment stores the resources a Service owns in this scope.
func (sc *scopeEntry) putFragment(f *translate.ServiceResources) {
	for _, r := range f.Clusters {
		sc.set(resourcev3.ClusterType, r.GetName(), r)
	}
	for _, r := range f.Endpoints {
		sc.set(resourcev3.EndpointType, r.GetClusterName(), r)
	}
	for _, r := range f.Listeners {
		sc.set(resourcev3.ListenerType, r.GetName(), r)
	}
	for _, r := range f.Routes {
		sc.set(resourcev3.RouteType, r.GetName(), r)
	}
}

// dropFragment removes the resources a Service owned in this scope, except
// those its new fragment (nil when the Service left) still holds.
func (sc *scopeEntry) dropFragment(old, keep *translate.ServiceResources) {
	if old == nil {
		return
	}
	kept := map[string]struct{}{}
	if keep != nil {
		for _, r := range keep.Clusters {
			kept[resourcev3.ClusterType+r.GetName()] = struct{}{}
		}
		for _, r := range keep.Endpoints {
			kept[resourcev3.EndpointType+r.GetClusterName()] = struct{}{}
		}
		for _, r := range keep.Listeners {
			kept[resourcev3.ListenerType+r.GetName()] = struct{}{}
		}
		for _, r := range keep.Routes {
			kept[resourcev3.RouteType+r.GetName()] = struct{}{}
		}
	}
	drop := func(typ, name string) {
		if _, ok := kept[typ+name]; !ok {
			sc.remove(typ, name)
		}
	}
	for _, r := range old.Clusters {
		drop(resourcev3.ClusterType, r.GetName())
	}
	for _, r := range old.Endpoints {
		drop(resourcev3.EndpointType, r.GetClusterName())
	}
	for _, r := range old.Listeners {
		drop(resourcev3.ListenerType, r.GetName())
	}
	for _, r := range old.Routes {
		drop(resourcev3.RouteType, r.GetName())
	}
}

func (sc *scopeEntry) addService(e *serviceEntry) {
	sc.services[e.svc.Key] = e
	e.scopes[sc.scope.Key] = struct{}{}
	sc.putFragment(e.fragment(sc.scope.Listener.Mode))
	sc.routesStale = sc.envoyMode()
}

func (sc *scopeEntry) removeService(e *serviceEntry, old *translate.ServiceResources) {
	delete(sc.services, e.svc.Key)
	delete(e.scopes, sc.scope.Key)
	sc.dropFragment(old, nil)
	sc.routesStale = sc.envoyMode()
}

func (sc *scopeEntry) replaceService(e *serviceEntry, old *translate.ServiceResources) {
	f := e.fragment(sc.scope.Listener.Mode)
	sc.dropFragment(old, f)
	sc.putFragment(f)
	if sc.envoyMode() && (old == nil || !virtualHostsEqual(old, f)) {
		sc.routesStale = true
	}
}

func virtualHostsEqual(a, b *translate.ServiceResources) bool {
	if len(a.VirtualHosts) != len(b.VirtualHosts) {
		return false
	}
	for i := range a.VirtualHosts {
		if !proto.Equal(a.VirtualHosts[i], b.VirtualHosts[i]) {
			return false
		}
	}
	return true
}

// fragments returns the translation of every selected Service.
func (sc *scopeEntry) fragments() []*translate.ServiceResources {
	out := make([]*translate.ServiceResources, 0, len(sc.services))
	for _, e := range sc.services {
		out = append(out, e.fragment(sc.scope.Listener.Mode))
	}
	return out
}

// replaceType makes the stored resources of one type equal to rs.
func (sc *scopeEntry) replaceType(typ string, rs map[string]proto.Message) {
	for name := range sc.res[typ] {
		if _, ok := rs[name]; !ok {
			sc.remove(typ, name)
		}
	}
	for name, r := range rs {
		sc.set(typ, name, r)
	}
}

// finish re-assembles an Envoy-mode scope's listener and route configuration
// when its set of virtual hosts changed, and reports whether anything in the
// scope changed since the previous finish.
func (sc *scopeEntry) finish() bool {
	if sc.routesStale {
		sc.routesStale = false
		all := translate.AssembleScope(sc.scope, sc.fragments())
		ls := make(map[string]proto.Message, len(all.Listeners))
		for _, l := range all.Listeners {
			ls[l.GetName()] = l
		}
		rs := make(map[string]proto.Message, len(all.Routes))
		for _, r := range all.Routes {
			rs[r.GetName()] = r
		}
		sc.replaceType(resourcev3.ListenerType, ls)
		sc.replaceType(resourcev3.RouteType, rs)
	}
	touched := sc.touched
	sc.touched = false
	return touched
}

// rebuild recomputes the scope's complete resource set from its Services,
// after its spec changed.
func (sc *scopeEntry) rebuild() {
	all := translate.AssembleScope(sc.scope, sc.fragments())
	byType := func(n int) map[string]proto.Message { return make(map[string]proto.Message, n) }
	cs, es, ls, rs := byType(len(all.Clusters)), byType(len(all.Endpoints)), byType(len(all.Listeners)), byType(len(all.Routes))
	for _, r := range all.Clusters {
		cs[r.GetName()] = r
	}
	for _, r := range all.Endpoints {
		es[r.GetClusterName()] = r
	}
	for _, r := range all.Listeners {
		ls[r.GetName()] = r
	}
	for _, r := range all.Routes {
		rs[r.GetName()] = r
	}
	sc.replaceType(resourcev3.ClusterType, cs)
	sc.replaceType(resourcev3.EndpointType, es)
	sc.replaceType(resourcev3.ListenerType, ls)
	sc.replaceType(resourcev3.RouteType, rs)
	sc.routesStale = false
}
