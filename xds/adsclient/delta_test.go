package adsclient

import (
	"context"
	"fmt"
	"github.com/scopeplane/scopeplane/xds/xdstype"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func endpointAddr(t *testing.T, h Held) string {
	t.Helper()
	a, err := Decode[*endpointv3.ClusterLoadAssignment](h)
	if err != nil {
		t.Fatal(err)
	}
	return a.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
}

func deltaClient(reject func(string, []*anypb.Any, []string) string) *Client {
	return New(Config{
		Protocol:     Delta,
		Node:         testNode,
		Types:        []string{xdstype.Cluster.URL(), xdstype.Endpoint.URL()},
		Wildcard:     map[string]bool{xdstype.Cluster.URL(): true},
		Names:        map[string][]string{xdstype.Endpoint.URL(): {"a"}},
		Reject:       reject,
		RecordEvents: true,
	})
}

func TestDeltaUpsertRemoveAck(t *testing.T) {
	srv, conn := startServer(t)
	c := deltaClient(nil)
	start(t, c, conn)
	fs := srv.nextStream(t)

	// The node only on the stream's first request; the wildcard as "*".
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), ResourceNamesSubscribe: []string{"*"}}, fs.nextDelta(t))
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Endpoint.URL(), ResourceNamesSubscribe: []string{"a"}}, fs.nextDelta(t))

	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n1", SystemVersionInfo: "s1",
		Resources: []*discoveryv3.Resource{deltaRes("c1", "1", cluster(t, "c1")), deltaRes("c2", "1", cluster(t, "c2"))}})
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResponseNonce: "n1"}, fs.nextDelta(t))
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "1", "c2": "1"}) {
		t.Fatalf("after n1: %v", got)
	}

	// Omission is not deletion in delta: c3 added, c1 updated, c2 removed explicitly.
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n2",
		Resources:        []*discoveryv3.Resource{deltaRes("c1", "2", cluster(t, "c1")), deltaRes("c3", "1", cluster(t, "c3"))},
		RemovedResources: []string{"c2"}})
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResponseNonce: "n2"}, fs.nextDelta(t))
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "2", "c3": "1"}) {
		t.Fatalf("after n2: %v", got)
	}
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n3",
		RemovedResourceNames: []*discoveryv3.ResourceName{{Name: "c3"}}})
	fs.nextDelta(t)
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "2"}) {
		t.Fatalf("after n3 (removed_resource_names): %v", got)
	}

	// By name: unrequested resources are dropped; a heartbeat (no payload, same version) keeps
	// the payload.
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e1",
		Resources: []*discoveryv3.Resource{deltaRes("a", "7", cla(t, "a", "10.0.0.1")), deltaRes("z", "1", cla(t, "z", "10.0.0.2"))}})
	fs.nextDelta(t)
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e2",
		Resources: []*discoveryv3.Resource{{Name: "a", Version: "7"}}})
	fs.nextDelta(t)
	held := c.State(xdstype.Endpoint.URL())
	if got := versions(held); !cmp.Equal(got, map[string]string{"a": "7"}) {
		t.Fatalf("EDS: %v", got)
	}
	if addr := endpointAddr(t, held["a"]); addr != "10.0.0.1" {
		t.Errorf("heartbeat replaced the payload: %s", addr)
	}

	st := c.Stats()
	if st.ByType[xdstype.Endpoint.URL()].Unrequested != 1 || st.ACKs != 5 || st.NACKs != 0 || st.Requests != 7 || st.Removed != 2 {
		t.Errorf("stats: %+v", st)
	}
	evs := c.Events()
	if len(evs) != 5 || evs[0].Version != "s1" || !cmp.Equal(evs[1].Removed, []string{"c2"}) || !cmp.Equal(evs[1].Names, []string{"c1", "c3"}) {
		t.Errorf("events: %+v", evs)
	}
}

