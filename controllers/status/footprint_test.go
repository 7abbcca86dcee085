package status

import (
	"testing"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// A Service's footprint is every resource translated from it, of every
// port and type, virtual hosts included; an Envoy-mode scope's own
// listener and route configuration belong to no Service and count for
// none.
func TestFootprintSumsEachServicesResources(t *testing.T) {
	service := func(name string, ports ...int32) *model.Service {
		svc := &model.Service{Key: model.Key{Namespace: "shop", Name: name}}
		for _, p := range ports {
			svc.Ports = append(svc.Ports, model.ServicePort{Port: p, Protocol: model.ProtocolTCP, TargetPort: p})
		}
		return svc
	}
	cat := catalog.New()
	store := snapshot.NewStore()
	key := model.Key{Namespace: "shop", Name: "edge"}
	cat.UpsertScope(&model.Scope{Key: key, Protocol: model.Delta, Selections: []model.Selection{{Namespace: "shop"}},
		Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080}})
	cat.UpsertService(service("cart", 80))
	cat.UpsertService(service("shipping", 80, 9090))
	snapshot.NewBuilder(cat, store, 0).Apply(cat.Take())

	var got map[model.Key]Footprint
	all, own := 0, 0
	store.Get(key).Read(func(v snapshot.View) {
		got = footprint(v)
		for _, ty := range xdstype.All() {
			v.All(ty, func(r *snapshot.Resource) {
				all += r.Size
				if r.Name == "http-10080" {
					own += r.Size
				}
			})
		}
	})
	cart, shipping := got[model.Key{Namespace: "shop", Name: "cart"}], got[model.Key{Namespace: "shop", Name: "shipping"}]
	// A cluster, an assignment and a virtual host per port.
	if len(got) != 2 || cart.Resources != 3 || shipping.Resources != 6 {
		t.Fatalf("footprint %+v, want 3 resources of cart and 6 of shipping", got)
	}
	if own == 0 || cart.Bytes+shipping.Bytes != all-own {
		t.Errorf("footprint bytes %d + %d, want all %d but the scope's own %d", cart.Bytes, shipping.Bytes, all, own)
	}
}
