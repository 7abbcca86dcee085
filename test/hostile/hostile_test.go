// Package hostile replays what a hostile or broken client does to the ADS
// server, against the real server over loopback with the production
// limits, on a 2,000-Service world. Each attack must be refused with the
// status that names its limit, must leave the heap where it found it once
// the server dropped the attack's streams, and must not stop a legitimate
// SotW and delta proxy on the same server from converging.
package hostile

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

const (
	services = 2000
	// heapBound is how much an attack may leave on the heap once its
	// streams are gone: far below what any attack sends (30 MiB requests,
	// thousands of streams), above what the Service each row adds costs and
	// what the runtime keeps once for thousands of goroutines (the first
	// row that runs 2,000 streams at once grows the heap by ~4 MiB; run
	// again, it grows it by nothing).
	heapBound = 8 << 20
	// firstRequestTimeout shortens the production 15 s so the silent row
	// does not wait for it, and stays above what the rows' requests of up
	// to 30 MiB take to arrive on a loaded machine (500 ms did not); every
	// other limit is the production default.
	firstRequestTimeout = 3 * time.Second
	// sendTimeout shortens the production 30 s the same way, for the row
	// of streams that do not read.
	sendTimeout = 2 * time.Second
	// slowReaderBound is what one stream that subscribed to every cluster
	// and then stopped reading may make the server hold until the send
	// timeout ends it: its own bookkeeping of what the proxy holds, not a
	// copy of the clusters (a 2,000-cluster response pinned a 1 MiB buffer
	// per stream before responses referred to the shared bytes).
	slowReaderBound = 256 << 10
)

// plane is the server under attack, with the two proxies that must keep working.
type plane struct {
	*pipeline.Pipeline
	t     *testing.T
	addr  string
	sotw  *adsclient.Client
	delta *adsclient.Client
	rows  int
}

func scope(name string, p model.Protocol) *model.Scope {
	return &model.Scope{
		Key: model.Key{Namespace: "default", Name: name}, Protocol: p,
		Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
		Selections: []model.Selection{{Namespace: "default", Selector: labels.Everything()}},
	}
}

func start(t *testing.T) *plane {
	p := &plane{t: t, Pipeline: pipeline.New(pipeline.Options{Server: server.Options{FirstRequestTimeout: firstRequestTimeout, SendTimeout: sendTimeout, Authenticator: &auth.Authenticator{AllowAnonymous: true}}})}
	for i := range services {
		p.Catalog.UpsertService(testkit.Service("default", fmt.Sprintf("svc-%04d", i), "10.0.0.1", "10.0.0.2"))
	}
	p.Catalog.UpsertScope(scope("sotw", model.SotW))
	p.Catalog.UpsertScope(scope("delta", model.Delta))
	p.Sync()
	p.addr = serve(t, p.Pipeline)
	conn := p.dial()
	t.Cleanup(func() { _ = conn.Close() })
	p.sotw = p.legitimate(conn, adsclient.SotW, "default/sotw")
	p.delta = p.legitimate(conn, adsclient.Delta, "default/delta")
	p.converge()
	return p
}

// dial opens a connection the caller closes: an attack's connections
// are closed before the heap is measured, and nothing keeps them after.
func (p *plane) dial() *grpc.ClientConn {
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	return conn
}

func (p *plane) legitimate(conn *grpc.ClientConn, proto adsclient.Protocol, scope string) *adsclient.Client {
	cfg := testkit.WildcardClient(proto, testkit.Node("legitimate-"+proto.String(), scope))
	cfg.RecordEvents = false
	c := adsclient.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, conn) }()
	p.t.Cleanup(func() { cancel(); <-done })
	return c
}

