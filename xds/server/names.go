package server

import (
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// nameSet is the names of a by-name subscription. Most proxies subscribe
// to exactly the names their scope serves of a type (Envoy to the
// assignment of every cluster), so the set is the scope's, kept by
// reference (served), with apart only the names it adds (plus) or lacks
// (minus): a proxy subscribed like that costs its stream nothing per name.
type nameSet struct {
	served      snapshot.Names
	plus, minus map[string]struct{}
}

// ownNames is a set of the given names, not yet shared (see share).
func ownNames(names map[string]struct{}) nameSet { return nameSet{plus: names} }

func (n *nameSet) has(name string) bool {
	if _, ok := n.plus[name]; ok {
		return true
	}
	if _, ok := n.minus[name]; ok {
		return false
	}
	return n.served.Has(name)
}

func (n *nameSet) len() int { return n.served.Len() - len(n.minus) + len(n.plus) }

// all calls fn for every name of the set, in no particular order.
func (n *nameSet) all(fn func(name string)) {
	for name := range n.plus {
		fn(name)
	}
	n.served.All(func(name string) {
		if _, ok := n.minus[name]; !ok {
			fn(name)
		}
	})
}

// add adds name and reports whether it was missing.
func (n *nameSet) add(name string) bool {
	if n.has(name) {
		return false
	}
	if _, ok := n.minus[name]; ok {
		delete(n.minus, name)
		return true
	}
	if n.plus == nil {
		n.plus = map[string]struct{}{}
	}
	n.plus[name] = struct{}{}
	return true
}

// remove removes name and reports whether it was there.
func (n *nameSet) remove(name string) bool {
	if !n.has(name) {
		return false
	}
	if _, ok := n.plus[name]; ok {
		delete(n.plus, name)
		return true
	}
	if n.minus == nil {
		n.minus = map[string]struct{}{}
	}
	n.minus[name] = struct{}{}
	return true
}

// within reports whether every name of the set is one of served's, the
// names the scope serves now, without a pass over them: true when the set
// is served's less some names (as after share), so that a subscription the
// scope serves whole is not looked up name by name to find what is missing.
func (n *nameSet) within(served snapshot.Names) bool {
	return len(n.plus) == 0 && n.served == served
}

// share makes served, the names the scope serves now, the set's base when
// the set holds exactly those names. Only the names that differ between the
// two bases and the names listed apart can disagree, so that is what it
// compares, after the sizes.
func (n *nameSet) share(served snapshot.Names) {
	if n.len() != served.Len() || (len(n.plus) == 0 && len(n.minus) == 0 && n.served == served) {
		return
	}
	same := true
	check := func(name string) { same = same && n.has(name) == served.Has(name) }
	snapshot.NameChanges(n.served, served, check)
	for name := range n.plus {
		check(name)
	}
	for name := range n.minus {
		check(name)
	}
	if same {
		*n = nameSet{served: served}
	}
}

// frozen returns the set as feedback keeps it, which must not change
// after: the scope's set itself when the subscription is exactly that, a
// copy otherwise.
func (n *nameSet) frozen() feedback.Names {
	if len(n.plus) == 0 && len(n.minus) == 0 {
		return n.served
	}
	list := make(nameList, 0, n.len())
	n.all(func(name string) { list = append(list, name) })
	return list
}

// nameList is a copy of a subscription's names handed to feedback.
type nameList []string

func (l nameList) Len() int { return len(l) }

func (l nameList) All(fn func(name string)) {
	for _, name := range l {
		fn(name)
	}
}
