package translate

import (
	"fmt"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// benchService builds a Service with one HTTP port and n endpoints spread
// over three zones, the shape of a typical Deployment behind a Service.
func benchService(ns, name string, n int) *model.Service {
	svc := &model.Service{
		Key:   model.Key{Namespace: ns, Name: name},
		Ports: []model.ServicePort{{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPortName: "http"}},
	}
	for i := range n {
		svc.Endpoints = append(svc.Endpoints, model.Endpoint{
			Address: fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256),
			Family:  model.IPv4,
			Ports:   []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}},
			Ready:   i%10 != 9,
			Serving: true,
			Zone:    fmt.Sprintf("zone-%c", 'a'+i%3),
		})
	}
	return svc
}

var modes = []model.ListenerMode{model.ListenerEnvoy, model.ListenerProxylessGRPC}

// BenchmarkService measures the work after one Service changes:
// one Service with 10 endpoints.
func BenchmarkService(b *testing.B) {
	svc := benchService("shop", "web", 10)
	for _, mode := range modes {
		b.Run(string(mode), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Service(svc, Profile{Mode: mode})
			}
		})
	}
	b.Run("Endpoints", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Endpoints(svc, model.ListenerEnvoy)
		}
	})
}

// BenchmarkAssembleScope measures merging already translated fragments into
// a scope's resource set, the work a scope does after any of its Services
// changes.
func BenchmarkAssembleScope(b *testing.B) {
	for _, mode := range modes {
		for _, n := range []int{1000, 10000} {
			scope := &model.Scope{Key: model.Key{Namespace: "ns0", Name: "s"}, Listener: model.Listener{Mode: mode, Port: 8080}}
			fragments := make([]*Fragment, n)
			for i := range fragments {
				f := Service(benchService(fmt.Sprintf("ns%d", i%50), fmt.Sprintf("svc-%d", i), 3), ProfileOf(scope))
				fragments[i] = &f
			}
			b.Run(fmt.Sprintf("%s/services=%d", mode, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = AssembleScope(scope, fragments)
				}
			})
		}
	}
}
