package adsclient

import (
	"errors"
	"github.com/scopeplane/scopeplane/xds/xdstype"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// rejectBad NACKs any response carrying a Cluster named "bad".
func rejectBad(_ string, rs []*anypb.Any, _ []string) string {
	for _, a := range rs {
		var c clusterv3.Cluster
		if a.UnmarshalTo(&c) == nil && c.GetName() == "bad" {
			return "cluster bad is bad"
		}
	}
	return ""
}

func TestSotWAckNackAndFullStateReplace(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{
		Node:         testNode,
		Types:        []string{xdstype.Cluster.URL(), xdstype.Endpoint.URL()},
		Wildcard:     map[string]bool{xdstype.Cluster.URL(): true},
		Names:        map[string][]string{xdstype.Endpoint.URL(): {"b", "a"}},
		Reject:       rejectBad,
		RecordEvents: true,
	})
	start(t, c, conn)
	fs := srv.nextStream(t)

	// First requests, in Types order: empty version and nonce; the wildcard as an empty list.
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL()}, fs.nextSotW(t))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), ResourceNames: []string{"a", "b"}}, fs.nextSotW(t))

	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v1", "n1", cluster(t, "c1"), cluster(t, "c2")))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), VersionInfo: "v1", ResponseNonce: "n1"}, fs.nextSotW(t))
	if got, want := versions(c.State(xdstype.Cluster.URL())), map[string]string{"c1": "v1", "c2": "v1"}; !cmp.Equal(want, got) {
		t.Fatalf("after v1: want %v, have %v", want, got)
	}

	// NACK: the previous accepted version, this nonce, INVALID_ARGUMENT; nothing applied.
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v2", "n2", cluster(t, "c1"), cluster(t, "bad")))
	wantReq(t, &discoveryv3.DiscoveryRequest{
		Node: testNode, TypeUrl: xdstype.Cluster.URL(), VersionInfo: "v1", ResponseNonce: "n2",
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "cluster bad is bad"},
	}, fs.nextSotW(t))
	if got, want := versions(c.State(xdstype.Cluster.URL())), map[string]string{"c1": "v1", "c2": "v1"}; !cmp.Equal(want, got) {
		t.Fatalf("a NACKed response changed state: want %v, have %v", want, got)
	}
	fs.quiet(t, 200*time.Millisecond) // one NACK, no resend loop

	// Full state: c2 omitted means c2 deleted.
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v3", "n3", cluster(t, "c1")))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), VersionInfo: "v3", ResponseNonce: "n3"}, fs.nextSotW(t))
	if got, want := versions(c.State(xdstype.Cluster.URL())), map[string]string{"c1": "v3"}; !cmp.Equal(want, got) {
		t.Fatalf("full-state replace: want %v, have %v", want, got)
	}

	st := c.Stats().ByType[xdstype.Cluster.URL()]
	if want := (Counts{Responses: 3, Resources: 5, Requests: 4, ACKs: 2, NACKs: 1, Bytes: st.Bytes}); st != want || st.Bytes == 0 {
		t.Errorf("CDS counts: want %+v, have %+v", want, st)
	}
	evs := c.Events()
	if len(evs) != 3 || !evs[0].Accepted || evs[1].Accepted || evs[1].ErrorDetail != "cluster bad is bad" ||
		!cmp.Equal(evs[1].Names, []string{"c1", "bad"}) || evs[2].Version != "v3" || evs[2].Nonce != "n3" {
		t.Errorf("events: %+v", evs)
	}
}

