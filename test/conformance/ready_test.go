package conformance

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestNoPartialWorld loads a world while the builder runs, as the operator
// does during its initial sync: the catalog holds half the world for a
// while (the builder waits for the sync before it builds anything). Until
// the first build after the sync, both protocols are refused with
// Unavailable, and a SotW proxy that kept retrying meanwhile receives, as
// its first CDS, every Service: for SotW an omitted cluster is a deleted
// one.
func TestNoPartialWorld(t *testing.T) {
	p := newPlane(t)
	synced := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = p.Run(ctx, synced) }()

	const services = 200
	p.Catalog.UpsertScope(envoyScope("shop", "gw", model.SotW))
	p.Catalog.UpsertScope(envoyScope("shop", "gwd", model.Delta))
	for i := range services / 2 {
		p.Catalog.UpsertService(testkit.Service("shop", fmt.Sprintf("s%03d", i), "10.0.0.1"))
	}
	// The catalog holds the first half: a proxy let in now would get it,
	// from a builder that built it.
	for _, pr := range []struct {
		client adsclient.Protocol
		scope  string
	}{{adsclient.SotW, "shop/gw"}, {adsclient.Delta, "shop/gwd"}} {
		px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("early", pr.scope)))
		px.wait("the early stream to end or be served", func(c *adsclient.Client) bool {
			return c.Err() != nil || len(c.State(xdstype.Cluster.URL())) > 0
		})
		if err := px.Err(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not ready") {
			t.Errorf("a %s stream opened before the first build was not refused as not ready: %v; it holds %d of %d clusters",
				pr.client, err, len(px.State(xdstype.Cluster.URL())), services)
		}
		px.stop()
	}

	// A SotW proxy that retries, as Envoy does, from before the world is whole.
	var (
		mu       sync.Mutex
		firstCDS []string
	)
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("retrying", "shop/gw"))
	cfg.OnEvent = func(e adsclient.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.TypeURL == xdstype.Cluster.URL() && firstCDS == nil {
			firstCDS = append([]string{}, e.Names...)
		}
	}
	retrying := adsclient.New(cfg)
	rctx, rcancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for rctx.Err() == nil {
			_ = retrying.Run(rctx, p.conn)
			select {
			case <-rctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { rcancel(); <-stopped })

	for i := services / 2; i < services; i++ {
		p.Catalog.UpsertService(testkit.Service("shop", fmt.Sprintf("s%03d", i), "10.0.0.1"))
	}
	close(synced)
	<-p.Builder.Built()

	testkit.Eventually(t, "the retrying proxy holds every cluster", func() (bool, string) {
		n := len(retrying.State(xdstype.Cluster.URL()))
		return n == services, fmt.Sprintf("%d clusters", n)
	})
	mu.Lock()
	got := len(firstCDS)
	mu.Unlock()
	if got != services {
		t.Errorf("the first CDS response a SotW proxy received held %d of the %d Services: the rest were deleted on the proxy", got, services)
	}
	for _, pr := range protocols {
		px := p.connect(testkit.WildcardClient(pr.client, testkit.Node("late", map[adsclient.Protocol]string{adsclient.SotW: "shop/gw", adsclient.Delta: "shop/gwd"}[pr.client])))
		px.wait("a stream opened once ready is served everything", func(c *adsclient.Client) bool {
			return len(c.State(xdstype.Cluster.URL())) == services
		})
	}
}
