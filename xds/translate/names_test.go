package translate

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Every resource the translator makes of a Service carries the Service
// port it was translated from, the one its name says; a scope's own
// listener and route configuration carry none, as their names say none. A
// scope of more than 32 Services sorts its lists the long way, which must
// keep each resource's provenance with it too.
func TestEveryResourceCarriesItsServicePort(t *testing.T) {
	service := func(ns, name string, ports ...int32) *model.Service {
		svc := &model.Service{Key: model.Key{Namespace: ns, Name: name}, UID: "uid-" + ns + "-" + name}
		for _, p := range ports {
			svc.Ports = append(svc.Ports, model.ServicePort{Name: fmt.Sprint("p", p), Port: p, Protocol: model.ProtocolTCP, TargetPort: p})
		}
		svc.Ports = append(svc.Ports, model.ServicePort{Name: "dns", Port: 53, Protocol: "UDP", TargetPort: 53})
		for i := range 2 {
			svc.Endpoints = append(svc.Endpoints, model.Endpoint{Address: fmt.Sprintf("10.0.%d.%d", len(ns), i+1), Ready: true,
				Ports: []model.EndpointPort{{Name: "p" + fmt.Sprint(ports[0]), Port: ports[0], Protocol: model.ProtocolTCP}}})
		}
		return svc
	}
	// Two Services of one name in two namespaces compete for short host names.
	services := []*model.Service{service("shop", "cart", 8080, 50051, 9), service("web", "cart", 80)}
	for i := range 40 {
		services = append(services, service("bulk", fmt.Sprintf("svc-%02d", i), int32(1000+i), 443))
	}
	check := func(what string, ty xdstype.Type, name string, from *model.Origin) {
		t.Helper()
		key, port, ok := nameSays(ty, name)
		switch {
		case !ok && from != nil:
			t.Errorf("%s: %s %q is the scope's own and carries %+v", what, ty, name, *from)
		case ok && from == nil:
			t.Errorf("%s: %s %q carries no provenance; its name says %v port %d", what, ty, name, key, port)
		case ok && (from.Service != key || from.Port != port):
			t.Errorf("%s: %s %q carries %+v; its name says %v port %d", what, ty, name, *from, key, port)
		}
	}
	for _, mode := range []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC} {
		var fragments []*Fragment
		for _, svc := range services {
			f := Service(svc, Profile{Mode: mode})
			fragments = append(fragments, &f)
			n := 0
			f.EachFrom(func(ty xdstype.Type, m proto.Message, from *model.Origin) {
				n++
				if from == nil || from.Service != svc.Key {
					t.Errorf("%s: fragment of %v: %s %q carries %v", mode, svc.Key, ty, ty.Info().NameOf(m), from)
					return
				}
				check(string(mode)+" fragment", ty, ty.Info().NameOf(m), from)
			})
			if n == 0 {
				t.Errorf("%s: %v: no resources", mode, svc.Key)
			}
		}
		scope := &model.Scope{Key: model.Key{Namespace: "shop", Name: "edge"}, Generation: 3,
			Listener: model.Listener{Mode: mode, Port: 10080}}
		all := AssembleScope(scope, fragments)
		counts := map[xdstype.Type]int{}
		all.EachFrom(func(ty xdstype.Type, m proto.Message, from *model.Origin) {
			counts[ty]++
			check(string(mode)+" scope", ty, ty.Info().NameOf(m), from)
		})
		want := map[xdstype.Type]int{xdstype.Cluster: 84, xdstype.Endpoint: 84, xdstype.Listener: 1, xdstype.Route: 1, xdstype.VirtualHost: 84}
		if mode == model.ListenerProxylessGRPC {
			want = map[xdstype.Type]int{xdstype.Cluster: 84, xdstype.Endpoint: 84, xdstype.Listener: 168, xdstype.Route: 84}
		}
		for ty, n := range want {
			if counts[ty] != n {
				t.Errorf("%s: %d %s resources, want %d", mode, counts[ty], ty, n)
			}
		}
	}
}

// nameSays is the Service port a resource's name says it belongs to, read
// back by the naming scheme (which the translator no longer needs to be
// invertible): clusters and assignments are "<ns>/<svc>:<port>", gRPC API
// listeners "<svc>.<ns>[.svc.cluster.local]:<port>" and their route
// configurations "<svc>.<ns>.svc.cluster.local:<port>", each of the three
// with "@<uid>" after it in ProxylessGRPC mode where it names a Service's
// incarnation; Envoy-mode virtual hosts "http-<listener port>/<svc>.<ns>:<port>".
// An Envoy-mode listener and route configuration, "http-<port>", belong to
// the scope: false.
func nameSays(t xdstype.Type, name string) (model.Key, int32, bool) {
	if t == xdstype.VirtualHost {
		_, host, ok := strings.Cut(name, "/")
		if !ok {
			return model.Key{}, 0, false
		}
		name = host
	}
	name, _, _ = strings.Cut(name, "@")
	host, portText, ok := strings.Cut(name, ":")
	if !ok {
		return model.Key{}, 0, false
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return model.Key{}, 0, false
	}
	if t == xdstype.Cluster || t == xdstype.Endpoint {
		ns, svc, ok := strings.Cut(host, "/")
		return model.Key{Namespace: ns, Name: svc}, int32(port), ok
	}
	svc, ns, ok := strings.Cut(strings.TrimSuffix(host, ".svc."+ClusterDomain), ".")
	return model.Key{Namespace: ns, Name: svc}, int32(port), ok
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
