package catalog

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
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
	svcs := testkit.WorldServices(n)
	for _, layout := range []string{"teams", "teams-zonepriority"} {
		b.Run(layout, func(b *testing.B) {
			var grown int64
			for range b.N {
				heapHeld = nil
				grown = testkit.HeapGrowth(func() {
					c := New()
					for k := range scopes {
						sc := testkit.WorldTeam(k)
						sc.ZonePriority = layout == "teams-zonepriority"
						c.UpsertScope(sc)
					}
					for _, svc := range svcs {
						c.UpsertService(svc)
					}
					if us := c.Take(); len(us) != scopes {
						b.Fatalf("%d scopes taken, want %d", len(us), scopes)
					}
					heapHeld = c
				})
			}
			b.ReportMetric(float64(grown)/n, "B/service")
		})
	}
}
