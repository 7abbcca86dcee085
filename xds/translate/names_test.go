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
		Key:   model.Key{Namespace: "shop", Name: "cart"},
		Ports: []model.ServicePort{{Name: "grpc", Port: 50051, Protocol: model.ProtocolTCP, TargetPort: 50051}},
	}
	for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
		f := Service(svc, mode)
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