func TestSotWByNameTypesMerge(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{
		Node:     testNode,
		Types:    []string{xdstype.Listener.URL(), xdstype.Route.URL(), xdstype.Endpoint.URL()},
		Wildcard: map[string]bool{xdstype.Listener.URL(): true},
		Names:    map[string][]string{xdstype.Route.URL(): {"r1", "r2"}, xdstype.Endpoint.URL(): {"a", "b"}},
	})
	start(t, c, conn)
	fs := srv.nextStream(t)
	for range 3 {
		fs.nextSotW(t)
	}

	fs.send(t, sotwResp(xdstype.Endpoint.URL(), "v1", "e1", cla(t, "a", "10.0.0.1"), cla(t, "b", "10.0.0.2")))
	fs.nextSotW(t)
	// Only a changed: b is kept at its old version, a is replaced.
	fs.send(t, sotwResp(xdstype.Endpoint.URL(), "v2", "e2", cla(t, "a", "10.0.0.9")))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), VersionInfo: "v2", ResponseNonce: "e2", ResourceNames: []string{"a", "b"}}, fs.nextSotW(t))
	held := c.State(xdstype.Endpoint.URL())
	if got, want := versions(held), map[string]string{"a": "v2", "b": "v1"}; !cmp.Equal(want, got) {
		t.Fatalf("merge: want %v, have %v", want, got)
	}
	if addr := endpointAddr(t, held["a"]); addr != "10.0.0.9" {
		t.Errorf("a holds %s, want the v2 payload", addr)
	}

	// An unrequested resource is dropped and counted.
	fs.send(t, sotwResp(xdstype.Endpoint.URL(), "v3", "e3", cla(t, "z", "10.0.0.3")))
	fs.nextSotW(t)
	if got, want := versions(c.State(xdstype.Endpoint.URL())), map[string]string{"a": "v2", "b": "v1"}; !cmp.Equal(want, got) {
		t.Fatalf("unrequested: want %v, have %v", want, got)
	}
	if n := c.Stats().ByType[xdstype.Endpoint.URL()].Unrequested; n != 1 {
		t.Errorf("Unrequested = %d, want 1", n)
	}

	// RDS merges too; LDS replaces.
	fs.send(t, sotwResp(xdstype.Route.URL(), "r-v1", "r1", route(t, "r1"), route(t, "r2")))
	fs.nextSotW(t)
	fs.send(t, sotwResp(xdstype.Route.URL(), "r-v2", "r2", route(t, "r2")))
	fs.nextSotW(t)
	if got, want := versions(c.State(xdstype.Route.URL())), map[string]string{"r1": "r-v1", "r2": "r-v2"}; !cmp.Equal(want, got) {
		t.Fatalf("RDS merge: want %v, have %v", want, got)
	}
	fs.send(t, sotwResp(xdstype.Listener.URL(), "l-v1", "l1", listener(t, "l1"), listener(t, "l2")))
	fs.nextSotW(t)
	fs.send(t, sotwResp(xdstype.Listener.URL(), "l-v2", "l2", listener(t, "l2")))
	fs.nextSotW(t)
	if got, want := versions(c.State(xdstype.Listener.URL())), map[string]string{"l2": "l-v2"}; !cmp.Equal(want, got) {
		t.Fatalf("LDS replace: want %v, have %v", want, got)
	}

	// A response for a type nobody subscribed to is ignored without an answer, as Envoy does.
	fs.send(t, sotwResp("type.googleapis.com/envoy.config.cluster.v3.Cluster", "x", "x"))
	fs.quiet(t, 200*time.Millisecond)
	if n := c.Stats().ByType[xdstype.Cluster.URL()].Ignored; n != 1 {
		t.Errorf("Ignored = %d, want 1", n)
	}
}