// converge adds a Service and waits until both legitimate proxies, on the
// streams they opened before the first attack, hold its cluster.
func (p *plane) converge() {
	p.t.Helper()
	p.rows++
	name := fmt.Sprintf("row-%02d", p.rows)
	p.Catalog.UpsertService(testkit.Service("default", name, "10.0.1.1"))
	p.Sync()
	cluster := "default/" + name + ":80"
	for _, c := range []*adsclient.Client{p.sotw, p.delta} {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
		err := c.WaitFor(ctx, func(c *adsclient.Client) bool {
			_, ok := c.State(xdstype.Cluster.URL())[cluster]
			return ok || !c.Running()
		})
		cancel()
		if _, ok := c.State(xdstype.Cluster.URL())[cluster]; !ok {
			p.t.Fatalf("a legitimate proxy did not converge to %s: %v (stream: %v)", cluster, err, c.Err())
		}
	}
	// Settled: each scope has its legitimate proxy only, and it has ACKed
	// the whole version, so nothing is in flight when the heap is measured.
	for _, name := range []string{"sotw", "delta"} {
		key := model.Key{Namespace: "default", Name: name}
		testkit.Eventually(p.t, "the legitimate proxy of "+name+" at the scope's version", func() (bool, string) {
			var version string
			p.Store.Get(key).Read(func(v snapshot.View) { version = v.Version() })
			r := p.Feedback.Get(key)
			var at []string
			for _, px := range r.Proxies {
				at = append(at, px.Node+"@"+px.AtVersion)
			}
			return len(r.Proxies) == 1 && len(at) == 1 && strings.HasSuffix(at[0], "@"+version), fmt.Sprintf("%v, scope at %s", at, version)
		})
	}
}

// heap is the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func node(id, scope string) *corev3.Node {
	return testkit.Node(id, scope)
}

// codes collects the statuses the attack's streams ended with.
type outcome struct {
	mu    sync.Mutex
	codes map[codes.Code]int
	msgs  []string
}

func (o *outcome) add(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.codes == nil {
		o.codes = map[codes.Code]int{}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	o.codes[code]++
	// The first message of every code is kept, so that a row failing
	// with an unexpected code says which refusal it met.
	if len(o.msgs) < 4 || o.codes[code] == 1 {
		o.msgs = append(o.msgs, status.Convert(err).Message())
	}
}

func (o *outcome) String() string {
	var parts []string
	for c, n := range o.codes {
		parts = append(parts, fmt.Sprintf("%s×%d", c, n))
	}
	return strings.Join(parts, " ")
}

// sotwOnce opens a SotW stream, sends reqs and returns how it ended.
func sotwOnce(ctx context.Context, conn *grpc.ClientConn, reqs ...*discoveryv3.DiscoveryRequest) error {
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	for _, r := range reqs {
		if s.Send(r) != nil {
			break
		}
	}
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// parallel runs n attacks, at most width at a time.
func parallel(n, width int, fn func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); defer func() { <-sem }(); fn(i) }()
	}
	wg.Wait()
}

type row struct {
	name string
	// want is the code the attack's streams end with, and says what their
	// status message contains.
	want   codes.Code
	says   string
	reason string // counted refusal reason, if any
	count  int    // streams it must count
	attack func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome)
}

func refusals(reason string) float64 {
	return testutil.ToFloat64(metrics.Refusals.WithLabelValues("", reason)) +
		testutil.ToFloat64(metrics.Refusals.WithLabelValues("default/sotw", reason)) +
		testutil.ToFloat64(metrics.Refusals.WithLabelValues("default/delta", reason))
}

