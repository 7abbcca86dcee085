package server_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestUsageKeepsOnlyServedNames subscribes a stream by name to the one
// Service its scope serves and to 100 made-up ones, then ends it: the
// scope's usage, which outlives the stream by the cost window, names the
// served Service and none of the made-up ones.
func TestUsageKeepsOnlyServedNames(t *testing.T) {
	key := model.Key{Namespace: "default", Name: "sotw"}
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}}})
	p.Catalog.UpsertService(testkit.Service("default", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(&model.Scope{
		Key: key, Protocol: model.SotW,
		Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
		Selections: []model.Selection{{Namespace: "default", Selector: labels.Everything()}},
	})
	p.Sync()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Server.ServeListener(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()

	names := []string{"default/one:80"}
	for i := range 100 {
		names = append(names, fmt.Sprintf("default/made-up-%03d:80", i))
	}
	sctx, end := context.WithCancel(ctx)
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", key.String()), TypeUrl: xdstype.Endpoint.URL(), ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	end()
	testkit.Eventually(t, "the stream gone from the scope's report", func() (bool, string) {
		n := len(p.Feedback.Get(key).Proxies)
		return n == 0, fmt.Sprintf("%d proxies", n)
	})
	u := p.Feedback.Get(key).Usage
	if !u.Services[model.Key{Namespace: "default", Name: "one"}] {
		t.Errorf("the usage lacks the served Service default/one: %v", u.Services)
	}
	if len(u.Services) != 1 {
		t.Errorf("the usage keeps %d Services after the stream ended, want the 1 served: made-up names are kept for the cost window", len(u.Services))
	}
}
