package catalog

import (
	"fmt"
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