func TestHostileClients(t *testing.T) {
	p := start(t)
	var table strings.Builder
	fmt.Fprintf(&table, "\n| attack | code | heap before → after (growth) |\n|---|---|---|\n")
	for _, r := range rows() {
		ok := t.Run(r.name, func(t *testing.T) {
			goroutines := runtime.NumGoroutine()
			before := heap()
			counted := 0.0
			if r.reason != "" {
				counted = refusals(r.reason)
			}
			conn := p.dial()
			var o outcome
			// A stream the server fails to end makes the row fail (with the
			// client's DeadlineExceeded) instead of hanging the suite.
			ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
			r.attack(ctx, t, p, conn, &o)
			cancel()
			_ = conn.Close()
			testkit.Eventually(t, "the server dropped the attack's streams", func() (bool, string) {
				n := runtime.NumGoroutine()
				return n <= goroutines+5, fmt.Sprintf("%d goroutines, %d before", n, goroutines)
			})
			// What the server still holds once the attack is over, polled:
			// on a loaded machine the last responses and the stream's
			// buffers can outlive the goroutines for a moment, while a real
			// leak stays and fails the row at the timeout.
			var after uint64
			var growth int64
			testkit.Eventually(t, "the heap back within the bound", func() (bool, string) {
				after = heap()
				growth = int64(after) - int64(before)
				return growth <= heapBound, fmt.Sprintf("the heap grew by %d bytes, more than %d", growth, heapBound)
			})
			fmt.Fprintf(&table, "| %s | %s | %.1f → %.1f MiB (%+.2f MiB) |\n", r.name, o.String(),
				float64(before)/(1<<20), float64(after)/(1<<20), float64(growth)/(1<<20))
			if len(o.codes) != 1 || o.codes[r.want] == 0 {
				t.Errorf("the attack's streams ended with %s, want only %s; messages: %q", o.String(), r.want, o.msgs)
			}
			for _, m := range o.msgs {
				if !strings.Contains(m, r.says) {
					t.Errorf("a refusal message does not say %q: %.300q", r.says, m)
				}
				if len(m) > 1024 {
					t.Errorf("a refusal message is %d bytes long: %.200q…", len(m), m)
				}
			}
			if r.reason != "" {
				if got := refusals(r.reason) - counted; got < float64(r.count) {
					t.Errorf("scopeplane_xds_refusals_total{reason=%q} rose by %v, want %d", r.reason, got, r.count)
				}
			}
			p.converge()
		})
		if !ok {
			break
		}
	}
	t.Log(table.String())
}

