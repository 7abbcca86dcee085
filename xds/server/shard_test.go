package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// scopeOfShard is the first scope of namespace shop, named scope-<i>, that
// shard want of count owns.
func scopeOfShard(want, count int) model.Key {
	for i := 0; ; i++ {
		k := model.Key{Namespace: "shop", Name: fmt.Sprintf("scope-%d", i)}
		if shard.Of(k, count) == want {
			return k
		}
	}
}

// shardPlane serves, in plaintext to anonymous proxies, shard opts.Shards
// holding scope own, which selects namespace shop with Service one; open
// opens a SotW stream naming a scope and returns how it ends: nil when it
// is answered.
func shardPlane(t *testing.T, opts server.Options, own model.Key) (p *pipeline.Pipeline, open func(model.Key) error) {
	t.Helper()
	opts.Authenticator = &auth.Authenticator{AllowAnonymous: true}
	p = pipeline.New(pipeline.Options{Server: opts})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(&model.Scope{Key: own, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
		Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}}})
	p.Sync()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = p.Server.ServeListener(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return p, func(key model.Key) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", key.String()), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_, err = s.Recv()
		return err
	}
}

// TestStreamOfAnotherShardIsToldWhereToGo serves as shard 1 of 3. A stream
// naming a scope of shard 2 is refused with FailedPrecondition naming shard
// 2's address, and counted WrongShard for no scope, even when no such
// scope exists here; a stream of shard 1's scope is served.
func TestStreamOfAnotherShardIsToldWhereToGo(t *testing.T) {
	own, other := scopeOfShard(1, 3), scopeOfShard(2, 3)
	p, open := shardPlane(t, server.Options{Shards: shard.Shards{Index: 1, Addresses: []string{"xds-0.system.svc:18000", "xds-1.system.svc:18000", "xds-2.system.svc:18000"}}}, own)
	if err := open(own); err != nil {
		t.Fatalf("a stream of this shard's scope %s: %v", own, err)
	}
	st := status.Convert(open(other))
	want := fmt.Sprintf(`ProxyScope %q is served by shard 2 of 3, at xds-2.system.svc:18000; this replica is shard 1: point the proxy's xDS server at xds-2.system.svc:18000 (the scope's bootstrap ConfigMap names it; a proxy reads its bootstrap when it starts)`, other.String())
	if st.Code() != codes.FailedPrecondition || st.Message() != want {
		t.Fatalf("a stream of shard 2's scope ended with %v %q,\nwant %v %q", st.Code(), st.Message(), codes.FailedPrecondition, want)
	}
	if n := p.Feedback.Get(model.Key{}).Refused[server.RefusedWrongShard]; n != 1 {
		t.Errorf("%d refusals counted %s, want 1", n, server.RefusedWrongShard)
	}
	if r := p.Feedback.Get(other).Refused; len(r) != 0 {
		t.Errorf("the other shard's scope counts refusals %v here, want none", r)
	}
}

