package catalog

import (
	"fmt"
	"slices"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// warmUpWorld is a ProxylessGRPC scope of Service shop/reviews, with
// shop/reviews-v2 (which it does not select) to route to, and the
// catalog's warm-up and backend grace.
func warmUpWorld(t *testing.T, warmUp, grace time.Duration) *Catalog {
	t.Helper()
	c := New()
	c.SetRouteWarmUp(warmUp)
	c.SetBackendGrace(grace)
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "reviews-v2", nil, "10.0.0.2"))
	c.UpsertScope(scope("shop", "gw", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("reviews")}))
	c.Take()
	return c
}

var (
	reviewsKey = model.Key{Namespace: "shop", Name: "reviews"}
	gwKey      = model.Key{Namespace: "shop", Name: "gw"}
)

// toV2 is a route of shop/reviews that sends calls with header h to
// reviews-v2 (every call when h is empty).
func toV2(h string) *model.Route {
	rule := model.RouteRule{Backends: []model.RouteBackend{{Service: model.Key{Namespace: "shop", Name: "reviews-v2"}, Port: 80, Weight: 1}}}
	if h != "" {
		rule.Matches = []model.RouteMatch{{PathType: model.PathPrefix, Path: "/", Headers: []model.ValueMatch{{Name: h, Value: "1"}}}}
	}
	return &model.Route{
		Key: model.Key{Namespace: "shop", Name: "canary"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: reviewsKey}},
		Rules:   []model.RouteRule{rule},
	}
}

// entries is the route configuration of shop/reviews:80 the scope serves,
// as "cluster" for an entry that matches, "warm-up cluster" for one that
// never does, in order.
func entries(t *testing.T, c *Catalog) []string {
	t.Helper()
	res, _ := c.Resources(gwKey)
	var out []string
	for _, m := range res[xdstype.Route] {
		for _, vh := range m.(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				name := r.GetRoute().GetCluster()
				for _, w := range r.GetRoute().GetWeightedClusters().GetClusters() {
					name += w.GetName()
				}
				if r.GetMatch().GetPath() == translate.NoCallPath {
					name = "warm-up " + name
				}
				out = append(out, name)
			}
		}
	}
	return out
}

func assertEntries(t *testing.T, c *Catalog, what string, want ...string) {
	t.Helper()
	if got := entries(t, c); !slices.Equal(got, want) {
		t.Fatalf("%s: the scope's route entries are %q, want %q", what, got, want)
	}
}

// takeUntil takes the catalog's changes as it signals them until ok holds.
func takeUntil(t *testing.T, c *Catalog, what string, ok func([]Update) bool) {
	t.Helper()
	deadline := time.After(testkit.Timeout)
	for {
		if ok(c.Take()) {
			return
		}
		select {
		case <-c.Changed():
		case <-deadline:
			t.Fatalf("%s: not within %v", what, testkit.Timeout)
		}
	}
}

// TestRouteWarmsUpNewClusters checks that a route that sends a
// ProxylessGRPC scope's calls to a cluster its route configuration did not
// name is served, first, as the old entries plus one that names the
// cluster and matches nothing, with the cluster served; then, once the
// warm-up is over, as itself. Its deletion warms the Service's own
// cluster up the same way, and the backend it no longer reaches leaves
// only a Take after the routes stopped naming it, however short its grace.
func TestRouteWarmsUpNewClusters(t *testing.T) {
	c := warmUpWorld(t, 100*time.Millisecond, 0)
	assertEntries(t, c, "before the route", "shop/reviews:80")

	c.UpsertRoute(toV2(""))
	c.Take()
	assertEntries(t, c, "the route's first Take", "shop/reviews:80", "warm-up shop/reviews-v2:80")
	assertClusters(t, c, "shop/gw", "shop/reviews-v2:80", "shop/reviews:80")
	takeUntil(t, c, "the warm-up's end", func([]Update) bool { return slices.Equal(entries(t, c), []string{"shop/reviews-v2:80"}) })

	c.DeleteRoute(model.RouteRef{Kind: model.HTTPRoute, Key: toV2("").Key})
	c.Take()
	assertEntries(t, c, "the deletion's first Take", "shop/reviews-v2:80", "warm-up shop/reviews:80")
	assertClusters(t, c, "shop/gw", "shop/reviews-v2:80", "shop/reviews:80")
	c.Take() // the backend's grace of zero is over, its routes not
	assertClusters(t, c, "shop/gw", "shop/reviews-v2:80", "shop/reviews:80")
	takeUntil(t, c, "the deletion's warm-up's end", func(us []Update) bool {
		for _, u := range us {
			if len(u.Upserted[xdstype.Route]) > 0 {
				if slices.Contains(u.Removed[xdstype.Cluster], "shop/reviews-v2:80") {
					t.Fatal("the backend left with the routes that stopped naming it")
				}
				return true
			}
		}
		return false
	})
	assertEntries(t, c, "the deletion's warm-up's end", "shop/reviews:80")
	takeUntil(t, c, "the backend's removal", func(us []Update) bool {
		for _, u := range us {
			if slices.Contains(u.Removed[xdstype.Cluster], "shop/reviews-v2:80") {
				return true
			}
		}
		return false
	})
	assertClusters(t, c, "shop/gw", "shop/reviews:80")
}