func TestSotWBuiltinChecksNack(t *testing.T) {
	srv, conn := startServer(t)
	var rejectCalls atomic.Int32
	c := New(Config{
		Node:     testNode,
		Wildcard: map[string]bool{xdstype.Cluster.URL(): true},
		Reject: func(string, []*anypb.Any, []string) string {
			rejectCalls.Add(1)
			return ""
		},
	})
	start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextSotW(t)
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v1", "n1", cluster(t, "c1")))
	fs.nextSotW(t)

	for _, tc := range []struct {
		name   string
		rs     []*anypb.Any
		detail string
	}{
		{"type mismatch", []*anypb.Any{cluster(t, "c2"), listener(t, "l1")}, "does not match the message-wide type URL"},
		{"duplicate", []*anypb.Any{cluster(t, "c2"), cluster(t, "c2")}, `duplicate ` + xdstype.Cluster.URL() + ` "c2" found`},
		{"no name", []*anypb.Any{cluster(t, "")}, "without a name"},
		{"garbage", []*anypb.Any{{TypeUrl: xdstype.Cluster.URL(), Value: []byte{0x0a, 0x05, 'x'}}}, "cannot decode"},
	} {
		nonce := "bad-" + tc.name
		fs.send(t, sotwResp(xdstype.Cluster.URL(), "v2", nonce, tc.rs...))
		req := fs.nextSotW(t)
		if req.GetVersionInfo() != "v1" || req.GetResponseNonce() != nonce ||
			req.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) || !strings.Contains(req.GetErrorDetail().GetMessage(), tc.detail) {
			t.Errorf("%s: want NACK of %q at v1 containing %q, got %v", tc.name, nonce, tc.detail, req)
		}
	}
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "v1"}) {
		t.Errorf("NACKs changed state: %v", got)
	}
	if n := rejectCalls.Load(); n != 1 {
		t.Errorf("Reject called %d times, want 1 (only for the valid response)", n)
	}
}

func TestSotWSubscribeUnsubscribe(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{Node: testNode, Names: map[string][]string{xdstype.Endpoint.URL(): {"a"}}})
	start(t, c, conn)
	fs := srv.nextStream(t)
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), ResourceNames: []string{"a"}}, fs.nextSotW(t))
	fs.send(t, sotwResp(xdstype.Endpoint.URL(), "v1", "n1", cla(t, "a", "10.0.0.1")))
	fs.nextSotW(t)

	if err := c.Subscribe(xdstype.Endpoint.URL(), "b"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), VersionInfo: "v1", ResponseNonce: "n1", ResourceNames: []string{"a", "b"}}, fs.nextSotW(t))
	if err := c.Subscribe(xdstype.Endpoint.URL(), "b", "a"); err != nil { // nothing new: nothing sent
		t.Fatal(err)
	}
	fs.quiet(t, 200*time.Millisecond)

	fs.send(t, sotwResp(xdstype.Endpoint.URL(), "v2", "n2", cla(t, "b", "10.0.0.2")))
	fs.nextSotW(t)
	waitState(t, c, xdstype.Endpoint.URL(), map[string]string{"a": "v1", "b": "v2"})

	if err := c.Unsubscribe(xdstype.Endpoint.URL(), "a"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), VersionInfo: "v2", ResponseNonce: "n2", ResourceNames: []string{"b"}}, fs.nextSotW(t))
	if got := versions(c.State(xdstype.Endpoint.URL())); !cmp.Equal(got, map[string]string{"b": "v2"}) {
		t.Errorf("unsubscribed resource still held: %v", got)
	}

	// A new type opened mid-stream starts from scratch.
	if err := c.Subscribe(xdstype.Listener.URL(), Wildcard); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Listener.URL()}, fs.nextSotW(t))
	// Names added to a wildcard subscription carry the wildcard explicitly.
	if err := c.Subscribe(xdstype.Listener.URL(), "extra"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Listener.URL(), ResourceNames: []string{"*", "extra"}}, fs.nextSotW(t))

	// Unsubscribing the last name sends an empty list and drops everything held.
	if err := c.Unsubscribe(xdstype.Endpoint.URL(), "b"); err != nil {
		t.Fatal(err)
	}
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), VersionInfo: "v2", ResponseNonce: "n2"}, fs.nextSotW(t))
	if got := c.State(xdstype.Endpoint.URL()); len(got) != 0 {
		t.Errorf("held after unsubscribing all: %v", got)
	}
}

