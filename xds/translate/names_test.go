package translate

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Every name the translator gives a Service's resources leads back to it.
func TestServiceOfInvertsTheNames(t *testing.T) {
	svc := &model.Service{
		Key: model.Key{Namespace: "shop", Name: "cart"}, UID: "0b3c6a1e-5d2f-4e8a-9c71-2f6d8e4b1a90",
		Ports: []model.ServicePort{{Name: "grpc", Port: 50051, Protocol: model.ProtocolTCP, TargetPort: 50051}},
	}
	for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
		f := Service(svc, Profile{Mode: mode})
		n := 0
		f.Each(func(ty xdstype.Type, m proto.Message) {
			name := ty.Info().NameOf(m)
			if got, ok := ServiceOf(ty, name); !ok || got != svc.Key {
				t.Errorf("%s: ServiceOf(%s, %q) = %v, %v", mode, ty, name, got, ok)
			}
			n++
		})
		if n == 0 {
			t.Errorf("%s: no resources", mode)
		}
	}
	for _, c := range []struct {
		t    xdstype.Type
		name string
	}{{xdstype.Listener, "http-10080"}, {xdstype.Route, "http-10080"}, {xdstype.Cluster, "nocolon"}, {xdstype.Listener, "a.b.c:80"}, {xdstype.Cluster, "shop/cart:http"}} {
		if got, ok := ServiceOf(c.t, c.name); ok {
			t.Errorf("ServiceOf(%s, %q) = %v, want none", c.t, c.name, got)
		}
	}
}

// A Service deleted and re-created (a new UID) gets other gRPC listeners
// and another route configuration name, so clients that ignore a resource
// equal to one they cached still see it; the same incarnation translates
// to the same bytes, on every replica.
func TestGRPCRouteNameCarriesTheIncarnation(t *testing.T) {
	svc := func(uid string) *model.Service {
		return &model.Service{
			Key: model.Key{Namespace: "shop", Name: "cart"}, UID: uid,
			Ports: []model.ServicePort{{Name: "grpc", Port: 50051, Protocol: model.ProtocolTCP, TargetPort: 50051}},
		}
	}
	bytesOf := func(s *model.Service) map[string]string {
		out := map[string]string{}
		f := Service(s, Profile{Mode: model.ListenerProxylessGRPC})
		f.Each(func(ty xdstype.Type, m proto.Message) {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out[ty.String()+" "+ty.Info().NameOf(m)] = string(b)
		})
		return out
	}
	first, again, next := bytesOf(svc("uid-1")), bytesOf(svc("uid-1")), bytesOf(svc("uid-2"))
	for k, v := range first {
		if again[k] != v {
			t.Errorf("%s: one incarnation translated to different bytes", k)
		}
	}
	for _, k := range []string{"LDS cart.shop.svc.cluster.local:50051", "LDS cart.shop:50051"} {
		// The listeners keep their names (a target names them) and differ in content.
		if first[k] == "" || first[k] == next[k] {
			t.Errorf("%s: the same bytes for two incarnations (or missing)", k)
		}
	}
	if _, ok := first["RDS cart.shop.svc.cluster.local:50051@uid-1"]; !ok {
		t.Errorf("no route configuration named after the UID: %v", keys(first))
	}
	for _, k := range []string{"RDS cart.shop.svc.cluster.local:50051@uid-2", "CDS shop/cart:50051@uid-2", "EDS shop/cart:50051@uid-2"} {
		if _, ok := next[k]; !ok {
			t.Errorf("no %s: %v", k, keys(next))
		}
	}
	envoy := Service(svc("uid-1"), Profile{Mode: model.ListenerEnvoy})
	if n := envoy.Clusters[0].GetName(); n != "shop/cart:50051" {
		t.Errorf("an Envoy-mode cluster is named %q; Envoy needs no incarnation in it", n)
	}
	if got := GRPCRouteName(svc(""), 50051); got != "cart.shop.svc.cluster.local:50051" {
		t.Errorf("without a UID the route name is %q", got)
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