func TestDeltaNackLeavesStateUnchanged(t *testing.T) {
	srv, conn := startServer(t)
	var mu sync.Mutex
	var seenRemoved [][]string
	c := deltaClient(func(typeURL string, rs []*anypb.Any, removed []string) string {
		mu.Lock()
		seenRemoved = append(seenRemoved, removed)
		mu.Unlock()
		return rejectBad(typeURL, rs, removed)
	})
	start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextDelta(t)
	fs.nextDelta(t)
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n1",
		Resources: []*discoveryv3.Resource{deltaRes("c1", "1", cluster(t, "c1")), deltaRes("c2", "1", cluster(t, "c2"))}})
	fs.nextDelta(t)

	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n2",
		Resources:        []*discoveryv3.Resource{deltaRes("c1", "2", cluster(t, "c1")), deltaRes("bad", "1", cluster(t, "bad"))},
		RemovedResources: []string{"c2"}})
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResponseNonce: "n2",
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "cluster bad is bad"}}, fs.nextDelta(t))
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "1", "c2": "1"}) {
		t.Fatalf("NACKed delta applied: %v", got)
	}
	fs.quiet(t, 200*time.Millisecond)
	mu.Lock()
	if !cmp.Equal(seenRemoved, [][]string{nil, {"c2"}}) {
		t.Errorf("Reject saw removed %q", seenRemoved)
	}
	mu.Unlock()

	for _, tc := range []struct {
		name   string
		resp   *discoveryv3.DeltaDiscoveryResponse
		detail string
	}{
		{"dup", &discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{
			deltaRes("c1", "3", cluster(t, "c1")), deltaRes("c1", "4", cluster(t, "c1"))}},
			"duplicate name c1 found among added/updated resources"},
		{"dup-removed", &discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{
			deltaRes("c1", "3", cluster(t, "c1"))}, RemovedResources: []string{"c1"}},
			"duplicate name c1 found in the union of added+removed resources"},
		{"type", &discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{
			deltaRes("c1", "3", listener(t, "c1"))}}, "does not match the message-wide type URL"},
		{"unnamed", &discoveryv3.DeltaDiscoveryResponse{Resources: []*discoveryv3.Resource{
			deltaRes("", "3", cluster(t, "c1"))}}, "without a name"},
	} {
		tc.resp.TypeUrl, tc.resp.Nonce = xdstype.Cluster.URL(), tc.name
		fs.send(t, tc.resp)
		req := fs.nextDelta(t)
		if req.GetResponseNonce() != tc.name || !strings.Contains(req.GetErrorDetail().GetMessage(), tc.detail) {
			t.Errorf("%s: want NACK containing %q, got %v", tc.name, tc.detail, req)
		}
	}
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "1", "c2": "1"}) {
		t.Fatalf("NACKed delta applied: %v", got)
	}
	if st := c.Stats(); st.NACKs != 5 || st.ACKs != 1 {
		t.Errorf("stats: %+v", st.Counts)
	}
}

func TestDeltaReconnectSendsInitialResourceVersions(t *testing.T) {
	srv, conn := startServer(t)
	c := deltaClient(nil)
	r := start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextDelta(t)
	fs.nextDelta(t)
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "n1",
		Resources: []*discoveryv3.Resource{deltaRes("c1", "h1", cluster(t, "c1")), deltaRes("c2", "h2", cluster(t, "c2"))}})
	fs.nextDelta(t)
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e1",
		Resources: []*discoveryv3.Resource{deltaRes("a", "ha", cla(t, "a", "10.0.0.1"))}})
	fs.nextDelta(t)
	if err := c.Subscribe(xdstype.Endpoint.URL(), "b"); err != nil { // subscribed, never received
		t.Fatal(err)
	}
	fs.nextDelta(t)

	fs.end <- status.Error(codes.Unavailable, "bye")
	if err := r.result(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("Run: %v", err)
	}

	start(t, c, conn)
	fs = srv.nextStream(t)
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), ResourceNamesSubscribe: []string{"*"},
		InitialResourceVersions: map[string]string{"c1": "h1", "c2": "h2"}}, fs.nextDelta(t))
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Endpoint.URL(), ResourceNamesSubscribe: []string{"a", "b"},
		InitialResourceVersions: map[string]string{"a": "ha"}}, fs.nextDelta(t))
	if got := c.Versions(xdstype.Cluster.URL()); !cmp.Equal(got, map[string]string{"c1": "h1", "c2": "h2"}) {
		t.Errorf("Versions: %v", got)
	}

	// The server answers with the difference only.
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: "m1", RemovedResources: []string{"c2"}})
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResponseNonce: "m1"}, fs.nextDelta(t))
	if got := c.Versions(xdstype.Cluster.URL()); !cmp.Equal(got, map[string]string{"c1": "h1"}) {
		t.Errorf("after reconnect diff: %v", got)
	}
}

