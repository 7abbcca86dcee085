package catalog

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/xds/model"
)

// BenchmarkEndpointChange measures one endpoint change (re-translate the
// Service, update the scopes that select it, Take) as the world grows: its
// cost must not depend on how many Services exist.
func BenchmarkEndpointChange(b *testing.B) {
	for _, layout := range []string{"unscoped-envoy", "scoped-grpc"} {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("%s/services=%d", layout, n), func(b *testing.B) {
				c := New()
				// The scopes live in namespace gw and select in others.
				c.SetCrossNamespace(CrossNamespaceAllow, false)
				for i := range n {
					c.UpsertService(service(fmt.Sprint("ns", i%20), fmt.Sprint("svc", i), nil, "10.0.0.1", "10.0.0.2", "10.0.0.3"))
				}
				if layout == "unscoped-envoy" {
					c.UpsertScope(scope("gw", "all", model.ListenerEnvoy, model.Selection{NamespaceSelector: labels.Everything(), Selector: labels.Everything()}))
					for i := range 20 {
						c.UpsertNamespace(fmt.Sprint("ns", i), nil)
					}
				} else {
					for i := range 20 {
						c.UpsertScope(scope("gw", fmt.Sprint("p", i), model.ListenerProxylessGRPC, model.Selection{Namespace: fmt.Sprint("ns", i), Selector: labels.Everything()}))
					}
				}
				c.Take()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					c.UpsertService(service("ns7", "svc7", nil, "10.0.0.1", "10.0.0.2", fmt.Sprintf("10.1.%d.%d", i/250%250, i%250+1)))
					if us := c.Take(); len(us) != 1 {
						b.Fatalf("one endpoint change reached %d scopes", len(us))
					}
				}
			})
		}
	}
}

// BenchmarkStart measures what a replica's start hands the catalog: every
// scope, then every Service one by one (as the reconcilers do after the
// caches list), then one Take. Envoy-mode scopes select their team's
// Services (100 teams, one per namespace) or their tenant's (S/10 tenants
// of 10 Services, in the team's namespace). Its cost per Service must not
// grow with the world: neither with the scopes (a Service visits only the
// scopes that can select in its namespace) nor with the scope (routes are
// assembled once per Take, not once per Service added).
func BenchmarkStart(b *testing.B) {
	for _, layout := range []string{"teams", "tenants"} {
		for _, n := range []int{2000, 8000} {
			b.Run(fmt.Sprintf("%s/services=%d", layout, n), func(b *testing.B) {
				scopes := 100
				if layout == "tenants" {
					scopes = n / 10
				}
				svcs := make([]*model.Service, n)
				for i := range svcs {
					svcs[i] = service(fmt.Sprint("ns", i%100), fmt.Sprint("svc", i),
						map[string]string{"team": fmt.Sprint("t", i%100), "tenant": fmt.Sprint("t", i%scopes)}, "10.0.0.1", "10.0.0.2")
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					c := New()
					for k := range scopes {
						c.UpsertScope(scope(fmt.Sprint("ns", k%100), fmt.Sprint("s", k), model.ListenerEnvoy,
							model.Selection{Namespace: fmt.Sprint("ns", k%100), Selector: labels.SelectorFromSet(labels.Set{strings.TrimSuffix(layout, "s"): fmt.Sprint("t", k)})}))
					}
					for _, svc := range svcs {
						c.UpsertService(svc)
					}
					if us := c.Take(); len(us) != scopes {
						b.Fatalf("%d scopes taken, want %d", len(us), scopes)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/service")
			})
		}
	}
}

// worldService is Service i of the operator's world-scale benchmark
// (hack/bench/apiworld.go) as the reconcilers hand it to the catalog: in
// namespace ns(i mod 100) with its team's label, 60% with one HTTP port,
// 30% also an h2c gRPC one, 10% also a metrics one, and two to four ready
// endpoints over three zones.
func worldService(i int) *model.Service {
	ns := fmt.Sprint("ns-", i%100)
	svc := &model.Service{
		Key:    model.Key{Namespace: ns, Name: fmt.Sprint("svc-", i)},
		Labels: map[string]string{"app": fmt.Sprint("svc-", i), "team": fmt.Sprint("team-", i%100), "tenant": fmt.Sprint("tenant-", i%10000)},
		Ports:  []model.ServicePort{{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPort: 8080}},
	}
	eps := []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}}
	if i%10 >= 6 {
		svc.Ports = append(svc.Ports, model.ServicePort{Name: "grpc", Port: 9090, Protocol: model.ProtocolTCP, AppProtocol: "kubernetes.io/h2c", TargetPort: 9090})
		eps = append(eps, model.EndpointPort{Name: "grpc", Port: 9090, Protocol: model.ProtocolTCP})
	}
	if i%10 == 9 {
		svc.Ports = append(svc.Ports, model.ServicePort{Name: "metrics", Port: 9100, Protocol: model.ProtocolTCP, TargetPortName: "metrics"})
		eps = append(eps, model.EndpointPort{Name: "metrics", Port: 9100, Protocol: model.ProtocolTCP})
	}
	for e := range 2 + i%3 {
		n := i*4 + e + 1
		svc.Endpoints = append(svc.Endpoints, model.Endpoint{
			Address: fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255), Family: model.IPv4, Ready: true, Serving: true,
			Zone: fmt.Sprint("zone-", e%3), Ports: eps,
		})
	}
	return svc
}

// heapHeld keeps BenchmarkHeap's last catalog alive, so that the profile
// -memprofile writes after the benchmark shows what it holds.
var heapHeld *Catalog

// BenchmarkHeap measures the live heap the catalog holds per Service once
// it has loaded the world of the operator's world-scale benchmark (teams
// layout: 100 Envoy-mode Delta scopes with virtual hosts by VHDS, each
// selecting its team's Services; with zone priority, each zone's view too)
// and handed it downstream with one Take: the translated resources, their
// per-scope indexes and everything else the catalog keeps, not the model
// Services it was given (B/service). go test -run XXX -bench Heap
// -memprofile FILE shows what holds it.
func BenchmarkHeap(b *testing.B) {
	const n, scopes = 20000, 100
	svcs := make([]*model.Service, n)
	for i := range svcs {
		svcs[i] = worldService(i)
	}
	for _, layout := range []string{"teams", "teams-zonepriority"} {
		b.Run(layout, func(b *testing.B) {
			var perService float64
			for range b.N {
				heapHeld = nil
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				c := New()
				for k := range scopes {
					sc := scope(fmt.Sprint("ns-", k), fmt.Sprint("team-", k), model.ListenerEnvoy,
						model.Selection{Namespace: fmt.Sprint("ns-", k), Selector: labels.SelectorFromSet(labels.Set{"team": fmt.Sprint("team-", k)})})
					sc.Protocol, sc.Listener.VHDS, sc.ZonePriority = model.Delta, true, layout == "teams-zonepriority"
					c.UpsertScope(sc)
				}
				for _, svc := range svcs {
					c.UpsertService(svc)
				}
				if us := c.Take(); len(us) != scopes {
					b.Fatalf("%d scopes taken, want %d", len(us), scopes)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perService = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
				heapHeld = c
			}
			b.ReportMetric(perService, "B/service")
		})
	}
}
