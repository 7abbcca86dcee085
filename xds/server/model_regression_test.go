package server_test

import (
	"testing"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

// TestModelRegressions replays step lists the randomized model test once
// shrunk a failure to, so that each stays fixed whatever the generator
// draws later.
func TestModelRegressions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		// The proxy rejects an assignment; the scope then stops
		// prioritizing by zone, which leaves the assignment of a proxy
		// that runs in no zone as it was, though the change reaches it.
		// The rejected assignment is what the scope still serves: sending
		// it again (the same version for the same names) would only be
		// rejected again.
		name:  "SotW assignment rejected, then a scope change that leaves it be",
		steps: rejectThenRescope(model.SotW),
	}, {
		name:  "delta assignment rejected, then a scope change that leaves it be",
		steps: rejectThenRescope(model.Delta),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if i, err := replaySteps(tc.steps, 10*time.Second); err != nil {
				t.Fatalf("step %d (%s): %v", i, tc.steps[i].String(), err)
			}
		})
	}
}

// rejectThenRescope is seed 186's failure, shrunk (its Service as drawn).
func rejectThenRescope(proto model.Protocol) []step {
	scope := model.Key{Namespace: "ns-a", Name: "gw"}
	udp := func(port int32) model.EndpointPort {
		return model.EndpointPort{Name: "dns", Port: port, Protocol: model.ProtocolUDP}
	}
	web := func(port int32) model.EndpointPort {
		return model.EndpointPort{Name: "web", Port: port, Protocol: model.ProtocolTCP}
	}
	h2 := model.EndpointPort{Name: "h2", Port: 8000}
	svc := func(ready bool) *model.Service {
		return &model.Service{
			Key:    model.Key{Namespace: "ns-c", Name: "svc-2"},
			Labels: map[string]string{"app": "a"},
			Ports: []model.ServicePort{
				{Name: "dns", Port: 53, Protocol: model.ProtocolUDP, TargetPort: 53},
				{Name: "h2", Port: 8080, AppProtocol: "kubernetes.io/h2c", TargetPort: 8081},
				{Name: "web", Port: 8080, Protocol: model.ProtocolTCP, TargetPortName: "web"},
			},
			Endpoints: []model.Endpoint{
				{Family: model.IPv4, Address: "10.0.0.5", Zone: "zone-2", Node: "node-2", Serving: true, Terminating: true, Ports: []model.EndpointPort{h2}},
				{Family: model.IPv6, Address: "fd00::3", Zone: "zone-1", Node: "node-0", Ready: true, Serving: true, Ports: []model.EndpointPort{udp(8002), h2, web(8001)}},
				{Family: model.IPv4, Address: "10.0.0.4", Zone: "zone-2", Node: "node-1", Serving: true, Terminating: true, Ports: []model.EndpointPort{udp(8001), web(8000)}},
				{Family: model.IPv4, Address: "10.0.0.3", Zone: "zone-1", Node: "node-1", Ready: ready, Serving: true, Terminating: !ready, Ports: []model.EndpointPort{udp(8001), h2}},
			},
		}
	}
	sc := func(gen int64, zonePriority bool) *model.Scope {
		return &model.Scope{Key: scope, Generation: gen, Protocol: proto, ZonePriority: zonePriority,
			Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 8080},
			Selections: []model.Selection{{Namespace: "ns-c", Names: map[string]struct{}{"svc-1": {}, "svc-2": {}}}}}
	}
	return []step{
		{kind: kUpsertScope, scope: sc(1, true)},
		{kind: kConnect, proxy: "p1", proto: proto, ref: scope.String()},
		{kind: kUpsertService, svc: svc(true)},
		{kind: kNACK, proxy: "p1"},
		{kind: kBatch, burst: true, batch: []step{{kind: kUpsertService, svc: svc(false)}}},
		{kind: kUpsertScope, scope: sc(2, false)},
	}
}
