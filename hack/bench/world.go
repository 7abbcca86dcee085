package main

import (
	"fmt"
	"hash/maphash"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The shape of the benchmark world, fixed so that every run measures the
// same thing: Services of one HTTP port and three endpoints each, one per
// zone of three, spread over twenty namespaces; in the scoped layout twenty
// scopes select fifty Services each (Services of other namespaces and the
// rest of their own are in no scope); in the unscoped and zoned layouts one
// scope selects every Service. In the zoned layout every Service asks for
// trafficDistribution: PreferClose and each endpoint is hinted for its own
// zone, as the EndpointSlice controller does, and the proxies run in the
// three zones in turn. All scopes use the Envoy listener mode, so the four
// types flow.
const (
	numNamespaces = 20
	numScopes     = 20
	perScope      = 50
	endpointsPer  = 3
	numZones      = endpointsPer
	listenerPort  = 10080
	drainServices = 100
	// churnServices is how many Services a churn moves endpoints of, in
	// turn: each changes every churnServices-th change, so at 50 changes a
	// second one is changed again 200 ms later and a slow push is
	// superseded rather than queued.
	churnServices = 10
	scopeLabel    = "bench.scopeplane.dev/scope"
)

// Layout is how scopes select Services.
type Layout string

// The layouts of the benchmark.
const (
	Unscoped Layout = "unscoped"
	Scoped   Layout = "scoped"
	// Zoned is the unscoped layout with topology-aware routing: what it
	// costs over Unscoped is the price of per-zone views.
	Zoned Layout = "zoned"
)

// Event names, as the driver sends them to the control-plane process.
const (
	EvEndpoint  = "endpoint"
	EvDrain     = "drain"
	EvAddRemove = "addremove"
	// EvReconnect is no change: every proxy's stream breaks and reopens
	// (the driver's alone; the control plane is not told).
	EvReconnect = "reconnect"
	// EvChurn is one change of a sustained churn: EvEndpoint's change, of
	// the next of the first churnServices Services in turn.
	EvChurn = "churn"
	// EvRouteWeights moves the weights of one mesh route's canary, route
	// 0's: 90/10 becomes 50/50, and back at the next such event.
	EvRouteWeights = "routeweights"
)

// WorldParams determine a world completely: two processes that build a world
// from the same parameters and apply the same events hold equal worlds.
type WorldParams struct {
	Services int
	Layout   Layout
	Protocol model.Protocol
	// Routes is how many Services have a mesh route (see routeFor).
	Routes int
}

// World is the model the control plane serves and the driver checks against.
type World struct {
	P        WorldParams
	Services map[model.Key]*model.Service
	// Routes are the mesh routes, by the Service each attaches to.
	Routes map[model.Key]*model.Route
	Scopes []*model.Scope
	// Applied are the events applied so far, in order.
	Applied []string
}

// NewWorld builds the initial world. Its scopes ask for VHDS
// (spec.listener.virtualHosts), so Delta proxies fetch virtual hosts one by
// one and a SotW scope prices Delta that way.
func NewWorld(p WorldParams) *World {
	w := &World{P: p, Services: make(map[model.Key]*model.Service, p.Services), Routes: map[model.Key]*model.Route{}}
	for i := range p.Services {
		svc := w.makeService(fmt.Sprint("ns-", i%numNamespaces), fmt.Sprint("svc-", i), i, memberOf(p, i))
		w.Services[svc.Key] = svc
	}
	for i := range min(p.Routes, p.Services) {
		r := routeFor(p, i, 90)
		w.Routes[r.Parents[0].Service] = r
	}
	switch p.Layout {
	case Scoped:
		for k := range numScopes {
			w.Scopes = append(w.Scopes, &model.Scope{
				Key:        model.Key{Namespace: fmt.Sprint("ns-", k), Name: fmt.Sprint("scope-", k)},
				Generation: 1,
				Protocol:   p.Protocol,
				Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: listenerPort, VHDS: true},
				Selections: []model.Selection{{
					Namespace: fmt.Sprint("ns-", k),
					Selector:  labels.SelectorFromSet(labels.Set{scopeLabel: fmt.Sprint("scope-", k)}),
				}},
			})
		}
	default:
		sel := make([]model.Selection, numNamespaces)
		for j := range sel {
			sel[j] = model.Selection{Namespace: fmt.Sprint("ns-", j)}
		}
		w.Scopes = []*model.Scope{{
			Key:        model.Key{Namespace: "ns-0", Name: "all"},
			Generation: 1,
			Protocol:   p.Protocol,
			Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: listenerPort, VHDS: true},
			Selections: sel,
		}}
	}
	return w
}

