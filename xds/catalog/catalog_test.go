package catalog

import (
	"time"

	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var (
	seedFlag  = flag.Uint64("seed", 1, "seed of the randomized catalog test")
	stepsFlag = flag.Int("steps", 3000, "steps of the randomized catalog test")
)

func service(ns, name string, lbls map[string]string, addrs ...string) *model.Service {
	svc := testkit.Service(ns, name, addrs...)
	svc.Labels = lbls
	return svc
}

func scope(ns, name string, mode model.ListenerMode, sels ...model.Selection) *model.Scope {
	sc := &model.Scope{Key: model.Key{Namespace: ns, Name: name}, Protocol: model.SotW, Listener: model.Listener{Mode: mode}, Selections: sels}
	if mode == model.ListenerEnvoy {
		sc.Listener.Port = 10080
	}
	return sc
}

func names(ns ...string) map[string]struct{} {
	out := map[string]struct{}{}
	for _, n := range ns {
		out[n] = struct{}{}
	}
	return out
}

func selector(t testing.TB, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// updates indexes a Take by scope and type: scope → type → sorted names
// upserted ("+name") and removed ("-name").
func updates(us []Update) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, u := range us {
		m := map[string][]string{}
		if u.Scope == nil {
			m["deleted"] = nil
		}
		for typ, byName := range u.Upserted {
			for n := range byName {
				m[short(typ)] = append(m[short(typ)], "+"+n)
			}
		}
		for typ, ns := range u.Removed {
			for _, n := range ns {
				m[short(typ)] = append(m[short(typ)], "-"+n)
			}
		}
		for _, v := range m {
			sort.Strings(v)
		}
		out[u.Key.String()] = m
	}
	return out
}

func short[T int | xdstype.Type](t T) string { return xdstype.Type(t).String() }

func TestEndpointChangeTouchesOnlyThatLoadAssignmentInSelectingScopes(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	c.UpsertService(service("shop", "cart", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "checkout", nil, "10.0.0.2"))
	c.UpsertScope(scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Selector: labels.Everything()}))
	c.UpsertScope(scope("shop", "grpc", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("checkout")}))
	c.Take()

	c.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.3"))
	got := updates(c.Take())
	want := map[string]map[string][]string{"shop/gw": {"EDS": {"+shop/cart:80"}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("updates after an endpoint change:\n got %v\nwant %v", got, want)
	}

	c.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.3"))
	if got := c.Take(); len(got) != 0 {
		t.Errorf("an unchanged Service produced updates: %v", updates(got))
	}
}