func rows() []row {
	return []row{
		{name: "delta stream, 100k new names per request", says: "--xds-extra-names-per-type", want: codes.ResourceExhausted, reason: server.RefusedTooManyNames, count: 1,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for r := range 5 {
					names := make([]string, 100_000)
					for i := range names {
						names[i] = fmt.Sprintf("default/made-up-%d-%06d:80", r, i)
					}
					req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResourceNamesSubscribe: names}
					if r == 0 {
						req.Node = node("greedy", "default/delta")
					}
					if s.Send(req) != nil {
						break
					}
				}
				for {
					if _, err := s.Recv(); err != nil {
						o.add(err)
						return
					}
				}
			}},
		{name: "3 SotW streams, 4 types × 100k names of 300 B", says: "larger than max", want: codes.ResourceExhausted, reason: server.RefusedRequestTooLarge, count: 3,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				names := make([]string, 100_000)
				pad := strings.Repeat("x", 290)
				for i := range names {
					names[i] = fmt.Sprintf("%s%08d", pad, i)
				}
				parallel(3, 3, func(i int) {
					var reqs []*discoveryv3.DiscoveryRequest
					for _, u := range xdstype.URLs() {
						reqs = append(reqs, &discoveryv3.DiscoveryRequest{Node: node("wide", "default/sotw"), TypeUrl: u, ResourceNames: names})
					}
					o.add(sotwOnce(ctx, conn, reqs...))
				})
			}},
		{name: "10 streams with a 3 MiB node.id", says: "--xds-max-node-id-bytes", want: codes.InvalidArgument, reason: server.RefusedNodeTooLarge, count: 10,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				id := strings.Repeat("n", 3<<20)
				parallel(10, 10, func(int) {
					o.add(sotwOnce(ctx, conn, &discoveryv3.DiscoveryRequest{Node: node(id, "default/sotw"), TypeUrl: xdstype.Cluster.URL()}))
				})
			}},
		{name: "8 concurrent 3 MiB scope values", says: "--xds-max-node-bytes", want: codes.InvalidArgument, reason: server.RefusedNodeTooLarge, count: 8,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				value := strings.Repeat("Ä", 3<<19)
				parallel(8, 8, func(int) {
					o.add(sotwOnce(ctx, conn, &discoveryv3.DiscoveryRequest{Node: scopeNode("huge", value), TypeUrl: xdstype.Cluster.URL()}))
				})
			}},
		{name: "8 concurrent 60 KiB invalid scope values", says: "is not \"<namespace>/<name>\"", want: codes.InvalidArgument, reason: feedback.RefusedNoScope, count: 8,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				value := "default/" + strings.Repeat("Ä", 30<<10)
				parallel(8, 8, func(int) {
					o.add(sotwOnce(ctx, conn, &discoveryv3.DiscoveryRequest{Node: scopeNode("odd", value), TypeUrl: xdstype.Cluster.URL()}))
				})
			}},
		{name: "2,000 streams that never send", says: "--xds-first-request-timeout", want: codes.DeadlineExceeded, reason: server.RefusedSilent, count: 2000,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				// A connection each from 100 addresses: 100 streams per
				// connection and 32 per client are the server's limits.
				conns := make([]*grpc.ClientConn, 100)
				for i := range conns {
					c, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(fmt.Sprintf("127.0.3.%d", i+1))))
					if err != nil {
						t.Fatal(err)
					}
					conns[i] = c
				}
				parallel(2000, 2000, func(i int) { o.add(sotwOnce(ctx, conns[i%len(conns)])) })
				for _, c := range conns {
					_ = c.Close()
				}
			}},
		{name: "1,000 probes of unknown scopes", says: "which does not exist", want: codes.NotFound, reason: feedback.RefusedUnknownScope, count: 1000,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				scopes := len(p.Feedback.Connected())
				long := strings.Repeat("p", 240)
				// The probes are one client (anonymous at 127.0.0.1, with
				// the two legitimate proxies), which may hold 32 streams:
				// it sees a refusal only once the server released the
				// stream, so 16 at a time never meet that limit, however
				// slowly the server answers.
				parallel(1000, 16, func(i int) {
					o.add(sotwOnce(ctx, conn, &discoveryv3.DiscoveryRequest{
						Node: node("prober", fmt.Sprintf("probe/%s-%04d", long, i)), TypeUrl: xdstype.Cluster.URL(),
					}))
				})
				if got := len(p.Feedback.Connected()); got != scopes {
					t.Errorf("the tracker holds %d scopes after the probes, %d before", got, scopes)
				}
				if r := p.Feedback.Get(model.Key{Namespace: "probe", Name: long + "-0001"}); len(r.Refused) != 0 || len(r.Proxies) != 0 {
					t.Errorf("the tracker keeps a report for a probed scope: %+v", r.Refused)
				}
				for _, m := range o.msgs {
					if strings.Contains(m, long) {
						t.Errorf("a NotFound quotes the whole %d-byte name: %q", len(long), m)
					}
				}
			}},
		{name: "garbage protobuf", says: "failed to unmarshal", want: codes.Internal, reason: server.RefusedMalformed, count: 1,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
					"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources", grpc.ForceCodecV2(rawCodec{}))
				if err != nil {
					t.Fatal(err)
				}
				_ = s.SendMsg([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02})
				var out []byte
				o.add(s.RecvMsg(&out))
			}},
		{name: "delta reconnect claiming 50k names that do not exist", want: codes.OK,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// Names and versions shaped like served ones: namespace/service:port
				// and 16 hex digits.
				claims := make(map[string]string, 50_000)
				for i := range 50_000 {
					claims[fmt.Sprintf("default/gone-service-%05d:8080", i)] = fmt.Sprintf("%016x", i)
				}
				req := &discoveryv3.DeltaDiscoveryRequest{Node: node("returning", "default/delta"), TypeUrl: xdstype.Cluster.URL(),
					ResourceNamesSubscribe: []string{"*"}, InitialResourceVersions: claims}
				// What the request size limit allows a reconnect to claim.
				perClaim := float64(proto.Size(req)) / float64(len(claims))
				t.Logf("a delta reconnect claims %.0f bytes per resource: %d resources of one type fit in %d bytes",
					perClaim, int(float64(server.DefaultOptions.MaxRequestBytes)/perClaim), server.DefaultOptions.MaxRequestBytes)
				if perClaim > 64 {
					t.Errorf("a claim takes %.0f bytes; docs/troubleshooting.md says ~60", perClaim)
				}
				if err := s.Send(req); err != nil {
					t.Fatal(err)
				}
				resp, err := s.Recv()
				if err != nil {
					o.add(err)
					return
				}
				// Claims cost what the scope serves: the removal of only
				// --xds-extra-names-per-type names it does not serve is
				// announced (and remembered) per reconnect.
				if want := server.DefaultOptions.ExtraNamesPerType; len(resp.GetRemovedResources()) != want || len(resp.GetResources()) < services {
					t.Errorf("the reconnect was answered with %d resources and %d removals, want every cluster and %d removals",
						len(resp.GetResources()), len(resp.GetRemovedResources()), want)
				}
				_ = s.CloseSend()
				o.add(nil)
			}},
		{name: "subscribe/unsubscribe churn ×200", want: codes.OK,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				ended := make(chan error, 1)
				go func() {
					for {
						if _, err := s.Recv(); err != nil {
							ended <- err
							return
						}
					}
				}()
				names := make([]string, 500)
				for i := range names {
					names[i] = fmt.Sprintf("default/svc-%04d:80", i)
				}
				for i := range 200 {
					req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL()}
					if i == 0 {
						req.Node = node("churner", "default/delta")
					}
					if i%2 == 0 {
						req.ResourceNamesSubscribe = names
					} else {
						req.ResourceNamesUnsubscribe = names
					}
					if s.Send(req) != nil {
						break
					}
				}
				_ = s.CloseSend()
				o.add(<-ended)
			}},
		{name: "1,000 streams that subscribe to every cluster and never read", want: codes.OK, reason: server.RefusedSlowReader, count: 10,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				// A connection each from 40 addresses: 100 streams per
				// connection and 32 per client are the server's limits.
				const conns, perConn = 40, 25
				key := model.Key{Namespace: "default", Name: "sotw"}
				sent, silent, slow := p.Feedback.Get(key).Sent.Responses, refusals(server.RefusedSilent), refusals(server.RefusedSlowReader)
				before := heap()
				deadline, _ := ctx.Deadline()
				var ends []<-chan error
				for c := range conns {
					reqs := make([][]byte, perConn)
					for i := range reqs {
						reqs[i] = grpcMessage(&discoveryv3.DiscoveryRequest{Node: node(fmt.Sprintf("slow-%d-%d", c, i), "default/sotw"), TypeUrl: xdstype.Cluster.URL()})
					}
					ends = append(ends, slowReader(t, fmt.Sprintf("127.0.4.%d", c+1), p.addr, reqs, deadline))
				}
				// Each stream's first response goes to the transport at once
				// (gRPC takes one while the stream's window has room), where
				// it waits for window the client never grants.
				// On a loaded machine a stream may miss the shortened
				// first-request timeout; it is refused and holds nothing.
				// A stream that answers nothing for the send timeout is
				// ended with its connection, whose streams not yet served
				// never are.
				var served int64
				testkit.Eventually(t, "every slow stream was sent the clusters", func() (bool, string) {
					served = p.Feedback.Get(key).Sent.Responses - sent
					refused := int64(refusals(server.RefusedSilent) - silent)
					ended := refusals(server.RefusedSlowReader) > slow
					return served+refused >= conns*perConn && served >= conns*perConn*9/10 || ended && served >= conns*perConn/2,
						fmt.Sprintf("%d responses, %d refused", served, refused)
				})
				held := int64(heap()) - int64(before)
				t.Logf("%d streams that do not read hold %.1f MiB: %.0f KiB each", served, float64(held)/(1<<20), float64(held)/(1<<10)/float64(served))
				if held > slowReaderBound*served {
					t.Errorf("%d streams that do not read hold %d bytes, more than %d each", served, held, slowReaderBound)
				}
				// A change makes every stream's next response wait for the
				// client: after the send timeout the server ends the stream
				// and closes its connection. The legitimate proxies converge
				// meanwhile (converge waits for them, then for the slow
				// streams to be gone).
				p.converge()
				for _, e := range ends {
					if err := <-e; errors.Is(err, os.ErrDeadlineExceeded) {
						o.add(status.Error(codes.DeadlineExceeded, "the server kept the connection of streams that do not read"))
					} else {
						o.add(nil) // closed by the server
					}
				}
			}},
		{name: "a stream rejecting 2,000 responses as fast as it can", want: codes.OK,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				url := xdstype.Endpoint.URL()
				reported := func() float64 { return testutil.ToFloat64(metrics.NACKs.WithLabelValues("default/sotw", url)) }
				paced := func() float64 { return testutil.ToFloat64(metrics.NACKsPaced.WithLabelValues("default/sotw")) }
				reported0, paced0 := reported(), paced()
				s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				const nacks = 2000
				detail := strings.Repeat("attacker-chosen text ", 50)
				req := &discoveryv3.DiscoveryRequest{Node: node("nacker", "default/sotw"), TypeUrl: url, ResourceNames: []string{"default/svc-0000:80"}}
				start := time.Now()
				// Each rejection also names another Service, so that the
				// server answers it with a response to reject next.
				for i := range nacks + 1 {
					if err := s.Send(req); err != nil {
						break
					}
					resp, err := s.Recv()
					if err != nil {
						o.add(err)
						return
					}
					req = &discoveryv3.DiscoveryRequest{TypeUrl: url, ResponseNonce: resp.GetNonce(),
						ErrorDetail:   &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: detail},
						ResourceNames: []string{fmt.Sprintf("default/svc-%04d:80", (i+1)%2)}}
				}
				elapsed := time.Since(start)
				_ = s.CloseSend()
				for {
					if _, err := s.Recv(); err != nil {
						o.add(err)
						break
					}
				}
				got, skipped := reported()-reported0, paced()-paced0
				// The server took every rejection before answering it, so
				// the stream's pace had at most elapsed to refill.
				d := server.DefaultOptions
				most := float64(d.NACKBurst) + d.NACKsPerSecond*elapsed.Seconds() + 1
				t.Logf("%d rejections in %s: %v reported, %v paced", nacks, elapsed.Round(time.Millisecond), got, skipped)
				if got < 1 || got > most {
					t.Errorf("%v rejections were reported, want 1 to %.0f (the burst and the pace over %s)", got, most, elapsed)
				}
				if got+skipped != nacks {
					t.Errorf("%v reported + %v paced rejections, want %d", got, skipped, nacks)
				}
			}},
		{name: "5,000 streams reset at once (rapid reset)", want: codes.OK,
			attack: func(ctx context.Context, t *testing.T, p *plane, conn *grpc.ClientConn, o *outcome) {
				rapidReset(t, p.addr, 5000)
				o.add(nil)
			}},
	}
}