func TestDeltaSubscribeUnsubscribe(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{Protocol: Delta, Node: testNode, Types: []string{xdstype.Listener.URL(), xdstype.Endpoint.URL()},
		Names: map[string][]string{xdstype.Endpoint.URL(): {"a"}}})
	start(t, c, conn)
	fs := srv.nextStream(t)
	// xdstype.Listener.URL() has no interest yet: only EDS goes out, and it carries the node.
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), ResourceNamesSubscribe: []string{"a"}}, fs.nextDelta(t))
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e1",
		Resources: []*discoveryv3.Resource{deltaRes("a", "1", cla(t, "a", "10.0.0.1"))}})
	fs.nextDelta(t)

	if err := c.Subscribe(xdstype.Endpoint.URL(), "b", "a", "c"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Endpoint.URL(), ResourceNamesSubscribe: []string{"b", "c"}}, fs.nextDelta(t))
	if err := c.Unsubscribe(xdstype.Endpoint.URL(), "a", "nope"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Endpoint.URL(), ResourceNamesUnsubscribe: []string{"a"}}, fs.nextDelta(t))
	if got := c.State(xdstype.Endpoint.URL()); len(got) != 0 {
		t.Errorf("unsubscribed resource still held: %v", got)
	}
	if err := c.Unsubscribe(xdstype.Endpoint.URL(), "nope"); err != nil {
		t.Fatal(err)
	}
	fs.quiet(t, 200*time.Millisecond)

	if err := c.Subscribe(xdstype.Listener.URL(), Wildcard); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Listener.URL(), ResourceNamesSubscribe: []string{"*"}}, fs.nextDelta(t))
	if err := c.Unsubscribe(xdstype.Listener.URL(), Wildcard); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Listener.URL(), ResourceNamesUnsubscribe: []string{"*"}}, fs.nextDelta(t))
}

func TestValidateNacksInvalidResources(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{Protocol: Delta, Names: map[string][]string{xdstype.Endpoint.URL(): {"a"}}, Validate: true})
	start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextDelta(t)
	invalid := mustAny(t, &endpointv3.ClusterLoadAssignment{ClusterName: "a", Endpoints: []*endpointv3.LocalityLbEndpoints{{
		LbEndpoints: []*endpointv3.LbEndpoint{{LoadBalancingWeight: wrapperspb.UInt32(0)}},
	}}})
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e1",
		Resources: []*discoveryv3.Resource{deltaRes("a", "1", invalid)}})
	if req := fs.nextDelta(t); !strings.Contains(req.GetErrorDetail().GetMessage(), "LoadBalancingWeight") {
		t.Errorf("want a validation NACK, got %v", req)
	}
	fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Endpoint.URL(), Nonce: "e2",
		Resources: []*discoveryv3.Resource{deltaRes("a", "2", cla(t, "a", "10.0.0.1"))}})
	if req := fs.nextDelta(t); req.GetErrorDetail() != nil {
		t.Errorf("valid resource NACKed: %v", req.GetErrorDetail())
	}
}

