package conformance

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestProxiesOfOneNodeIDAreToldApartByPeer: every gRPC client of a scope
// has the node id its shared bootstrap gives, so the report tells two of
// them apart by the address their stream came from, NACK entries included.
func TestProxiesOfOneNodeIDAreToldApartByPeer(t *testing.T) {
	p := world(t, model.SotW)
	good := p.connect(testkit.WildcardClient(adsclient.SotW, testkit.Node("gw-grpc", "shop/gw")))
	synced(good, "shop/a:80", "shop/b:80", "shop/c:80")

	// The second client has a connection of its own, as a second pod would.
	conn, err := grpc.NewClient(p.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("gw-grpc", "shop/gw"))
	cfg.Reject = rejectOnce(xdstype.Cluster.URL(), "cluster shop/a:80: bad timeout")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- adsclient.New(cfg).Run(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && status.Code(err) != codes.Canceled {
			t.Errorf("the second client ended with %v", err)
		}
	})

	key := model.Key{Namespace: "shop", Name: "gw"}
	testkit.Eventually(t, "two proxies, one NACK", func() (bool, string) {
		r := p.Feedback.Get(key)
		return len(r.Proxies) == 2 && len(r.NACKs) == 1, fmt.Sprintf("%d proxies, %d NACKs", len(r.Proxies), len(r.NACKs))
	})
	r := p.Feedback.Get(key)
	peers := map[string]bool{}
	var rejecting string
	for _, px := range r.Proxies {
		if px.Node != "gw-grpc" || px.Peer == "" {
			t.Errorf("proxy %q has peer %q", px.Node, px.Peer)
		}
		peers[px.Peer] = true
		if _, ok := px.LastNACK[xdstype.Cluster.URL()]; ok {
			rejecting = px.Peer
		}
	}
	if len(peers) != 2 {
		t.Errorf("two clients of one node id on two connections have peers %v, want two distinct", peers)
	}
	if n := r.NACKs[0]; n.Peer == "" || n.Peer != rejecting {
		t.Errorf("the NACK entry names peer %q; the rejecting proxy is %q", n.Peer, rejecting)
	}
}