func scopeNode(id, value string) *corev3.Node {
	return &corev3.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		model.ScopeMetadataKey: structpb.NewStringValue(value),
	}}}
}

// TestNewStreamsArePaced runs a server whose pace admits three streams and
// then (practically) none: the fourth is refused with ResourceExhausted
// naming the flags, before anything of it is read.
func TestNewStreamsArePaced(t *testing.T) {
	_, conn := small(t, server.Options{NewStreamsPerSecond: 1e-6, NewStreamsBurst: 3})
	req := &discoveryv3.DiscoveryRequest{Node: node("n", "default/none"), TypeUrl: xdstype.Cluster.URL()}
	counted := refusals(server.RefusedPaced)
	for i := range 3 {
		if err := sotwOnce(context.Background(), conn, req); status.Code(err) != codes.NotFound {
			t.Fatalf("stream %d within the burst ended with %v, want NotFound (no such scope)", i+1, err)
		}
	}
	err := sotwOnce(context.Background(), conn, req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--xds-new-streams-per-second") {
		t.Fatalf("the stream beyond the burst ended with %v, want ResourceExhausted naming the pace", err)
	}
	if got := refusals(server.RefusedPaced) - counted; got != 1 {
		t.Errorf("scopeplane_xds_refusals_total{reason=\"Paced\"} rose by %v, want 1", got)
	}
}