func TestServiceAddedAndRemoved(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	c.UpsertScope(scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Selector: labels.Everything()}))
	c.UpsertScope(scope("shop", "grpc", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Selector: labels.Everything()}))
	c.UpsertScope(scope("other", "grpc", model.ListenerProxylessGRPC, model.Selection{Namespace: "other", Selector: labels.Everything()}))
	delta := scope("shop", "delta", model.ListenerEnvoy, model.Selection{Namespace: "shop", Selector: labels.Everything()})
	delta.Protocol, delta.Listener.VHDS = model.Delta, true
	c.UpsertScope(delta)
	first := c.Take()
	if len(first) != 4 {
		t.Fatalf("new empty scopes must be reported once each, got %v", updates(first))
	}
	for _, u := range first {
		if !u.Reset {
			t.Errorf("the first update of new scope %s is not a reset", u.Key)
		}
	}

	c.UpsertService(service("shop", "cart", nil, "10.0.0.1"))
	got := updates(c.Take())
	want := map[string]map[string][]string{
		"shop/gw": {"CDS": {"+shop/cart:80"}, "EDS": {"+shop/cart:80"}, "RDS": {"+http-10080"}, "VHDS": {"+http-10080/cart.shop:80"}},
		// VHDS: the route configuration stays as it was.
		"shop/delta": {"CDS": {"+shop/cart:80"}, "EDS": {"+shop/cart:80"}, "VHDS": {"+http-10080/cart.shop:80"}},
		"shop/grpc": {"CDS": {"+shop/cart:80"}, "EDS": {"+shop/cart:80"},
			"LDS": {"+cart.shop.svc.cluster.local:80", "+cart.shop:80"}, "RDS": {"+cart.shop.svc.cluster.local:80"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("updates after adding a Service:\n got %v\nwant %v", got, want)
	}

	c.DeleteService(model.Key{Namespace: "shop", Name: "cart"})
	got = updates(c.Take())
	want = map[string]map[string][]string{
		"shop/gw":    {"CDS": {"-shop/cart:80"}, "EDS": {"-shop/cart:80"}, "RDS": {"+http-10080"}, "VHDS": {"-http-10080/cart.shop:80"}},
		"shop/delta": {"CDS": {"-shop/cart:80"}, "EDS": {"-shop/cart:80"}, "VHDS": {"-http-10080/cart.shop:80"}},
		"shop/grpc": {"CDS": {"-shop/cart:80"}, "EDS": {"-shop/cart:80"},
			"LDS": {"-cart.shop.svc.cluster.local:80", "-cart.shop:80"}, "RDS": {"-cart.shop.svc.cluster.local:80"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("updates after deleting a Service:\n got %v\nwant %v", got, want)
	}
}

func TestNamespaceRelabelMovesServicesInAndOutOfScope(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	c.UpsertNamespace("team-a", map[string]string{"shared": "true"})
	c.UpsertNamespace("team-b", nil)
	c.UpsertService(service("team-a", "api", map[string]string{"tier": "shared"}, "10.0.1.1"))
	c.UpsertService(service("team-b", "api", map[string]string{"tier": "shared"}, "10.0.2.1"))
	c.UpsertService(service("team-b", "db", nil, "10.0.2.2"))
	c.UpsertScope(scope("mesh", "shared", model.ListenerProxylessGRPC,
		model.Selection{NamespaceSelector: selector(t, "shared=true"), Selector: selector(t, "tier=shared")}))
	c.UpsertScope(scope("team-b", "own", model.ListenerProxylessGRPC, model.Selection{Namespace: "team-b", Selector: labels.Everything()}))
	c.Take()
	assertClusters(t, c, "mesh/shared", "team-a/api:80")

	c.UpsertNamespace("team-b", map[string]string{"shared": "true"})
	got := updates(c.Take())
	if _, ok := got["team-b/own"]; ok || len(got) != 1 {
		t.Errorf("relabelling team-b must touch only the namespace-selecting scope, got %v", got)
	}
	assertClusters(t, c, "mesh/shared", "team-a/api:80", "team-b/api:80")

	c.DeleteNamespace("team-a")
	c.Take()
	assertClusters(t, c, "mesh/shared", "team-b/api:80")
	assertClusters(t, c, "team-b/own", "team-b/api:80", "team-b/db:80")
}

func TestScopeChangeRecomputesOnlyThatScope(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	c.UpsertService(service("shop", "cart", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "checkout", nil, "10.0.0.2"))
	c.UpsertScope(scope("shop", "a", model.ListenerEnvoy, model.Selection{Namespace: "shop", Names: names("cart")}))
	c.UpsertScope(scope("shop", "b", model.ListenerEnvoy, model.Selection{Namespace: "shop", Names: names("cart")}))
	c.Take()

	c.UpsertScope(scope("shop", "a", model.ListenerEnvoy, model.Selection{Namespace: "shop", Names: names("cart", "checkout")}))
	got := updates(c.Take())
	want := map[string]map[string][]string{
		"shop/a": {"CDS": {"+shop/checkout:80"}, "EDS": {"+shop/checkout:80"}, "RDS": {"+http-10080"}, "VHDS": {"+http-10080/checkout.shop:80"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("updates after widening scope a:\n got %v\nwant %v", got, want)
	}

	c.DeleteScope(model.Key{Namespace: "shop", Name: "a"})
	got = updates(c.Take())
	if fmt.Sprint(got) != fmt.Sprint(map[string]map[string][]string{"shop/a": {"deleted": nil}}) {
		t.Errorf("deleting scope a: got %v", got)
	}
	if _, ok := c.Resources(model.Key{Namespace: "shop", Name: "a"}); ok {
		t.Error("a deleted scope still has resources")
	}
}

// TestResolutionTravelsWithTheUpdate checks the record of inputs Take hands
// on: counts kept incrementally, missing namespaces that clear when the
// namespace appears, and a rejected spec reported with its reason.
func TestResolutionTravelsWithTheUpdate(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	key := model.Key{Namespace: "shop", Name: "gw"}
	c.UpsertNamespace("shop", nil)
	c.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.2"))
	sc := scope("shop", "gw", model.ListenerEnvoy,
		model.Selection{Namespace: "shop", Selector: labels.Everything()},
		model.Selection{Namespace: "ghost", Names: names("x")})
	sc.Generation = 3
	c.UpsertScope(sc)
	resolution := func(what string) Resolution {
		t.Helper()
		us := c.Take()
		if len(us) != 1 || us[0].Key != key {
			t.Fatalf("%s: want one update of %s, got %v", what, key, us)
		}
		return us[0].Resolution
	}
	want := Resolution{Generation: 3, SelectedServices: 1, Clusters: 1, Endpoints: 2, MissingNamespaces: []string{"ghost"}}
	if got := resolution("upsert"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the upsert: got %+v, want %+v", got, want)
	}
	c.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	c.UpsertService(service("shop", "till", nil))
	want.SelectedServices, want.Clusters, want.Endpoints = 2, 2, 3
	if got := resolution("endpoint and Service added"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after an endpoint and a Service were added: got %+v, want %+v", got, want)
	}
	c.UpsertNamespace("ghost", nil)
	want.MissingNamespaces = nil
	if got := resolution("namespace created"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the namespace appeared: got %+v, want %+v", got, want)
	}
	c.DeleteService(model.Key{Namespace: "shop", Name: "cart"})
	want.SelectedServices, want.Clusters, want.Endpoints = 1, 1, 0
	if got := resolution("Service deleted"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after a Service was deleted: got %+v, want %+v", got, want)
	}
	c.RejectScope(key, 4, "spec.services[0].selector: bad operator")
	us := c.Take()
	if len(us) != 1 || us[0].Scope != nil || fmt.Sprint(us[0].Resolution) != fmt.Sprint(Resolution{Generation: 4, Invalid: "spec.services[0].selector: bad operator"}) {
		t.Errorf("a rejected spec: got %+v", us)
	}
	if _, ok := c.Resources(key); ok {
		t.Error("a rejected scope still has resources")
	}
	// Downstream keeps a rejected scope's resolution: its deletion is
	// handed on as well.
	c.DeleteScope(key)
	if us := c.Take(); len(us) != 1 || us[0].Scope != nil || us[0].Resolution.Invalid != "" {
		t.Errorf("deleting a rejected scope: got %+v", us)
	}
}

func assertClusters(t *testing.T, c *Catalog, scope string, want ...string) {
	t.Helper()
	ns, name, _ := cut(scope)
	res, ok := c.Resources(model.Key{Namespace: ns, Name: name})
	if !ok {
		t.Fatalf("scope %s does not exist", scope)
	}
	var got []string
	for n := range res[xdstype.Cluster] {
		got = append(got, n)
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("clusters of %s: got %v, want %v", scope, got, want)
	}
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}

// TestRandomChangesMatchTranslationFromScratch drives the catalog with random
// Service, namespace and scope changes and checks, after each step, that
// every scope holds exactly what translating its selection from scratch
// gives, and that replaying the Takes downstream reproduces the same sets.
func TestRandomChangesMatchTranslationFromScratch(t *testing.T) {
	seed := *seedFlag
	rng := rand.New(rand.NewPCG(seed, 42))
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	world := map[model.Key]*model.Service{}
	nsLabels := map[string]map[string]string{}
	scopes := map[model.Key]*model.Scope{}
	mirror := map[model.Key]*Set{} // what a consumer of Take holds
	mirrorAt := map[model.Key]Placed{}
	nss := []string{"a", "b", "c"}
	modes := []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC}
	randomSelection := func() model.Selection {
		switch rng.IntN(3) {
		case 0:
			return model.Selection{Namespace: nss[rng.IntN(3)], Names: names(fmt.Sprint("s", rng.IntN(6)), fmt.Sprint("s", rng.IntN(6)))}
		case 1:
			return model.Selection{Namespace: nss[rng.IntN(3)], Selector: selector(t, fmt.Sprint("tier=t", rng.IntN(2)))}
		default:
			return model.Selection{NamespaceSelector: selector(t, fmt.Sprint("env=e", rng.IntN(2))), Selector: labels.Everything()}
		}
	}
	routes := map[model.RouteRef]*model.Route{}
	randomKey := func() model.Key {
		return model.Key{Namespace: nss[rng.IntN(3)], Name: fmt.Sprint("s", rng.IntN(6))}
	}
	steps := *stepsFlag
	for step := range steps {
		if rng.IntN(6) == 0 {
			// A mesh route: a producer route in a Service's namespace, or
			// a consumer route in the scopes' namespace x.
			ref := model.RouteRef{Kind: []model.RouteKind{model.HTTPRoute, model.GRPCRoute}[rng.IntN(2)], Key: model.Key{Namespace: []string{"a", "x"}[rng.IntN(2)], Name: fmt.Sprint("r", rng.IntN(3))}}
			if rng.IntN(3) == 0 {
				delete(routes, ref)
				c.DeleteRoute(ref)
			} else {
				r := randomRoute(rng, ref, randomKey)
				routes[ref] = r
				c.UpsertRoute(r)
			}
		}
		switch op := rng.IntN(10); {
		case op < 5:
			ns, name := nss[rng.IntN(3)], fmt.Sprint("s", rng.IntN(6))
			var addrs []string
			for i := range rng.IntN(3) {
				addrs = append(addrs, fmt.Sprintf("10.%d.0.%d", rng.IntN(2), i+1))
			}
			svc := service(ns, name, map[string]string{"tier": fmt.Sprint("t", rng.IntN(2))}, addrs...)
			svc.UID = fmt.Sprint("u", rng.IntN(2))
			if rng.IntN(3) == 0 {
				svc.Ports = append(svc.Ports, model.ServicePort{Name: "grpc", Port: 9090, Protocol: model.ProtocolTCP, AppProtocol: "grpc", TargetPort: 9090})
			}
			// Zones, and sometimes hints for them, so that place views
			// come, change and go.
			hints := rng.IntN(3) == 0
			for i := range svc.Endpoints {
				ep := &svc.Endpoints[i]
				ep.Zone = []string{"", "z0", "z1"}[rng.IntN(3)]
				if hints && ep.Zone != "" {
					ep.ForZones = []string{ep.Zone}
				}
			}
			world[svc.Key] = svc
			c.UpsertService(svc)
		case op < 6:
			k := model.Key{Namespace: nss[rng.IntN(3)], Name: fmt.Sprint("s", rng.IntN(6))}
			delete(world, k)
			c.DeleteService(k)
		case op < 8:
			ns := nss[rng.IntN(3)]
			if rng.IntN(4) == 0 {
				delete(nsLabels, ns)
				c.DeleteNamespace(ns)
			} else {
				l := map[string]string{"env": fmt.Sprint("e", rng.IntN(2))}
				nsLabels[ns] = l
				c.UpsertNamespace(ns, l)
			}
		case op < 9:
			sc := scope("x", fmt.Sprint("p", rng.IntN(3)), modes[rng.IntN(2)], randomSelection(), randomSelection())
			sc.ZonePriority = rng.IntN(2) == 0
			scopes[sc.Key] = sc
			c.UpsertScope(sc)
		default:
			k := model.Key{Namespace: "x", Name: fmt.Sprint("p", rng.IntN(3))}
			delete(scopes, k)
			c.DeleteScope(k)
		}
		if rng.IntN(3) == 0 || step == steps-1 {
			// A route backend no route reaches any more leaves a Take
			// later (see syncBackends): the second Take settles it.
			for _, u := range slices.Concat(c.Take(), c.Take()) {
				if u.Scope == nil {
					delete(mirror, u.Key)
					delete(mirrorAt, u.Key)
					continue
				}
				m := mirror[u.Key]
				if m == nil || u.Reset {
					m = &Set{}
					mirror[u.Key] = m
					mirrorAt[u.Key] = Placed{}
				}
				for place, pc := range u.Places {
					at := mirrorAt[u.Key]
					if at[place] == nil {
						at[place] = map[string]proto.Message{}
					}
					for n, r := range pc.Upserted {
						at[place][n] = r
					}
					for _, n := range pc.Removed {
						delete(at[place], n)
					}
					if len(at[place]) == 0 {
						delete(at, place)
					}
				}
				for typ, byName := range u.Upserted {
					if m[typ] == nil {
						m[typ] = map[string]proto.Message{}
					}
					for n, r := range byName {
						m[typ][n] = r
					}
				}
				for typ, ns := range u.Removed {
					for _, n := range ns {
						delete(m[typ], n)
					}
				}
			}
			for k, sc := range scopes {
				want := fromScratch(sc, world, nsLabels, routes)
				got, _ := c.Resources(k)
				if d := diff(got, want); d != "" {
					t.Fatalf("seed %d step %d: scope %s differs from a translation from scratch: %s", seed, step, k, d)
				}
				if mirror[k] == nil {
					t.Fatalf("seed %d step %d: Take never reported scope %s", seed, step, k)
				}
				if d := diff(*mirror[k], want); d != "" {
					t.Fatalf("seed %d step %d: replaying Take for scope %s differs from a translation from scratch: %s", seed, step, k, d)
				}
				wantAt := placesFromScratch(sc, world, nsLabels, routes)
				if d := diffPlaced(c.Places(k), wantAt); d != "" {
					t.Fatalf("seed %d step %d: the place views of scope %s differ from a translation from scratch: %s", seed, step, k, d)
				}
				if d := diffPlaced(mirrorAt[k], wantAt); d != "" {
					t.Fatalf("seed %d step %d: replaying Take for the place views of scope %s differs from a translation from scratch: %s", seed, step, k, d)
				}
			}
			if len(mirror) != len(scopes) {
				t.Fatalf("seed %d step %d: Take reported %d scopes, %d exist", seed, step, len(mirror), len(scopes))
			}
		}
	}
}

func selectedOf(sc *model.Scope, world map[model.Key]*model.Service, nsLabels map[string]map[string]string) []*model.Service {
	var selected []*model.Service
	for _, svc := range world {
		l, ok := nsLabels[svc.Key.Namespace]
		if sc.Selects(svc, l, ok) {
			selected = append(selected, svc)
		}
	}
	return selected
}

func placesFromScratch(sc *model.Scope, world map[model.Key]*model.Service, nsLabels map[string]map[string]string, routes map[model.RouteRef]*model.Route) Placed {
	out := Placed{}
	for _, p := range routedFromScratch(sc, world, nsLabels, routes).Places {
		out[p.Place] = map[string]proto.Message{}
		for _, cla := range p.Endpoints {
			out[p.Place][cla.GetClusterName()] = cla
		}
	}
	return out
}

func diffPlaced(got, want Placed) string {
	for place := range got {
		if _, ok := want[place]; !ok {
			return fmt.Sprintf("place %v should not be there", place)
		}
	}
	for place, w := range want {
		var g, ww Set
		g[xdstype.Endpoint], ww[xdstype.Endpoint] = got[place], w
		if d := diff(g, ww); d != "" {
			return fmt.Sprintf("at %v: %s", place, d)
		}
	}
	return ""
}

// routedFromScratch translates a scope from the whole world, mesh routes
// included, as docs/routes.md defines it: each selected Service with the
// consumer routes of the scope's namespace when there are any, else its
// producer routes; every Service those routes reach that the scope does
// not select, as a backend only. Every namespace permits every other here.
func routedFromScratch(sc *model.Scope, world map[model.Key]*model.Service, nsLabels map[string]map[string]string, routes map[model.RouteRef]*model.Route) translate.Resources {
	selected := selectedOf(sc, world, nsLabels)
	isSelected := map[model.Key]bool{}
	for _, svc := range selected {
		isSelected[svc.Key] = true
	}
	backends := map[model.Key]bool{}
	var frags []*translate.Fragment
	for _, svc := range selected {
		attached := func(ns string) []*model.Route {
			var out []*model.Route
			for _, r := range routes {
				if r.Refused != "" || r.Key.Namespace != ns {
					continue
				}
				if slices.ContainsFunc(r.Parents, func(p model.RouteParent) bool { return p.Service == svc.Key }) {
					out = append(out, r)
				}
			}
			return out
		}
		var rs []*model.Route
		if sc.Key.Namespace != svc.Key.Namespace {
			rs = attached(sc.Key.Namespace)
		}
		if len(rs) == 0 {
			rs = attached(svc.Key.Namespace)
		}
		var rt *translate.Routing
		if len(rs) > 0 {
			rt = &translate.Routing{Routes: rs, Backends: map[model.Key]*model.Service{}}
			for _, r := range rs {
				for _, rule := range r.Rules {
					for _, b := range rule.Backends {
						if w, ok := world[b.Service]; ok && b.Invalid == "" {
							rt.Backends[b.Service] = w
							if !isSelected[b.Service] {
								backends[b.Service] = true
							}
						}
					}
				}
			}
		}
		f := translate.RoutedService(svc, translate.ProfileOf(sc), rt)
		frags = append(frags, &f)
	}
	for k := range backends {
		f := translate.Service(world[k], translate.ProfileOf(sc))
		b := f.BackendPart()
		frags = append(frags, &b)
	}
	return translate.AssembleScope(sc, frags)
}

// randomRoute is a route of one to two parents and rules, each rule with
// a match and one to three weighted backends, named among the randomized
// test's Services.
func randomRoute(rng *rand.Rand, ref model.RouteRef, key func() model.Key) *model.Route {
	r := &model.Route{Key: ref.Key, Kind: ref.Kind, Created: time.Unix(int64(rng.IntN(3)), 0)}
	for range 1 + rng.IntN(2) {
		r.Parents = append(r.Parents, model.RouteParent{Service: key(), Port: []int32{0, 80, 9090}[rng.IntN(3)]})
	}
	for i := range 1 + rng.IntN(2) {
		rule := model.RouteRule{Matches: []model.RouteMatch{{PathType: model.PathPrefix, Path: fmt.Sprint("/p", i)}}}
		if ref.Kind == model.GRPCRoute {
			rule.Matches = []model.RouteMatch{{GRPC: true, GRPCService: fmt.Sprint("svc", i)}}
		}
		for range 1 + rng.IntN(3) {
			rule.Backends = append(rule.Backends, model.RouteBackend{Service: key(), Port: []int32{80, 9090}[rng.IntN(2)], Weight: int32(rng.IntN(3))})
		}
		r.Rules = append(r.Rules, rule)
	}
	if rng.IntN(8) == 0 {
		r.Refused = "refused"
	}
	return r
}

func fromScratch(sc *model.Scope, world map[model.Key]*model.Service, nsLabels map[string]map[string]string, routes map[model.RouteRef]*model.Route) Set {
	res := routedFromScratch(sc, world, nsLabels, routes)
	out := Set{}
	res.Each(func(t xdstype.Type, r proto.Message) {
		if out[t] == nil {
			out[t] = map[string]proto.Message{}
		}
		out[t][t.Info().NameOf(r)] = r
	})
	return out
}

func diff(got, want Set) string {
	for typ := range xdstype.Count {
		for n, w := range want[typ] {
			g, ok := got[typ][n]
			if !ok {
				return fmt.Sprintf("%s %s missing", short(typ), n)
			}
			if !proto.Equal(g, w) {
				return fmt.Sprintf("%s %s differs", short(typ), n)
			}
		}
		for n := range got[typ] {
			if _, ok := want[typ][n]; !ok {
				return fmt.Sprintf("%s %s should not be there", short(typ), n)
			}
		}
	}
	return ""
}

// A change of protocol starts a transition that the scope keeps through
// later edits of the same protocol; a scope without a window has none.
func TestProtocolChangeStartsATransition(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	clock := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return clock }
	sc := func(p model.Protocol, gen int64, window time.Duration) *model.Scope {
		s := scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Selector: labels.Everything()})
		s.Protocol, s.Generation, s.TransitionWindow, s.Listener.VHDS = p, gen, window, true
		return s
	}
	transition := func() *model.Transition {
		for _, u := range c.Take() {
			if u.Scope != nil {
				return u.Scope.Transition
			}
		}
		t.Fatal("no update")
		return nil
	}
	c.UpsertScope(sc(model.SotW, 1, time.Minute))
	if tr := transition(); tr != nil {
		t.Errorf("a new scope has transition %+v", tr)
	}
	c.UpsertScope(sc(model.Delta, 2, time.Minute))
	want := model.Transition{From: model.SotW, Since: clock, Until: clock.Add(time.Minute)}
	if tr := transition(); tr == nil || *tr != want {
		t.Errorf("after the switch: %+v, want %+v", tr, want)
	}
	clock = clock.Add(10 * time.Second)
	c.UpsertScope(sc(model.Delta, 3, time.Minute))
	if tr := transition(); tr == nil || *tr != want {
		t.Errorf("an edit that keeps the protocol moved the transition: %+v, want %+v", tr, want)
	}
	c.UpsertScope(sc(model.Delta, 4, 0))
	if tr := transition(); tr == nil || !tr.Until.Equal(want.Since) {
		t.Errorf("a window of 0 does not end the transition: %+v", tr)
	}
	c.UpsertScope(sc(model.SotW, 5, 0))
	if tr := transition(); tr != nil {
		t.Errorf("a switch without a window has transition %+v", tr)
	}

	// An edit after the window ended drops the transition: a Delta
	// Envoy-mode scope then fetches its virtual hosts by VHDS.
	c.UpsertScope(sc(model.Delta, 6, time.Minute))
	if tr := transition(); tr == nil {
		t.Fatal("the switch to Delta started no transition")
	}
	clock = clock.Add(2 * time.Minute)
	c.UpsertScope(sc(model.Delta, 7, time.Minute))
	for _, u := range c.Take() {
		if u.Scope == nil {
			continue
		}
		if u.Scope.Transition != nil {
			t.Errorf("an edit after the window kept the transition %+v", u.Scope.Transition)
		}
		if rc := u.Upserted[xdstype.Route]["http-10080"]; rc == nil || rc.(*routev3.RouteConfiguration).GetVhds() == nil {
			t.Errorf("the Delta scope's route configuration after the transition: %v", rc)
		}
	}
}

// A transition given with a scope (the one its status shows) is honoured
// for a scope the catalog has not seen, as after a restart; a scope the
// catalog knows keeps its own.
func TestTransitionFromTheStatusOnlyForANewScope(t *testing.T) {
	c := New()
	c.SetCrossNamespace(CrossNamespaceAllow, false) // selection itself, without consent
	clock := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return clock }
	fromStatus := model.Transition{From: model.SotW, Since: clock.Add(-time.Minute), Until: clock.Add(9 * time.Minute)}
	sc := func(gen int64, tr *model.Transition) *model.Scope {
		s := scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Selector: labels.Everything()})
		s.Protocol, s.Generation, s.TransitionWindow, s.Transition = model.Delta, gen, 10*time.Minute, tr
		return s
	}
	transition := func() *model.Transition {
		for _, u := range c.Take() {
			if u.Scope != nil {
				return u.Scope.Transition
			}
		}
		t.Fatal("no update")
		return nil
	}
	c.UpsertScope(sc(1, &fromStatus))
	if tr := transition(); tr == nil || *tr != fromStatus {
		t.Fatalf("a new scope's transition from its status: %+v, want %+v", tr, fromStatus)
	}
	// Known now: an edit carrying no transition (or another one) keeps it.
	c.UpsertScope(sc(2, nil))
	if tr := transition(); tr == nil || *tr != fromStatus {
		t.Errorf("an edit dropped the transition: %+v, want %+v", tr, fromStatus)
	}
	other := model.Transition{From: model.SotW, Since: clock, Until: clock.Add(time.Hour)}
	c.UpsertScope(sc(3, &other))
	if tr := transition(); tr == nil || *tr != fromStatus {
		t.Errorf("a known scope took a transition given with it: %+v, want %+v", tr, fromStatus)
	}

	// A scope known without a transition does not start one from its status.
	c.UpsertScope(func() *model.Scope { s := sc(1, nil); s.Key.Name = "plain"; return s }())
	c.Take()
	c.UpsertScope(func() *model.Scope { s := sc(2, &other); s.Key.Name = "plain"; return s }())
	if tr := transition(); tr != nil {
		t.Errorf("a known scope without a transition took one from its status: %+v", tr)
	}
}