// routeFor is the mesh route of Service i, a canary: an HTTPRoute in its
// namespace that sends v of every hundred requests to the Service itself
// and the rest to the next Service of its namespace (the first, for the
// last), on port 80.
func routeFor(p WorldParams, i int, v int32) *model.Route {
	ns := fmt.Sprint("ns-", i%numNamespaces)
	next := i + numNamespaces
	if next >= p.Services {
		next = i % numNamespaces
	}
	self := model.Key{Namespace: ns, Name: fmt.Sprint("svc-", i)}
	return &model.Route{
		Key: model.Key{Namespace: ns, Name: fmt.Sprint("route-", i)}, Kind: model.HTTPRoute, Generation: 1,
		Parents: []model.RouteParent{{Service: self}},
		Rules: []model.RouteRule{{Backends: []model.RouteBackend{
			{Service: self, Port: 80, Weight: v},
			{Service: model.Key{Namespace: ns, Name: fmt.Sprint("svc-", next)}, Port: 80, Weight: 100 - v},
		}}},
	}
}

// memberOf returns the scope that selects Service i in the scoped layout, or
// -1: Service i is in scope i%20 when it is among the first fifty there.
func memberOf(p WorldParams, i int) int {
	if p.Layout != Scoped || i/numScopes >= perScope {
		return -1
	}
	return i % numScopes
}

// selectedIndexes returns the indexes of the Services that scopes select in
// the scoped layout, fifty per scope, ordered round-robin over the scopes:
// the first hundred are the Services a draining node hosts, five per scope.
func selectedIndexes(p WorldParams) []int {
	var out []int
	for m := range perScope {
		for k := range numScopes {
			if i := k + numScopes*m; i < p.Services {
				out = append(out, i)
			}
		}
	}
	return out
}

func endpointAddress(n int) string {
	return fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255)
}

func (w *World) makeService(ns, name string, idx, scope int) *model.Service {
	svc := &model.Service{
		Key:   model.Key{Namespace: ns, Name: name},
		Ports: []model.ServicePort{{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPort: 8080}},
	}
	if scope >= 0 {
		svc.Labels = map[string]string{scopeLabel: fmt.Sprint("scope-", scope)}
	}
	zoned := w.P.Layout == Zoned
	if zoned {
		svc.TrafficDistribution = "PreferClose"
	}
	for e := range endpointsPer {
		n := idx*4 + e + 1
		ep := model.Endpoint{
			Address: endpointAddress(n),
			Family:  model.IPv4,
			Ports:   []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}},
			Ready:   true,
			Serving: true,
			Zone:    zoneName(e),
			Node:    fmt.Sprint("node-", n%500),
		}
		if zoned {
			ep.ForZones = []string{ep.Zone}
		}
		svc.Endpoints = append(svc.Endpoints, ep)
	}
	return svc
}

func zoneName(i int) string { return fmt.Sprintf("zone-%c", 'a'+i) }

// View is what one group of proxies must hold: a scope as seen from a
// location.
type View struct {
	Scope int
	Loc   model.Location
}

// Views lists the world's views; proxy i holds view i modulo their number.
// In the zoned layout they are the scope from each zone; otherwise each
// scope from nowhere in particular.
func (w *World) Views() []View {
	var out []View
	for s := range w.Scopes {
		if w.P.Layout != Zoned {
			out = append(out, View{Scope: s})
			continue
		}
		for z := range numZones {
			out = append(out, View{Scope: s, Loc: model.Location{Zone: zoneName(z)}})
		}
	}
	return out
}

// churnKey names Service k, which a churn changes when k < churnServices.
func churnKey(k int) model.Key {
	return model.Key{Namespace: fmt.Sprint("ns-", k%numNamespaces), Name: fmt.Sprint("svc-", k)}
}

// clone copies a Service deeply enough to change its endpoints: the catalog
// compares a new Service with the one it holds, so an event must never
// modify a Service in place.
func clone(svc *model.Service) *model.Service {
	c := *svc
	c.Endpoints = slices.Clone(svc.Endpoints)
	return &c
}

