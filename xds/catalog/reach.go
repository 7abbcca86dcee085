package catalog

import "github.com/scopeplane/scopeplane/xds/model"

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