// TestCrossNamespaceNeedsConsent checks that a Service of another namespace
// is served only while its namespace grants it to the scope's namespace, by
// name or all of them, and that the refusal is reported per namespace a
// selection names, the same whether it exists or not, and never for a
// namespace only a namespaceSelector reaches: the resolution must not tell
// which namespaces exist or hold matching Services.
func TestCrossNamespaceNeedsConsent(t *testing.T) {
	c := New()
	for _, ns := range []string{"mesh", "team-a", "team-b"} {
		c.UpsertNamespace(ns, nil)
	}
	c.UpsertService(service("mesh", "own", nil))
	c.UpsertService(service("team-a", "api", nil))
	c.UpsertService(service("team-a", "db", nil))
	c.UpsertService(service("team-b", "api", nil))
	c.UpsertScope(scope("mesh", "gw", model.ListenerEnvoy,
		model.Selection{Namespace: "mesh", Selector: labels.Everything()},
		model.Selection{NamespaceSelector: labels.Everything(), Names: names("api", "db")},
		model.Selection{Namespace: "team-b", Names: names("api")},
		model.Selection{Namespace: "nowhere", Names: names("api")}))
	refused := func(what string, want ...string) {
		t.Helper()
		us := c.Take()
		if len(us) != 1 {
			t.Fatalf("%s: want one update, got %d", what, len(us))
		}
		if got := us[0].Resolution.RefusedNamespaces; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: refused namespaces %v, want %v", what, got, want)
		}
		if got := us[0].Resolution.MissingNamespaces; len(got) != 0 {
			t.Errorf("%s: missing namespaces %v reported for namespaces without consent", what, got)
		}
		if got := us[0].Resolution.SelectedServices; got != len(c.scopes[model.Key{Namespace: "mesh", Name: "gw"}].services) {
			t.Errorf("%s: %d Services counted, %d served", what, got, len(c.scopes[model.Key{Namespace: "mesh", Name: "gw"}].services))
		}
	}
	// team-b and nowhere are named (one exists, one does not: the same
	// refusal); team-a, reached by the namespaceSelector only, is not told.
	assertClusters(t, c, "mesh/gw", "mesh/own:80")
	refused("no grant", "nowhere", "team-b")

	c.SetGrants("team-a", model.Grants{"mesh": names("api")})
	assertClusters(t, c, "mesh/gw", "mesh/own:80", "team-a/api:80")
	refused("team-a grants api", "nowhere", "team-b")

	c.SetGrants("team-a", model.Grants{"mesh": nil})
	c.SetGrants("team-b", model.Grants{"elsewhere": nil})
	assertClusters(t, c, "mesh/gw", "mesh/own:80", "team-a/api:80", "team-a/db:80")
	refused("team-a grants all, team-b another namespace", "nowhere", "team-b")

	c.SetGrants("team-b", model.Grants{"mesh": names("db")})
	assertClusters(t, c, "mesh/gw", "mesh/own:80", "team-a/api:80", "team-a/db:80")
	refused("team-b grants db, which is not selected there", "nowhere", "team-b")

	c.SetGrants("team-a", nil)
	c.SetGrants("team-b", nil)
	assertClusters(t, c, "mesh/gw", "mesh/own:80")
	refused("revoked", "nowhere", "team-b")

	c.SetCrossNamespace(CrossNamespaceAllow, false)
	c.UpsertScope(scope("mesh", "all", model.ListenerEnvoy, model.Selection{Namespace: "team-b", Selector: labels.Everything()}))
	assertClusters(t, c, "mesh/all", "team-b/api:80")
}