// TestConcurrentUse runs readers and subscription changes against a stream of responses; it is
// meant for -race, and checks that every response is answered exactly once.
func TestConcurrentUse(t *testing.T) {
	for _, p := range []Protocol{SotW, Delta} {
		t.Run(p.String(), func(t *testing.T) {
			srv, conn := startServer(t)
			c := New(Config{Protocol: p, Node: testNode, Wildcard: map[string]bool{xdstype.Cluster.URL(): true},
				Names: map[string][]string{xdstype.Endpoint.URL(): {"a"}}})
			start(t, c, conn)
			fs := srv.nextStream(t)

			const responses = 50
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					for j := 0; ctx.Err() == nil; j++ {
						_ = c.State(xdstype.Cluster.URL())
						_ = c.Stats()
						_ = c.Events()
						name := fmt.Sprintf("x%d-%d", i, j%3)
						_ = c.Subscribe(xdstype.Endpoint.URL(), name)
						_ = c.Unsubscribe(xdstype.Endpoint.URL(), name)
						time.Sleep(time.Millisecond)
					}
				})
			}

			// The server answers in a loop while reading requests; it counts ACKs by nonce.
			acked := map[string]int{}
			sent := 0
			for len(acked) < responses {
				if sent < responses {
					nonce := fmt.Sprint(sent)
					name := fmt.Sprintf("c%d", sent%5)
					if p == Delta {
						fs.send(t, &discoveryv3.DeltaDiscoveryResponse{TypeUrl: xdstype.Cluster.URL(), Nonce: nonce,
							Resources: []*discoveryv3.Resource{deltaRes(name, nonce, cluster(t, name))}})
					} else {
						fs.send(t, sotwResp(xdstype.Cluster.URL(), nonce, nonce, cluster(t, name)))
					}
					sent++
				}
				var typ, nonce string
				var nack bool
				switch req := fs.next(t).(type) {
				case *discoveryv3.DiscoveryRequest:
					typ, nonce, nack = req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil
					if typ == xdstype.Cluster.URL() && req.GetVersionInfo() != nonce {
						t.Errorf("ACK of nonce %s carries version %s", nonce, req.GetVersionInfo())
					}
				case *discoveryv3.DeltaDiscoveryRequest:
					typ, nonce, nack = req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail() != nil
				}
				if nack {
					t.Fatalf("unexpected NACK of %s", nonce)
				}
				if typ == xdstype.Cluster.URL() && nonce != "" {
					acked[nonce]++
				}
			}
			cancel()
			wg.Wait()
			for n, k := range acked {
				if k != 1 {
					t.Errorf("nonce %s answered %d times", n, k)
				}
			}
			if st := c.Stats().ByType[xdstype.Cluster.URL()]; st.Responses != responses || st.ACKs != responses {
				t.Errorf("CDS counts: %+v", st)
			}
			wctx, wcancel := context.WithTimeout(t.Context(), wait)
			defer wcancel()
			if err := c.WaitFor(wctx, func(c *Client) bool { return len(c.State(xdstype.Cluster.URL())) > 0 }); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestTypeConstants keeps the type URL constants honest against the generated messages.
func TestTypeConstants(t *testing.T) {
	for want, m := range map[string]proto.Message{
		xdstype.Listener.URL(): &listenerv3.Listener{}, xdstype.Cluster.URL(): &clusterv3.Cluster{},
		xdstype.Endpoint.URL(): &endpointv3.ClusterLoadAssignment{}, xdstype.Route.URL(): &routev3.RouteConfiguration{},
		resourceWrapperType: &discoveryv3.Resource{},
	} {
		if got := mustAny(t, m).GetTypeUrl(); got != want {
			t.Errorf("constant %s, message says %s", want, got)
		}
	}
	if nameField(xdstype.Endpoint.URL()) != 1 || nameField("type.googleapis.com/unknown.Type") != 1 {
		t.Error("nameField")
	}
}