// TestNewConnectionsArePaced runs a server whose pace admits three
// connections and then (practically) none: a legitimate proxy takes one,
// two of 20 raw TCP connections after it are served (the server sends its
// HTTP/2 SETTINGS), the other 18 are closed before the handshake and
// counted, and the proxy on its connection still converges.
func TestNewConnectionsArePaced(t *testing.T) {
	p, conn := small(t, server.Options{NewConnectionsPerSecond: 1e-6, NewConnectionsBurst: 3})
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("legitimate", "default/sotw"))
	cfg.RecordEvents = false
	c := adsclient.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, conn) }()
	defer func() { cancel(); <-done }()
	holds := func(cluster string) {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, testkit.Timeout)
		defer wcancel()
		if err := c.WaitFor(wctx, func(c *adsclient.Client) bool {
			_, ok := c.State(xdstype.Cluster.URL())[cluster]
			return ok
		}); err != nil {
			t.Fatalf("the legitimate proxy does not hold %s: %v (stream: %v)", cluster, err, c.Err())
		}
	}
	holds("default/one:80")

	counted := refusals(server.RefusedConnectionPaced)
	served := 0
	for range 20 {
		if handshakes(t, conn.Target()) {
			served++
		}
	}
	if served != 2 {
		t.Errorf("%d of 20 connections beyond the proxy's were served, want the 2 left of the burst", served)
	}
	if got := refusals(server.RefusedConnectionPaced) - counted; got != float64(20-served) {
		t.Errorf("scopeplane_xds_refusals_total{reason=\"ConnectionPaced\"} rose by %v, want %d", got, 20-served)
	}
	p.Catalog.UpsertService(testkit.Service("default", "two", "10.0.0.2"))
	p.Sync()
	holds("default/two:80")
}