// A Service removed from a ProxylessGRPC scope by one edit of the scope and
// added back by another returns with listeners, route configurations and
// clusters that differ from every copy served before: grpc-js-xds and C-core ignore
// a resource identical to the one they cached before its removal. The
// scope's generation (the epoch) marks them, so a replica that never saw
// the removal builds the same bytes; and a change of the Service's
// endpoints leaves them as they are.
func TestReaddedServiceDiffersFromBeforeItsRemoval(t *testing.T) {
	mo := proto.MarshalOptions{Deterministic: true}
	held := func(c *Catalog) map[string][]byte {
		t.Helper()
		res, ok := c.Resources(model.Key{Namespace: "shop", Name: "grpc"})
		if !ok {
			t.Fatal("no scope shop/grpc")
		}
		out := map[string][]byte{}
		for _, typ := range []xdstype.Type{xdstype.Listener, xdstype.Route, xdstype.Cluster} {
			for name, m := range res[typ] {
				b, err := mo.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				out[typ.String()+" "+name] = b
			}
		}
		return out
	}
	edit := func(c *Catalog, gen int64, svc ...string) {
		sc := scope("shop", "grpc", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names(svc...)})
		sc.Generation = gen
		c.UpsertScope(sc)
		c.Take()
	}
	c := New()
	c.UpsertService(service("shop", "cart", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "other", nil, "10.0.0.2"))
	edit(c, 1, "cart", "other")
	before := held(c)

	c.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.3"))
	c.Take()
	if after := held(c); !reflect.DeepEqual(before, after) {
		t.Error("an endpoint change changed listeners, route configurations or clusters")
	}

	edit(c, 2, "other")
	edit(c, 3, "cart", "other")
	readded := held(c)
	for _, name := range []string{"LDS cart.shop.svc.cluster.local:80", "LDS cart.shop:80", "RDS cart.shop.svc.cluster.local:80", "CDS shop/cart:80"} {
		switch {
		case readded[name] == nil:
			t.Errorf("%s: not held after the re-add", name)
		case bytes.Equal(readded[name], before[name]):
			t.Errorf("%s: re-added byte-identical to the copy served before its removal", name)
		}
	}

	// A replica that starts at generation 3 builds the same bytes.
	fresh := New()
	fresh.UpsertService(service("shop", "cart", nil, "10.0.0.1", "10.0.0.3"))
	fresh.UpsertService(service("shop", "other", nil, "10.0.0.2"))
	edit(fresh, 3, "cart", "other")
	if got := held(fresh); !reflect.DeepEqual(got, readded) {
		t.Error("a replica that never saw the removal holds other listeners, route configurations or clusters")
	}
}