// TestRouteWarmUpHoldsLaterEdits checks that a route edited during a
// warm-up is served only at its end, and that an edit naming another new
// cluster starts the warm-up again, adding that cluster; that a change of
// the Service itself (its endpoints) keeps the warm-up to its end; and
// that an Envoy-mode
// scope, whose proxies build clusters before routes use them, routes at
// once.
func TestRouteWarmUpHoldsLaterEdits(t *testing.T) {
	c := warmUpWorld(t, time.Hour, time.Hour)
	now := time.Now()
	c.now = func() time.Time { return now }

	c.UpsertRoute(toV2("x-canary"))
	c.Take()
	assertEntries(t, c, "the route", "shop/reviews:80", "warm-up shop/reviews-v2:80")

	c.UpsertRoute(toV2("x-other"))
	if us := c.Take(); len(us) != 1 || len(us[0].Upserted[xdstype.Route]) != 0 {
		t.Fatalf("an edit during the warm-up changed the scope's routes: %+v", us)
	}
	now = now.Add(30 * time.Minute)
	promoteReviews(c)
	assertEntries(t, c, "half-way", "shop/reviews:80", "warm-up shop/reviews-v2:80")

	c.UpsertService(service("shop", "reviews-v3", nil, "10.0.0.3"))
	c.Take()
	v3 := toV2("x-other")
	v3.Rules = append(v3.Rules, model.RouteRule{Backends: []model.RouteBackend{{Service: model.Key{Namespace: "shop", Name: "reviews-v3"}, Port: 80, Weight: 1}}})
	c.UpsertRoute(v3)
	c.Take()
	assertEntries(t, c, "a new cluster during the warm-up", "shop/reviews:80", "warm-up shop/reviews-v2:80", "warm-up shop/reviews-v3:80")

	now = now.Add(45 * time.Minute) // past the first warm-up's end, not the second's
	promoteReviews(c)
	assertEntries(t, c, "past the first end", "shop/reviews:80", "warm-up shop/reviews-v2:80", "warm-up shop/reviews-v3:80")
	now = now.Add(30 * time.Minute)
	promoteReviews(c)
	assertEntries(t, c, "past the second end", "shop/reviews-v2:80", "shop/reviews-v3:80")

	c.DeleteRoute(model.RouteRef{Kind: model.HTTPRoute, Key: v3.Key})
	c.Take()
	assertEntries(t, c, "the deletion", "shop/reviews-v2:80", "shop/reviews-v3:80", "warm-up shop/reviews:80")
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1", "10.0.0.4"))
	if us := c.Take(); len(us) != 1 || len(us[0].Upserted[xdstype.Route]) != 0 || us[0].Upserted[xdstype.Endpoint]["shop/reviews:80"] == nil {
		t.Fatalf("an endpoint change during the warm-up: %+v, want the assignment changed and the routes not", us)
	}
	assertEntries(t, c, "the Service changed", "shop/reviews-v2:80", "shop/reviews-v3:80", "warm-up shop/reviews:80")
	now = now.Add(time.Hour)
	promoteReviews(c)
	assertEntries(t, c, "the warm-up's end after the Service changed", "shop/reviews:80")

	envoy := New()
	envoy.SetRouteWarmUp(time.Hour)
	envoy.UpsertService(service("shop", "reviews", nil, "10.0.0.1"))
	envoy.UpsertService(service("shop", "reviews-v2", nil, "10.0.0.2"))
	envoy.UpsertScope(scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Names: names("reviews")}))
	envoy.Take()
	envoy.UpsertRoute(toV2(""))
	envoy.Take()
	res, _ := envoy.Resources(gwKey)
	for _, m := range res[xdstype.VirtualHost] {
		vh := m.(*routev3.VirtualHost)
		if len(vh.GetRoutes()) != 1 || vh.GetRoutes()[0].GetRoute().GetCluster() != "shop/reviews-v2:80" {
			t.Errorf("Envoy mode: virtual host %s routes %v, want every request to reviews-v2 at once", vh.GetName(), vh.GetRoutes())
		}
	}
}