// TestSlowReaderIsDisconnected opens one stream that subscribes to the
// clusters of a 2,000-Service scope and never grants window: gRPC takes
// the first response (the stream's write quota had room), writes the
// 64 KiB the window allows, and blocks the next one, which a change makes.
// After the send timeout the stream is ended, its connection closed, and
// the end counted.
func TestSlowReaderIsDisconnected(t *testing.T) {
	p := pipeline.New(pipeline.Options{Server: server.Options{SendTimeout: 200 * time.Millisecond, Authenticator: &auth.Authenticator{AllowAnonymous: true}}})
	for i := range services {
		p.Catalog.UpsertService(testkit.Service("default", fmt.Sprintf("svc-%04d", i), "10.0.0.1"))
	}
	key := model.Key{Namespace: "default", Name: "sotw"}
	p.Catalog.UpsertScope(scope("sotw", model.SotW))
	p.Sync()
	addr := serve(t, p)
	counted := refusals(server.RefusedSlowReader)
	ended := slowReader(t, legitimate, addr, [][]byte{grpcMessage(&discoveryv3.DiscoveryRequest{Node: node("slow", key.String()), TypeUrl: xdstype.Cluster.URL()})},
		time.Now().Add(testkit.Timeout))
	testkit.Eventually(t, "the stream was sent the clusters", func() (bool, string) {
		n := p.Feedback.Get(key).Sent.Responses
		return n == 1, fmt.Sprintf("%d responses", n)
	})
	p.Catalog.UpsertService(testkit.Service("default", "one-more", "10.0.0.2"))
	p.Sync()
	if err := <-ended; errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the server kept the connection of a stream that does not read")
	}
	if got := refusals(server.RefusedSlowReader) - counted; got != 1 {
		t.Errorf("scopeplane_xds_refusals_total{reason=\"SlowReader\"} rose by %v, want 1", got)
	}
	testkit.Eventually(t, "the stream gone from the scope's report", func() (bool, string) {
		n := len(p.Feedback.Get(key).Proxies)
		return n == 0, fmt.Sprintf("%d proxies", n)
	})
}