// TestRouteBackendsNeedConsent checks that a route's backend in another
// namespace is served only while that namespace's ReferenceGrant permits
// the route's kind and namespace, that the scope's resolution counts the
// route and the backend, and that a refused route is named.
func TestRouteBackendsNeedConsent(t *testing.T) {
	c := New()
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1"))
	c.UpsertService(service("labs", "reviews-next", nil, "10.0.0.2"))
	c.UpsertScope(scope("shop", "gw", model.ListenerProxylessGRPC, model.Selection{Namespace: "shop", Names: names("reviews")}))
	c.Take()
	route := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "canary"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: model.Key{Namespace: "shop", Name: "reviews"}}},
		Rules: []model.RouteRule{{Backends: []model.RouteBackend{
			{Service: model.Key{Namespace: "shop", Name: "reviews"}, Port: 80, Weight: 9},
			{Service: model.Key{Namespace: "labs", Name: "reviews-next"}, Port: 80, Weight: 1},
		}}},
	}
	c.UpsertRoute(route)
	c.Take()
	assertClusters(t, c, "shop/gw", "shop/reviews:80")
	key := model.Key{Namespace: "shop", Name: "gw"}

	grant := map[model.RouteKind]model.Grants{model.HTTPRoute: {"shop": nil}}
	c.SetRouteGrants("labs", grant)
	us := c.Take()
	assertClusters(t, c, "shop/gw", "labs/reviews-next:80", "shop/reviews:80")
	if len(us) != 1 || us[0].Resolution.Routes != 1 || us[0].Resolution.RouteBackends != 1 {
		t.Fatalf("resolution %+v, want one route and one backend", us)
	}

	// A grant to another kind permits nothing.
	c.SetRouteGrants("labs", map[model.RouteKind]model.Grants{model.GRPCRoute: {"shop": nil}})
	c.Take()
	assertClusters(t, c, "shop/gw", "shop/reviews:80")

	refused := *route
	refused.Refused = "rule 0: bad"
	c.UpsertRoute(&refused)
	us = c.Take()
	if len(us) != 1 || us[0].Resolution.Routes != 0 || !slices.Equal(us[0].Resolution.RoutesNotAccepted, []string{"HTTPRoute shop/canary: rule 0: bad"}) {
		t.Fatalf("resolution %+v, want the refused route named", us)
	}
	if _, ok := c.Resources(key); !ok {
		t.Fatal("the scope is gone")
	}
}