// TestPeerAddressProxyOfAnotherShardIsToldWhereToGo serves as shard 1 of 3
// with the peer-address method, holding no scope of namespace shop. A
// proxy without a credential, of a Pod of shop, naming a scope of shard 2
// that admits it, is let on to its first request and told shard 2's
// address; without OtherShardsAdmit it would be refused before it, as
// admitted by no scope.
func TestPeerAddressProxyOfAnotherShardIsToldWhereToGo(t *testing.T) {
	ca := authtest.NewCA(t, "proxies")
	pods := holders{netip.MustParseAddr("127.0.0.1"): {{Namespace: "shop", Name: "client", UID: "u1", ServiceAccount: "grpc", Running: true}}}
	shards := shard.Shards{Index: 1, Addresses: []string{"xds-0:18000", "xds-1:18000", "xds-2:18000"}}
	other := scopeOfShard(2, 3)
	for _, tc := range []struct {
		name        string
		otherShards func(*auth.Identity) bool
		code        codes.Code
		refused     string
	}{
		{"another shard's scope admits it", func(id *auth.Identity) bool { return id.Namespace == "shop" }, codes.FailedPrecondition, server.RefusedWrongShard},
		{"no scope of any shard admits it", func(*auth.Identity) bool { return false }, codes.PermissionDenied, server.RefusedNotAdmitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), nil), PeerAddress: true, Pods: pods}
			p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a, Shards: shards, OtherShardsAdmit: tc.otherShards}})
			p.Sync()
			ap := &authnPlane{p: p, addr: testkit.ServeTLS(t, p.Server.ServeListener, ca.ServerTLS()), ca: ca}
			st := status.Convert(ap.open(t, other.String(), nil, nil, ""))
			if st.Code() != tc.code || (tc.code == codes.FailedPrecondition && !strings.Contains(st.Message(), "served by shard 2 of 3, at xds-2:18000")) {
				t.Fatalf("ended with %v %q, want %v", st.Code(), st.Message(), tc.code)
			}
			if n := p.Feedback.Get(model.Key{}).Refused[tc.refused]; n != 1 {
				t.Errorf("refusals %v, want one %s", p.Feedback.Get(model.Key{}).Refused, tc.refused)
			}
		})
	}
}

// TestStreamOfAnotherShardGivesItsPaceBack opens, on a replica whose pace
// admits one new stream and then none for hours, first a stream of another
// shard's scope, then one of its own: the first gives its share of the pace
// back, so that proxies left on the wrong shard, which retry for as long as
// they run, do not keep the shard's own proxies out.
func TestStreamOfAnotherShardGivesItsPaceBack(t *testing.T) {
	own, other := scopeOfShard(1, 2), scopeOfShard(0, 2)
	_, open := shardPlane(t, server.Options{Shards: shard.Shards{Index: 1, Addresses: []string{"xds-0:18000", "xds-1:18000"}}, NewStreamsPerSecond: 1e-4, NewStreamsBurst: 1}, own)
	if code := status.Code(open(other)); code != codes.FailedPrecondition {
		t.Fatalf("the other shard's stream ended with %v, want FailedPrecondition", code)
	}
	if err := open(own); err != nil {
		t.Fatalf("this shard's stream after it: %v", err)
	}
	if code := status.Code(open(own)); code != codes.ResourceExhausted {
		t.Errorf("a second stream of this shard ended with %v, want ResourceExhausted: the pace is spent", code)
	}
}

// TestStreamsOfAnotherShardSpendTheAddressBudget opens, from one address,
// streams of another shard's scope: each spends the address's budget of
// failed streams, as a failed authentication does, so that with the
// replica's pace given back a client still cannot open them without bound.
func TestStreamsOfAnotherShardSpendTheAddressBudget(t *testing.T) {
	own, other := scopeOfShard(1, 2), scopeOfShard(0, 2)
	p, open := shardPlane(t, server.Options{Shards: shard.Shards{Index: 1, Addresses: []string{"xds-0:18000", "xds-1:18000"}},
		UnauthenticatedStreamsPerPeerPerSecond: 1e-4, UnauthenticatedStreamsPerPeerBurst: 2}, own)
	for i := range 2 {
		if code := status.Code(open(other)); code != codes.FailedPrecondition {
			t.Fatalf("the other shard's stream %d ended with %v, want FailedPrecondition", i+1, code)
		}
	}
	if code := status.Code(open(other)); code != codes.ResourceExhausted {
		t.Fatalf("a third stream of the other shard ended with %v, want ResourceExhausted: the address spent its budget", code)
	}
	if n := p.Feedback.Get(model.Key{}).Refused[server.RefusedPeerPaced]; n != 1 {
		t.Errorf("refusals %v, want one %s", p.Feedback.Get(model.Key{}).Refused, server.RefusedPeerPaced)
	}
}
