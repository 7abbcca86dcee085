package catalog

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/xds/model"
)

// reach indexes the scopes by the namespaces their selections can select
// Services of, so that a change in one namespace (a Service, the
// namespace's labels, its grants) visits the scopes that can select there
// rather than every scope: with ten thousand scopes and a hundred thousand
// Services, visiting every scope for every Service is a billion selector
// matches at each start.
type reach struct {
	// named holds, per namespace, the scopes with a selection naming it.
	named map[string]map[model.Key]*scopeEntry
	// byLabels holds the scopes with a selection by namespace labels, which
	// can reach any namespace.
	byLabels map[model.Key]*scopeEntry
}

func newReach() reach {
	return reach{named: map[string]map[model.Key]*scopeEntry{}, byLabels: map[model.Key]*scopeEntry{}}
}

// add indexes the scope by its current spec.
func (r reach) add(sc *scopeEntry) {
	for i := range sc.scope.Selections {
		s := &sc.scope.Selections[i]
		if s.NamespaceSelector != nil {
			r.byLabels[sc.scope.Key] = sc
			continue
		}
		if r.named[s.Namespace] == nil {
			r.named[s.Namespace] = map[model.Key]*scopeEntry{}
		}
		r.named[s.Namespace][sc.scope.Key] = sc
	}
}

// remove forgets the scope as its current spec indexed it.
func (r reach) remove(sc *scopeEntry) {
	for i := range sc.scope.Selections {
		s := &sc.scope.Selections[i]
		if s.NamespaceSelector != nil {
			delete(r.byLabels, sc.scope.Key)
			continue
		}
		delete(r.named[s.Namespace], sc.scope.Key)
		if len(r.named[s.Namespace]) == 0 {
			delete(r.named, s.Namespace)
		}
	}
}

// each calls fn once for every scope that can select Services of ns.
func (r reach) each(ns string, fn func(model.Key, *scopeEntry)) {
	named := r.named[ns]
	for k, sc := range named {
		fn(k, sc)
	}
	for k, sc := range r.byLabels {
		if _, seen := named[k]; !seen {
			fn(k, sc)
		}
	}
}

// Reach returns the namespaces whose Services the catalog's scopes can
// serve, sorted, and the reach version it was computed at (see
// ReachVersion): the namespaces a selection names, and those whose labels
// match a selection's namespaceSelector now, that consent to the scope
// (consents); those of the backends the mesh routes attached to a Service
// of these may reach (routePermits), which are served with their parent;
// and those of the backends the scopes still serve (one leaving stays for
// the backend grace). routeNamespaces adds every namespace a
// route names as a parent or a backend, for the replica that writes the
// routes' status (whose backends that are not permitted need no
// Service). Only namespaces that exist count: a name no namespace
// has holds no Service, and a spec or a route naming many must not open a
// watch for each.
//
// A shard's replica lists and watches Services in these namespaces only
// (controllers/servicecache), so a Service outside them is never in its
// catalog, and no scope of its catalog could select it.
func (c *Catalog) Reach(routeNamespaces bool) ([]string, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set := map[string]struct{}{}
	for ns, scopes := range c.reach.named {
		for _, sc := range scopes {
			if c.consents(ns, sc.scope.Key.Namespace) {
				set[ns] = struct{}{}
				break
			}
		}
	}
	for _, sc := range c.reach.byLabels {
		for i := range sc.scope.Selections {
			sel := sc.scope.Selections[i].NamespaceSelector
			if sel == nil {
				continue
			}
			for ns, nsLabels := range c.namespaces {
				if c.consents(ns, sc.scope.Key.Namespace) && sel.Matches(labels.Set(nsLabels)) {
					set[ns] = struct{}{}
				}
			}
		}
	}
	var backends []string
	for _, r := range c.routes {
		attached := routeNamespaces
		for _, p := range r.Parents {
			if _, ok := set[p.Service.Namespace]; ok {
				attached = true
			}
			if routeNamespaces {
				backends = append(backends, p.Service.Namespace)
			}
		}
		if !attached {
			continue
		}
		for i := range r.Rules {
			for _, b := range r.Rules[i].Refs() {
				if c.routePermits(r, b.Service) {
					backends = append(backends, b.Service.Namespace)
				}
			}
		}
	}
	for _, sc := range c.scopes {
		for k := range sc.backends {
			backends = append(backends, k.Namespace)
		}
	}
	for _, ns := range backends {
		set[ns] = struct{}{}
	}
	for ns := range set {
		if _, ok := c.namespaces[ns]; !ok {
			delete(set, ns)
		}
	}
	return slices.Sorted(maps.Keys(set)), c.reachVersion
}

// consents reports whether namespace ns may give a scope of namespace from
// anything: its own, any with CrossNamespaceAllow, or one whose
// ReferenceGrants grant from some Service. Of any other, a scope gets no
// Service and its status tells nothing Services decide (see resolution),
// so no shard watches it for that scope: a scope's author cannot make a
// replica list a namespace that did not consent.
func (c *Catalog) consents(ns, from string) bool {
	_, granted := c.grants[ns][from]
	return ns == from || c.crossNS == CrossNamespaceAllow || granted
}

// ReachVersion changes whenever what Reach computes may have changed: a
// scope, a namespace created or deleted, its labels (while a scope selects
// by them), a namespace's grants, a route, or a route backend no longer
// served.
func (c *Catalog) ReachVersion() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reachVersion
}

// ReachChanged receives a value after the reach version changed. Several
// changes may be signalled once.
func (c *Catalog) ReachChanged() <-chan struct{} { return c.reachSignal }

// reachMoved records that Reach may answer otherwise now.
func (c *Catalog) reachMoved() {
	c.reachVersion++
	select {
	case c.reachSignal <- struct{}{}:
	default:
	}
}