// TestMirrorBackendIsServed checks that the backend of a rule's
// RequestMirror is served to the scopes of the route's parent, as its
// other backends are: its cluster and assignment while the mirror exists,
// its endpoint changes reaching those scopes, and nothing of it after the
// mirror is removed.
func TestMirrorBackendIsServed(t *testing.T) {
	c := New()
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "audit", nil, "10.0.0.9"))
	c.UpsertScope(scope("shop", "gw", model.ListenerEnvoy, model.Selection{Namespace: "shop", Names: names("reviews")}))
	c.Take()
	reviews := model.Key{Namespace: "shop", Name: "reviews"}
	route := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "shadow"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: reviews}},
		Rules: []model.RouteRule{{
			Backends: []model.RouteBackend{{Service: reviews, Port: 80, Weight: 1}},
			Mirrors:  []model.RouteMirror{{Backend: model.RouteBackend{Service: model.Key{Namespace: "shop", Name: "audit"}, Port: 80, Weight: 1}, Numerator: 1, Denominator: 1}},
		}},
	}
	c.UpsertRoute(route)
	us := c.Take()
	assertClusters(t, c, "shop/gw", "shop/audit:80", "shop/reviews:80")
	if len(us) != 1 || us[0].Resolution.RouteBackends != 1 {
		t.Fatalf("updates %+v, want the scope's, with the mirror's backend counted", us)
	}
	res, _ := c.Resources(model.Key{Namespace: "shop", Name: "gw"})
	if _, ok := res[xdstype.Endpoint]["shop/audit:80"]; !ok {
		t.Error("the mirror's backend has no assignment in the scope")
	}

	c.UpsertService(service("shop", "audit", nil, "10.0.0.9", "10.0.0.10"))
	if us := c.Take(); len(us) != 1 || us[0].Upserted[xdstype.Endpoint]["shop/audit:80"] == nil {
		t.Errorf("the mirror backend's endpoint change: updates %+v, want the scope's assignment", us)
	}

	plain := *route
	plain.Rules = []model.RouteRule{{Backends: route.Rules[0].Backends}}
	c.UpsertRoute(&plain)
	c.Take()
	assertClusters(t, c, "shop/gw", "shop/reviews:80")
}