// TestSlowReaderIsDisconnectedOverTLS is TestSlowReaderIsDisconnected on
// a TLS port: the listener that closes a slow reader's connection sits
// below TLS and finds it by remote address all the same.
func TestSlowReaderIsDisconnectedOverTLS(t *testing.T) {
	p := pipeline.New(pipeline.Options{Server: server.Options{SendTimeout: 200 * time.Millisecond, Authenticator: &auth.Authenticator{AllowAnonymous: true}}})
	for i := range services {
		p.Catalog.UpsertService(testkit.Service("default", fmt.Sprintf("svc-%04d", i), "10.0.0.1"))
	}
	key := model.Key{Namespace: "default", Name: "sotw"}
	p.Catalog.UpsertScope(scope("sotw", model.SotW))
	p.Sync()
	cert, roots := selfSignedCert(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	go func() { served <- p.Server.ServeListener(ctx, lis, grpc.Creds(creds)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	addr := lis.Addr().String()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	counted := refusals(server.RefusedSlowReader)
	ended := slowReaderOn(t, c, addr, [][]byte{grpcMessage(&discoveryv3.DiscoveryRequest{Node: node("slow-tls", key.String()), TypeUrl: xdstype.Cluster.URL()})},
		time.Now().Add(testkit.Timeout))
	testkit.Eventually(t, "the stream was sent the clusters", func() (bool, string) {
		n := p.Feedback.Get(key).Sent.Responses
		return n == 1, fmt.Sprintf("%d responses", n)
	})
	p.Catalog.UpsertService(testkit.Service("default", "one-more", "10.0.0.2"))
	p.Sync()
	if err := <-ended; errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the server kept the TLS connection of a stream that does not read")
	}
	if got := refusals(server.RefusedSlowReader) - counted; got != 1 {
		t.Errorf("scopeplane_xds_refusals_total{reason=\"SlowReader\"} rose by %v, want 1", got)
	}
}

// selfSignedCert is a serving certificate for 127.0.0.1 and the pool that
// trusts it.
func selfSignedCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}

// handshakes connects to addr, sends the HTTP/2 preface and reports
// whether the server answered with its SETTINGS (false: it closed the
// connection).
func handshakes(t *testing.T, addr string) bool {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(testkit.Timeout))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return false
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return false
	}
	f, err := fr.ReadFrame()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server neither served nor closed a connection within %s", testkit.Timeout)
	}
	_, ok := f.(*http2.SettingsFrame)
	return err == nil && ok
}

// serve runs p's ADS server on a loopback port until the test ends and
// returns its address.
func serve(t *testing.T, p *pipeline.Pipeline) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Server.ServeListener(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// small serves a one-Service world, scope default/sotw, with opts.
func small(t *testing.T, opts server.Options) (*pipeline.Pipeline, *grpc.ClientConn) {
	t.Helper()
	opts.Authenticator = &auth.Authenticator{AllowAnonymous: true}
	p := pipeline.New(pipeline.Options{Server: opts})
	p.Catalog.UpsertService(testkit.Service("default", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(scope("sotw", model.SotW))
	p.Sync()
	conn, err := grpc.NewClient(serve(t, p), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return p, conn
}

// TestKeptNodeTextIsCut connects a proxy whose node cluster and user
// agent are long, within the node limit: the stream is served, and what is
// kept of them for its life is cut to 256 bytes each, on a rune boundary.
// (Text that is not UTF-8 never gets this far: gRPC's protobuf decoding
// refuses it.)
func TestKeptNodeTextIsCut(t *testing.T) {
	p, conn := small(t, server.Options{})
	long := strings.Repeat("aé", 5000)
	n := testkit.Node("long-node", "default/sotw")
	n.Cluster, n.UserAgentName = long, long
	n.UserAgentVersionType = &corev3.Node_UserAgentVersion{UserAgentVersion: long}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: n, TypeUrl: xdstype.Cluster.URL()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("a node with a long cluster and user agent was refused: %v", err)
	}
	r := p.Feedback.Get(model.Key{Namespace: "default", Name: "sotw"})
	if len(r.Proxies) != 1 {
		t.Fatalf("%d proxies connected, want 1", len(r.Proxies))
	}
	for _, px := range r.Proxies {
		if len(px.Cluster) > 256 || len(px.UserAgent) > 2*256+1 || !utf8.ValidString(px.Cluster) || !utf8.ValidString(px.UserAgent) {
			t.Errorf("kept cluster of %d bytes, user agent of %d bytes (valid UTF-8: %v, %v)",
				len(px.Cluster), len(px.UserAgent), utf8.ValidString(px.Cluster), utf8.ValidString(px.UserAgent))
		}
	}
}
