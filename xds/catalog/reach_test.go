package catalog

import (
	"slices"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Reach names the namespaces a shard must watch: those its scopes name,
// those their namespace selectors match now, and those of the backends of
// the routes attached there; with routeNamespaces, every namespace a route
// names. Its version moves with every change that can change it.
func TestReachFollowsScopesNamespacesAndRoutes(t *testing.T) {
	c := New()
	expect := func(what string, routeNamespaces bool, want ...string) uint64 {
		t.Helper()
		got, v := c.Reach(routeNamespaces)
		if !slices.Equal(got, want) {
			t.Errorf("%s: reach %v, want %v", what, got, want)
		}
		if v != c.ReachVersion() {
			t.Errorf("%s: Reach at version %d, ReachVersion %d", what, v, c.ReachVersion())
		}
		// What signalled so far is seen: the next check waits for a
		// new signal.
		select {
		case <-c.ReachChanged():
		default:
		}
		return v
	}
	moved := func(what string, before uint64) {
		t.Helper()
		select {
		case <-c.ReachChanged():
		default:
			t.Errorf("%s: ReachChanged did not signal", what)
		}
		if c.ReachVersion() <= before {
			t.Errorf("%s: the reach version stayed %d", what, before)
		}
	}
	c.SetCrossNamespace(CrossNamespaceAllow, false)
	for _, ns := range []string{"labs", "far", "farther"} {
		c.UpsertNamespace(ns, nil)
	}
	c.UpsertService(service("shop", "web", nil, "10.0.0.1"))
	c.UpsertService(service("labs", "web-next", nil, "10.0.0.2"))
	v := expect("empty", false)

	c.UpsertScope(scope("shop", "gw", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("web")}))
	moved("a scope", v)
	v = expect("a scope naming a namespace that does not exist", false)
	c.UpsertNamespace("shop", nil)
	moved("a namespace created", v)
	expect("a scope naming its namespace", false, "shop")

	c.UpsertNamespace("team-a", map[string]string{"team": "a"})
	c.UpsertNamespace("team-b", map[string]string{"team": "b"})
	v = c.ReachVersion()
	c.UpsertNamespace("team-b", map[string]string{"team": "b", "tier": "1"})
	if c.ReachVersion() != v {
		t.Error("a namespace's labels moved the reach while no scope selects by them")
	}
	c.UpsertScope(scope("ops", "all-a", model.ListenerProxylessGRPC, model.Selection{NamespaceSelector: selector(t, "team=a")}))
	moved("a scope selecting by labels", v)
	v = expect("a namespace selector", false, "shop", "team-a")
	c.UpsertNamespace("team-b", map[string]string{"team": "a"})
	moved("a namespace relabelled", v)
	v = expect("a namespace relabelled into a selector", false, "shop", "team-a", "team-b")

	// A route attached to a Service of a namespace in reach brings its
	// backends' namespaces; one attached elsewhere brings nothing, except
	// to the replica that writes the routes' status.
	c.UpsertRoute(&model.Route{
		Key: model.Key{Namespace: "shop", Name: "canary"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "web"}}},
		Rules: []model.RouteRule{{Backends: []model.RouteBackend{
			{Service: model.Key{Namespace: "shop", Name: "web"}, Port: 80, Weight: 9},
			{Service: model.Key{Namespace: "labs", Name: "web-next"}, Port: 80, Weight: 1},
		}}},
	})
	moved("a route", v)
	c.UpsertRoute(&model.Route{
		Key: model.Key{Namespace: "far", Name: "split"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "far", Name: "api"}}},
		Rules:   []model.RouteRule{{Backends: []model.RouteBackend{{Service: model.Key{Namespace: "farther", Name: "api"}, Port: 80, Weight: 1}}}},
	})
	expect("routes", false, "labs", "shop", "team-a", "team-b")
	expect("routes, for the route status", true, "far", "farther", "labs", "shop", "team-a", "team-b")

	// A backend the routes no longer name stays for its grace (here until
	// the Take after the next), and its namespace with it.
	c.Take()
	c.DeleteRoute(model.RouteRef{Kind: model.HTTPRoute, Key: model.Key{Namespace: "shop", Name: "canary"}})
	expect("a backend leaving", false, "labs", "shop", "team-a", "team-b")
	c.Take()
	expect("a backend leaving, a Take later", false, "labs", "shop", "team-a", "team-b")
	v = c.ReachVersion()
	c.Take()
	moved("a backend gone", v)
	v = expect("the backend gone", false, "shop", "team-a", "team-b")

	c.DeleteScope(model.Key{Namespace: "shop", Name: "gw"})
	moved("a scope deleted", v)
	v = expect("the scope naming shop deleted", false, "team-a", "team-b")
	c.RejectScope(model.Key{Namespace: "ops", Name: "all-a"}, 2, "bad selector")
	moved("a scope rejected", v)
	expect("every scope gone", false)
}

// Under the default consent, a namespace counts for a scope only when it
// is the scope's own or grants it something, and a route backend's only
// when its namespace permits the route: a scope or route author cannot
// make a shard list a namespace that did not consent.
func TestReachNeedsConsent(t *testing.T) {
	c := New()
	for _, ns := range []string{"shop", "bank", "labs", "team-x"} {
		c.UpsertNamespace(ns, map[string]string{"team": "x"})
	}
	expect := func(what string, want ...string) {
		t.Helper()
		if got, _ := c.Reach(false); !slices.Equal(got, want) {
			t.Errorf("%s: reach %v, want %v", what, got, want)
		}
	}
	c.UpsertScope(scope("shop", "gw", model.ListenerProxylessGRPC,
		model.Selection{Namespace: "shop", Names: names("web")},
		model.Selection{Namespace: "bank", Names: names("ledger")},
		model.Selection{NamespaceSelector: selector(t, "team=x")}))
	expect("no namespace consents", "shop")
	v := c.ReachVersion()
	c.SetGrants("bank", model.Grants{"shop": nil})
	if c.ReachVersion() == v {
		t.Error("a grant did not move the reach")
	}
	expect("bank grants shop", "bank", "shop")

	c.UpsertRoute(&model.Route{
		Key: model.Key{Namespace: "shop", Name: "canary"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "web"}}},
		Rules:   []model.RouteRule{{Backends: []model.RouteBackend{{Service: model.Key{Namespace: "labs", Name: "web-next"}, Port: 80, Weight: 1}}}},
	})
	expect("a route backend whose namespace does not permit the route", "bank", "shop")
	c.SetRouteGrants("labs", map[model.RouteKind]model.Grants{model.HTTPRoute: {"shop": nil}})
	expect("labs permits the route", "bank", "labs", "shop")
}