// canaryGone is a scope of Service shop/reviews in mode, whose canary
// route to shop/reviews-v2 (which the scope does not select) was served
// and is then deleted, with the catalog's backend grace: what the tests
// of a leaving backend start from.
func canaryGone(t *testing.T, mode model.ListenerMode, grace time.Duration) *Catalog {
	t.Helper()
	c := New()
	c.SetBackendGrace(grace)
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1"))
	c.UpsertService(service("shop", "reviews-v2", nil, "10.0.0.2"))
	c.UpsertScope(scope("shop", "gw", mode, model.Selection{Namespace: "shop", Names: names("reviews")}))
	reviews := model.Key{Namespace: "shop", Name: "reviews"}
	route := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "canary"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: reviews}},
		Rules: []model.RouteRule{{Backends: []model.RouteBackend{
			{Service: reviews, Port: 80, Weight: 9}, {Service: model.Key{Namespace: "shop", Name: "reviews-v2"}, Port: 80, Weight: 1},
		}}},
	}
	c.UpsertRoute(route)
	c.Take()
	assertClusters(t, c, "shop/gw", "shop/reviews-v2:80", "shop/reviews:80")
	c.DeleteRoute(model.RouteRef{Kind: model.HTTPRoute, Key: route.Key})
	return c
}