func TestSotWReconnectKeepsStateAndVersion(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{Node: testNode, Types: []string{xdstype.Cluster.URL()}, Wildcard: map[string]bool{xdstype.Cluster.URL(): true}})
	r := start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextSotW(t)
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v1", "n1", cluster(t, "c1")))
	fs.nextSotW(t)

	fs.end <- status.Error(codes.Unavailable, "control plane restarting")
	if err := r.result(t); status.Code(err) != codes.Unavailable {
		t.Fatalf("Run returned %v, want Unavailable", err)
	}
	if got := versions(c.State(xdstype.Cluster.URL())); !cmp.Equal(got, map[string]string{"c1": "v1"}) {
		t.Fatalf("state lost on disconnect: %v", got)
	}

	// Subscribing while disconnected is remembered and sent with the next stream's first requests.
	if err := c.Subscribe(xdstype.Endpoint.URL(), "e"); err != nil {
		t.Fatal(err)
	}

	// Like Envoy: the last accepted version, no nonce (nonces belong to a stream).
	start(t, c, conn)
	fs = srv.nextStream(t)
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), VersionInfo: "v1"}, fs.nextSotW(t))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Endpoint.URL(), ResourceNames: []string{"e"}}, fs.nextSotW(t))
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v2", "m1", cluster(t, "c2")))
	wantReq(t, &discoveryv3.DiscoveryRequest{Node: testNode, TypeUrl: xdstype.Cluster.URL(), VersionInfo: "v2", ResponseNonce: "m1"}, fs.nextSotW(t))
	waitState(t, c, xdstype.Cluster.URL(), map[string]string{"c2": "v2"})
}

func TestSotWWrappedResources(t *testing.T) {
	srv, conn := startServer(t)
	c := New(Config{Wildcard: map[string]bool{xdstype.Cluster.URL(): true}})
	start(t, c, conn)
	fs := srv.nextStream(t)
	fs.nextSotW(t)
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v1", "n1",
		mustAny(t, &discoveryv3.Resource{Name: "c1", Resource: cluster(t, "c1")}), cluster(t, "c2")))
	fs.nextSotW(t)
	// A heartbeat (wrapped, no payload) keeps c1 as held; c2 is omitted, so deleted.
	fs.send(t, sotwResp(xdstype.Cluster.URL(), "v2", "n2", mustAny(t, &discoveryv3.Resource{Name: "c1"})))
	if req := fs.nextSotW(t); req.GetErrorDetail() != nil {
		t.Fatalf("heartbeat NACKed: %v", req.GetErrorDetail())
	}
	held := c.State(xdstype.Cluster.URL())
	if got := versions(held); !cmp.Equal(got, map[string]string{"c1": "v1"}) {
		t.Fatalf("state: %v", got)
	}
	if cl, err := Decode[*clusterv3.Cluster](held["c1"]); err != nil || cl.GetName() != "c1" {
		t.Errorf("Decode: %v, %v", cl, err)
	}
	if _, err := Decode[*clusterv3.Cluster](Held{}); err == nil {
		t.Error("Decode of a payload-less resource succeeded")
	}
	if _, err := Decode[*discoveryv3.Resource](held["c1"]); err == nil {
		t.Error("Decode into the wrong type succeeded")
	}
}

func TestRunEnds(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		srv, conn := startServer(t)
		c := New(Config{Wildcard: map[string]bool{xdstype.Cluster.URL(): true}})
		r := start(t, c, conn)
		srv.nextStream(t).nextSotW(t) // the server never answers
		if err := c.Run(t.Context(), conn); !errors.Is(err, errRunning) {
			t.Errorf("second concurrent Run: %v, want errRunning", err)
		}
		began := time.Now()
		r.cancel()
		if err := r.result(t); status.Code(err) != codes.Canceled {
			t.Errorf("Run returned %v, want Canceled", err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("Run took %v to return after cancel", d)
		}
		if c.Running() || status.Code(c.Err()) != codes.Canceled {
			t.Errorf("Running=%v Err=%v after Run returned", c.Running(), c.Err())
		}
	})
	t.Run("refused", func(t *testing.T) {
		srv, conn := startServer(t)
		c := New(Config{Protocol: Delta, Wildcard: map[string]bool{xdstype.Cluster.URL(): true}})
		r := start(t, c, conn)
		fs := srv.nextStream(t)
		fs.nextDelta(t)
		fs.end <- status.Error(codes.FailedPrecondition, "scope ns/x speaks SotW")
		err := r.result(t)
		if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || st.Message() != "scope ns/x speaks SotW" {
			t.Errorf("Run returned %v, want the server's FailedPrecondition", err)
		}
	})
}