// Change is what an event did to the world, as a control plane ingests it.
type Change struct {
	Upserted []*model.Service
	Deleted  []model.Key
	Routes   []*model.Route
}

// Apply applies one event and returns what changed. Each event is a
// deterministic function of the world and the number of events before it.
func (w *World) Apply(ev string) (Change, error) {
	seq := len(w.Applied)
	var ch Change
	switch ev {
	case EvEndpoint, EvChurn:
		// One endpoint of a Service every layout selects moves to a new
		// address, as when a pod is replaced: svc-0 (scope 0's first) for
		// EvEndpoint, svc-k for the k-th change of a churn modulo
		// churnServices (in scope k when scoped).
		key := churnKey(0)
		if ev == EvChurn {
			key = churnKey(seq % churnServices)
		}
		svc := w.Services[key]
		if svc == nil {
			return ch, fmt.Errorf("event %s: %s is gone", ev, key)
		}
		svc = clone(svc)
		svc.Endpoints[1].Address = fmt.Sprintf("10.250.%d.%d", seq/250%256, seq%250+1)
		ch.Upserted = append(ch.Upserted, svc)
	case EvDrain:
		// A node drains: one endpoint of each of up to 100 selected Services
		// is no longer ready nor serving, and leaves the assignment.
		idx := selectedIndexes(w.P)
		for _, i := range idx[:min(drainServices, len(idx))] {
			svc := w.Services[model.Key{Namespace: fmt.Sprint("ns-", i%numNamespaces), Name: fmt.Sprint("svc-", i)}]
			if svc == nil {
				continue
			}
			svc = clone(svc)
			svc.Endpoints[0].Ready, svc.Endpoints[0].Serving, svc.Endpoints[0].Terminating = false, false, true
			ch.Upserted = append(ch.Upserted, svc)
		}
	case EvAddRemove:
		// A Service appears in scope 0 and another leaves scope 1.
		scope := -1
		if w.P.Layout == Scoped {
			scope = 0
		}
		ch.Upserted = append(ch.Upserted, w.makeService("ns-0", fmt.Sprint("svc-new-", seq), w.P.Services+seq, scope))
		ch.Deleted = append(ch.Deleted, model.Key{Namespace: "ns-1", Name: "svc-21"})
	case EvRouteWeights:
		r := w.Routes[churnKey(0)]
		if r == nil {
			return ch, fmt.Errorf("event %s: the world has no routes", ev)
		}
		v := int32(50)
		if r.Rules[0].Backends[0].Weight == 50 {
			v = 90
		}
		ch.Routes = append(ch.Routes, routeFor(w.P, 0, v))
	default:
		return ch, fmt.Errorf("unknown event %q", ev)
	}
	for _, svc := range ch.Upserted {
		w.Services[svc.Key] = svc
	}
	for _, k := range ch.Deleted {
		delete(w.Services, k)
	}
	for _, r := range ch.Routes {
		w.Routes[r.Parents[0].Service] = r
	}
	w.Applied = append(w.Applied, ev)
	return ch, nil
}

// copy returns a copy of the world that later events do not change: the
// Services themselves are never modified in place.
func (w *World) copy() *World {
	c := *w
	c.Services = maps.Clone(w.Services)
	c.Routes = maps.Clone(w.Routes)
	c.Applied = slices.Clone(w.Applied)
	return &c
}

// Selected returns the Services a scope selects, sorted by key.
func (w *World) Selected(sc *model.Scope) []*model.Service {
	var out []*model.Service
	for _, k := range slices.SortedFunc(maps.Keys(w.Services), model.Key.Compare) {
		if svc := w.Services[k]; sc.Selects(svc, nil, false) {
			out = append(out, svc)
		}
	}
	return out
}

// digestSeed is shared by the truth and the proxies' bookkeeping; both live
// in the driver process.
var digestSeed = maphash.MakeSeed()

func digest(b []byte) uint64 { return maphash.Bytes(digestSeed, b) }

// Res is one resource of the truth: its deterministic encoding.
type Res struct {
	Body   []byte
	Digest uint64
}

// Truth is what every proxy of a scope must hold: type → name → resource.
type Truth [xdstype.Count]map[string]Res