// TestLeavingBackendGoesATakeAfterItsRoutes checks that a route backend no
// route reaches any more is removed from the scope one Take after the
// routes that stopped naming it changed, not with them: a proxy is pushed
// the routes, answers, and only then is pushed the clusters' removal.
func TestLeavingBackendGoesATakeAfterItsRoutes(t *testing.T) {
	c := canaryGone(t, model.ListenerProxylessGRPC, 0)
	removed := func(us []Update) (routes, clusters int) {
		for _, u := range us {
			routes += len(u.Upserted[xdstype.Route])
			for _, n := range u.Removed[xdstype.Cluster] {
				if strings.Contains(n, "reviews-v2") {
					clusters++
				}
			}
		}
		return routes, clusters
	}
	if r, cl := removed(c.Take()); r != 1 || cl != 0 {
		t.Fatalf("the route's deletion: %d route configurations changed and %d of reviews-v2's clusters removed, want 1 and none yet", r, cl)
	}
	if r, cl := removed(c.Take()); r != 0 || cl != 1 {
		t.Fatalf("the next Take: %d route configurations changed and %d of reviews-v2's clusters removed, want none and 1", r, cl)
	}
	if us := c.Take(); len(us) != 0 {
		t.Errorf("a third Take has %d updates, want none", len(us))
	}
}

// TestLeavingBackendStaysForItsGrace checks that with a grace, a route
// backend no route reaches any more is still served by the Takes within
// it, and that the catalog signals a change once it is over, whose Take
// removes it.
func TestLeavingBackendStaysForItsGrace(t *testing.T) {
	c := canaryGone(t, model.ListenerEnvoy, 200*time.Millisecond)
	start := time.Now()
	c.Take()
	c.Take()
	if time.Since(start) < 200*time.Millisecond {
		assertClusters(t, c, "shop/gw", "shop/reviews-v2:80", "shop/reviews:80")
	}
	// Changed may hold a signal of the Takes above: wait for the Take that
	// removes the backend, which only the grace's end can bring.
	deadline := time.After(testkit.Timeout)
	for removed := false; !removed; {
		select {
		case <-c.Changed():
		case <-deadline:
			t.Fatalf("no Take removed the backend within %v", testkit.Timeout)
		}
		for _, u := range c.Take() {
			removed = removed || slices.Contains(u.Removed[xdstype.Cluster], "shop/reviews-v2:80")
		}
	}
	assertClusters(t, c, "shop/gw", "shop/reviews:80")
}

// TestLeavingBackendDeletedLeavesNothingBehind checks that a leaving
// backend whose Service is deleted during its grace is forgotten: the scope
// settles, and further changes elsewhere do not keep marking it changed.
func TestLeavingBackendDeletedLeavesNothingBehind(t *testing.T) {
	c := canaryGone(t, model.ListenerEnvoy, time.Hour)
	c.Take()
	c.DeleteService(model.Key{Namespace: "shop", Name: "reviews-v2"})
	c.Take()
	assertClusters(t, c, "shop/gw", "shop/reviews:80")
	c.UpsertService(service("shop", "other", nil, "10.0.0.3"))
	if us := c.Take(); len(us) != 0 {
		t.Errorf("a Service the scope does not select marked it changed: %d updates", len(us))
	}
}

// TestLeavingBackendSettlesAtItsGraceEnd checks that a scope with a
// backend leaving does not settle its backends again at each Take of its
// grace (a walk of its routed Services each time), only when the grace
// ends or its routes change.
func TestLeavingBackendSettlesAtItsGraceEnd(t *testing.T) {
	c := canaryGone(t, model.ListenerEnvoy, time.Hour)
	c.Take()
	c.UpsertService(service("shop", "reviews", nil, "10.0.0.1", "10.0.0.5"))
	c.Take()
	c.mu.Lock()
	defer c.mu.Unlock()
	sc := c.scopes[model.Key{Namespace: "shop", Name: "gw"}]
	if len(sc.leaving) != 1 {
		t.Fatalf("%d backends leaving, want reviews-v2", len(sc.leaving))
	}
	if sc.backendsStale {
		t.Error("the scope settles its backends again at every Take of the grace")
	}
}
