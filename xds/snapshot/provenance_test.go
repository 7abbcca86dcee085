package snapshot

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestResourcesCarryTheServiceTheyCameFrom drives a real catalog through
// Services added, changed (endpoints moving between zones and Nodes, so
// that place views come and go; clusters that change under unchanged
// assignments, which re-versions them) and deleted, for an Envoy-mode scope
// and a ProxylessGRPC one, and checks after every build that every resource
// the snapshot serves, from every location, carries the Service port that
// a translation from scratch gives it, and the scope's own listener and
// route configuration none: what the status sums per Service and the
// server counts as a Service's asks, without reading names.
func TestResourcesCarryTheServiceTheyCameFrom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	cat := catalog.New()
	store := NewStore()
	b := NewBuilder(cat, store, 0)
	selection := []model.Selection{{Namespace: "shop"}}
	scopes := []*model.Scope{
		{Key: model.Key{Namespace: "shop", Name: "edge"}, Protocol: model.Delta, Selections: selection,
			Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080}},
		{Key: model.Key{Namespace: "shop", Name: "mesh"}, Protocol: model.SotW, Selections: selection, ZonePriority: true,
			Listener: model.Listener{Mode: model.ListenerProxylessGRPC}},
	}
	for _, sc := range scopes {
		cat.UpsertScope(sc)
	}
	services := map[model.Key]*model.Service{}
	placed, own := 0, 0
	for step := range 150 {
		switch op := rng.IntN(10); {
		case op < 6:
			svc := randomService(rng)
			svc.UID = fmt.Sprint("uid-", step)
			services[svc.Key] = svc
			cat.UpsertService(svc)
		case op < 8:
			// Another cluster, the same endpoints.
			for _, k := range slices.SortedFunc(maps.Keys(services), model.Key.Compare) {
				svc := *services[k]
				svc.Ports = []model.ServicePort{svc.Ports[0]}
				svc.Ports[0].AppProtocol = map[string]string{"": "grpc", "grpc": ""}[svc.Ports[0].AppProtocol]
				services[k] = &svc
				cat.UpsertService(&svc)
				break
			}
		default:
			k := model.Key{Namespace: "shop", Name: fmt.Sprint("s", rng.IntN(6))}
			delete(services, k)
			cat.DeleteService(k)
		}
		b.Apply(cat.Take())
		list := slices.SortedFunc(maps.Values(services), func(a, b *model.Service) int { return a.Key.Compare(b.Key) })
		for _, sc := range scopes {
			want := map[typedName]*model.Origin{}
			all := translate.Translate(sc, list)
			all.EachFrom(func(ty xdstype.Type, m proto.Message, from *model.Origin) {
				want[typedName{ty, ty.Info().NameOf(m)}] = from
			})
			snap := store.Get(sc.Key)
			for _, loc := range locations {
				snap.ReadFrom(loc, func(v View) {
					for ty := range xdstype.Count {
						v.All(ty, func(r *Resource) {
							from, ok := want[typedName{ty, r.Name}]
							if !ok {
								t.Fatalf("step %d, %v: %s %q is served and not translated", step, sc.Key, ty, r.Name)
							}
							if !model.SameOrigin(r.From, from) {
								t.Fatalf("step %d, %v at %+v: %s %q carries %v, want %v", step, sc.Key, loc, ty, r.Name, r.From, from)
							}
							svc, has := r.Service()
							if has != (from != nil) || has && svc != from.Service {
								t.Fatalf("step %d: %s %q: Service() = %v, %v; want %v", step, ty, r.Name, svc, has, from)
							}
							if from == nil {
								own++
							}
							if ty == xdstype.Endpoint && r != v.s.types[ty].res.get(r.Name) {
								placed++
							}
						})
					}
				})
			}
		}
	}
	if placed == 0 || own == 0 {
		t.Errorf("the test served %d place views' assignments and %d resources of a scope's own; both must be checked", placed, own)
	}
	var none *Resource
	if svc, ok := none.Service(); ok {
		t.Errorf("no resource belongs to %v", svc)
	}
}
