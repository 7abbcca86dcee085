package testkit

import (
	"fmt"
	"runtime"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/xds/model"
)

// WorldService is Service i of the operator's world-scale benchmark
// (hack/bench/apiworld.go) as the reconcilers hand it to the catalog: in
// namespace ns-(i mod 100) with its team's label, 60% with one HTTP port,
// 30% also an h2c gRPC one, 10% also a metrics one, and two to four ready
// endpoints over three zones. The in-process heap benchmarks load it.
func WorldService(i int) *model.Service {
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

// WorldServices is the world's first n Services.
func WorldServices(n int) []*model.Service {
	out := make([]*model.Service, n)
	for i := range out {
		out[i] = WorldService(i)
	}
	return out
}

// HeapGrowth is by how many bytes the live heap grew while fn ran, each
// side counted after a full collection: what fn left reachable, which fn
// must keep so (in a variable outside it, say) to be counted.
func HeapGrowth(fn func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// WorldTeam is scope k of the world-scale benchmark's teams layout: in
// namespace ns-k, Envoy mode on port 10080 with virtual hosts by VHDS,
// Delta, selecting team-k's Services there.
func WorldTeam(k int) *model.Scope {
	ns := fmt.Sprint("ns-", k)
	return &model.Scope{
		Key:        model.Key{Namespace: ns, Name: fmt.Sprint("team-", k)},
		Generation: 1,
		Protocol:   model.Delta,
		Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080, VHDS: true},
		Selections: []model.Selection{{Namespace: ns, Selector: labels.SelectorFromSet(labels.Set{"team": fmt.Sprint("team-", k)})}},
	}
}