// Truth translates a view's scope from scratch with xds/translate,
// independently of any control plane's incremental state: what a proxy of
// the scope's protocol at the view's location holds, so in SotW no
// VirtualHost resource (Envoy reads VHDS over delta only; a SotW route
// configuration carries them inline).
func (w *World) Truth(v View) (*Truth, error) {
	sc := w.Scopes[v.Scope]
	return truthOf(w.Translate(sc), sc, v.Loc)
}

// Translate translates a scope from scratch, its Services' mesh routes
// included: every backend the routes name is a Service the scope selects
// (a route stays in its Service's namespace, which the scope selects
// whole), so none is served as a backend only.
func (w *World) Translate(sc *model.Scope) translate.Resources {
	svcs := w.Selected(sc)
	frags := make([]*translate.Fragment, len(svcs))
	for i, svc := range svcs {
		var rt *translate.Routing
		if r := w.Routes[svc.Key]; r != nil {
			rt = &translate.Routing{Routes: []*model.Route{r}, Backends: map[model.Key]*model.Service{}}
			for _, b := range r.Rules[0].Backends {
				if bs := w.Services[b.Service]; bs != nil {
					rt.Backends[b.Service] = bs
				}
			}
		}
		f := translate.RoutedService(svc, translate.ProfileOf(sc), rt)
		frags[i] = &f
	}
	return translate.AssembleScope(sc, frags)
}

// Assignments returns the ClusterLoadAssignments a view's scope serves for
// svc alone, as the truth holds them: an assignment depends on its Service
// only, so a churn's driver can follow each change without translating the
// whole scope (the driver checks the last ones against the truth).
func (w *World) Assignments(v View, svc *model.Service) (map[string]Res, error) {
	sc := w.Scopes[v.Scope]
	if !sc.Selects(svc, nil, false) {
		return nil, nil
	}
	tr, err := truthOf(translate.Translate(sc, []*model.Service{svc}), sc, v.Loc)
	if err != nil {
		return nil, err
	}
	return tr[xdstype.Endpoint], nil
}

// truthOf is what a scope's proxies at loc hold of its resources all.
func truthOf(all translate.Resources, sc *model.Scope, loc model.Location) (*Truth, error) {
	r := all.Seen(loc)
	var tr Truth
	for t := range tr {
		tr[t] = map[string]Res{}
	}
	opts := proto.MarshalOptions{Deterministic: true}
	var err error
	r.Each(func(t xdstype.Type, m proto.Message) {
		if !speaks(sc.Protocol, t) {
			return
		}
		b, merr := opts.Marshal(m)
		if merr != nil {
			err = merr
			return
		}
		tr[t][t.Info().NameOf(m)] = Res{Body: b, Digest: digest(b)}
	})
	if err != nil {
		return nil, err
	}
	return &tr, nil
}

// speaks reports whether a proxy of protocol p subscribes to type t.
func speaks(p model.Protocol, t xdstype.Type) bool {
	return p == model.Delta || !t.Info().DeltaOnly
}

// typesOf returns the types a proxy of protocol p subscribes to, as the
// bit set arm takes and as type URLs.
func typesOf(p model.Protocol) (mask uint8, urls []string) {
	for t := range xdstype.Count {
		if speaks(p, t) {
			mask |= 1 << t
			urls = append(urls, t.URL())
		}
	}
	return mask, urls
}

// Size is the number of resources in the truth.
func (tr *Truth) Size() int {
	n := 0
	for _, m := range tr {
		n += len(m)
	}
	return n
}

// ResChange is one resource that differs between two truths.
type ResChange struct {
	T       xdstype.Type
	Name    string
	Present bool // false: removed
	Digest  uint64
}

// Diff returns what changed from old (nil: nothing) to next.
func Diff(old, next *Truth) []ResChange {
	var out []ResChange
	for t := range xdstype.Count {
		var prev map[string]Res
		if old != nil {
			prev = old[t]
		}
		for name, r := range next[t] {
			if p, ok := prev[name]; !ok || p.Digest != r.Digest {
				out = append(out, ResChange{T: t, Name: name, Present: true, Digest: r.Digest})
			}
		}
		for name := range prev {
			if _, ok := next[t][name]; !ok {
				out = append(out, ResChange{T: t, Name: name})
			}
		}
	}
	return out
}