// TestRouteWarmUpBackendsServedToEveryScope checks that a warm-up's older
// routes reach their backends in every scope that is served the warm-up:
// one that starts selecting the Service during it, and one whose spec is
// edited during it (both choose their backends again from scratch); and
// that a scope's edit forgets which backends were leaving.
func TestRouteWarmUpBackendsServedToEveryScope(t *testing.T) {
	c, advance := v2ToV3(t)
	all := []string{"shop/reviews-v2:80", "shop/reviews-v3:80", "shop/reviews:80"}
	assertClusters(t, c, "shop/gw", all...)

	c.UpsertScope(scope("shop", "gw2", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("reviews")}))
	c.Take()
	assertClusters(t, c, "shop/gw2", all...)
	edited := scope("shop", "gw", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("reviews")})
	edited.Generation = 2
	c.UpsertScope(edited)
	c.Take()
	assertClusters(t, c, "shop/gw", all...)

	advance(time.Hour)
	promoteReviews(c)
	c.Take()
	assertEntries(t, c, "the warm-up's end", "shop/reviews-v3:80")
	assertClusters(t, c, "shop/gw2", all...) // v2 leaves after its grace
	c.mu.Lock()
	leaving := len(c.scopes[model.Key{Namespace: "shop", Name: "gw"}].leaving)
	c.mu.Unlock()
	if leaving != 1 {
		t.Fatalf("gw has %d backends leaving after the warm-up's end, want reviews-v2", leaving)
	}
	again := scope("shop", "gw", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("reviews")})
	again.Generation = 3
	c.UpsertScope(again)
	c.mu.Lock()
	leaving = len(c.scopes[model.Key{Namespace: "shop", Name: "gw"}].leaving)
	c.mu.Unlock()
	if leaving != 0 {
		t.Errorf("gw's edit left %d backends leaving, whose grace began under its old spec", leaving)
	}
}

// TestRouteWarmUpEndsUnderChurn checks that a warm-up kept going by a
// backend re-created over and over (a new cluster name each time) keeps
// one warm-up entry, not one per name, and serves the routes within
// maxWarmUps warm-up times of its start.
func TestRouteWarmUpEndsUnderChurn(t *testing.T) {
	c := warmUpWorld(t, time.Hour, time.Hour)
	start := time.Now()
	now := start
	c.now = func() time.Time { return now }
	c.UpsertRoute(toV2(""))
	c.Take()
	for i := 1; ; i++ {
		now = now.Add(20 * time.Minute)
		v2 := service("shop", "reviews-v2", nil, "10.0.0.2")
		v2.UID = fmt.Sprint("uid-", i)
		c.UpsertService(v2)
		c.Take()
		promoteReviews(c)
		got := entries(t, c)
		if len(got) > 2 {
			t.Fatalf("re-creation %d: %d entries %q, want the Service's own and one warm-up", i, len(got), got)
		}
		if len(got) == 1 && got[0] == "shop/reviews-v2:80@uid-"+fmt.Sprint(i) {
			if took := now.Sub(start); took > maxWarmUps*time.Hour {
				t.Errorf("the routes were served %v after the warm-up began, want at most %v", took, maxWarmUps*time.Hour)
			}
			return
		}
		if now.Sub(start) > 2*maxWarmUps*time.Hour {
			t.Fatalf("the routes are still warming up %v after they changed: %q", now.Sub(start), got)
		}
	}
}

// v2ToV3 is warmUpWorld with an hour's warm-up and grace on a clock the
// test moves (advance), and shop/reviews-v3 too: its route to reviews-v2
// was served, then moved to reviews-v3, whose warm-up the scope is served.
func v2ToV3(t *testing.T) (c *Catalog, advance func(time.Duration)) {
	t.Helper()
	c = warmUpWorld(t, time.Hour, time.Hour)
	now := time.Now()
	c.now = func() time.Time { return now }
	advance = func(d time.Duration) { now = now.Add(d) }
	c.UpsertService(service("shop", "reviews-v3", nil, "10.0.0.3"))
	c.UpsertRoute(toV2(""))
	c.Take()
	advance(time.Hour)
	promoteReviews(c)
	c.Take()
	assertEntries(t, c, "the route to v2", "shop/reviews-v2:80")

	toV3 := toV2("")
	toV3.Rules[0].Backends[0].Service.Name = "reviews-v3"
	c.UpsertRoute(toV3)
	c.Take()
	assertEntries(t, c, "the route to v3", "shop/reviews-v2:80", "warm-up shop/reviews-v3:80")
	return c, advance
}

// promoteReviews ends shop/reviews's warm-up for scope gw, as its timer
// would once the catalog's clock is past its end.
func promoteReviews(c *Catalog) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.services[reviewsKey]
	c.promote(e, c.scopes[gwKey].keyOf(e))
}

// TestRouteWarmUpEndedByTheServiceLetsItsBackendsGo checks that a warm-up
// the Service's own change ends (re-created under a new UID, its route
// configuration is a new one, which nothing was routed by) lets the
// backends only its older routes reached begin to leave.
func TestRouteWarmUpEndedByTheServiceLetsItsBackendsGo(t *testing.T) {
	c, _ := v2ToV3(t)

	recreated := service("shop", "reviews", nil, "10.0.0.1")
	recreated.UID = "again"
	c.UpsertService(recreated)
	c.Take()
	assertEntries(t, c, "the Service re-created", "shop/reviews-v3:80")
	c.mu.Lock()
	_, leaving := c.scopes[gwKey].leaving[model.Key{Namespace: "shop", Name: "reviews-v2"}]
	c.mu.Unlock()
	if !leaving {
		t.Error("reviews-v2, which no route served reaches any more, is not leaving")
	}
}
