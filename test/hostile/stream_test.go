package hostile

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// streamSendTimeout is the send timeout of the rows below: long enough for
// a legitimate proxy to join and be pushed to while the attack's streams
// are open, short enough not to wait for the production 30 s.
const streamSendTimeout = 20 * time.Second

// startStream is start with the send timeout of the rows below.
func startStream(t *testing.T) *plane {
	p := &plane{t: t, Pipeline: pipeline.New(pipeline.Options{Server: server.Options{
		SendTimeout:   streamSendTimeout, // the production first-request timeout: a 3.5 MiB first request may take seconds to arrive here
		Authenticator: &auth.Authenticator{AllowAnonymous: true},
	}})}
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

// peak samples the heap in use until stop is called, which returns the
// largest sample: what the process held at the worst moment, garbage not
// yet collected included.
func peak() (stop func() uint64) {
	var (
		top  atomic.Uint64
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > top.Load() {
				top.Store(m.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return top.Load() }
}

// join connects a new wildcard proxy of scope and returns how long it took
// to hold every cluster, then disconnects it.
func (p *plane) join(proto adsclient.Protocol, scope string) time.Duration {
	p.t.Helper()
	conn := p.dial()
	defer func() { _ = conn.Close() }()
	cfg := testkit.WildcardClient(proto, testkit.Node("joining-"+proto.String(), scope))
	cfg.RecordEvents = false
	c := adsclient.New(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); _ = c.Run(ctx, conn) }()
	err := c.WaitFor(ctx, func(c *adsclient.Client) bool { return len(c.State(xdstype.Cluster.URL())) >= services })
	took := time.Since(start)
	cancel()
	<-done
	if err != nil {
		p.t.Fatalf("a legitimate %s proxy did not join during the attack: %v (stream: %v)", proto, err, c.Err())
	}
	return took
}

// TestStreamMemory replays what one admitted identity did to a replica's
// memory: delta streams claiming tens of thousands of made-up names and
// never reading, and a flood of NACKs with megabyte error details. The heap
// must stay within a few MiB of where it was, legitimate proxies must join
// and be pushed to meanwhile, and the streams that read nothing must end
// after the send timeout although nothing in the scope changes.
func TestStreamMemory(t *testing.T) {
	p := startStream(t)
	var table strings.Builder
	fmt.Fprintf(&table, "\n| attack | ended | live heap growth | peak heap in use | join during it | push during it |\n|---|---|---|---|---|---|\n")
	key := model.Key{Namespace: "default", Name: "delta"}

	t.Run("20 delta streams claiming 75k made-up names, never reading", func(t *testing.T) {
		const streams = 20
		before := heap()
		stop := peak()
		slow, sent := refusals(server.RefusedSlowReader), p.Feedback.Get(key).Sent.Responses
		attacker := attack(t, p.addr, "claims")
		testkit.Eventually(t, "every claiming stream was answered", func() (bool, string) {
			n := p.Feedback.Get(key).Sent.Responses - sent
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return n >= streams, fmt.Sprintf("%d responses, heap %.1f MiB (%.1f MiB before)", n, float64(m.HeapAlloc)/(1<<20), float64(before)/(1<<20))
		})
		growth := int64(heap()) - int64(before)
		join := p.join(adsclient.Delta, "default/delta")
		t.Logf("%d streams that claim made-up names and do not read hold %.2f MiB; a delta proxy joined in %s meanwhile",
			streams, float64(growth)/(1<<20), join.Round(time.Millisecond))
		// ~350 KiB a stream: its connection's buffers, the removal of 1,024
		// made-up names waiting in the transport and their bookkeeping (it
		// was 27 MiB a stream, the removal of all 75,000 and theirs).
		if bound := int64(12 << 20); growth > bound {
			t.Errorf("%d streams claiming made-up names hold %d bytes, more than %d", streams, growth, bound)
		}
		// Nothing changes in the scope: the streams end because they
		// answered nothing for the send timeout.
		testkit.Eventually(t, "the streams that read nothing ended", func() (bool, string) {
			n := refusals(server.RefusedSlowReader) - slow
			return n >= streams, fmt.Sprintf("%v ended as slow readers", n)
		})
		top := stop()
		attacker(true)
		start := time.Now()
		p.converge()
		fmt.Fprintf(&table, "| %s | SlowReader×%d | %+.2f MiB | %.1f MiB | %s | %s (after) |\n", t.Name(), streams,
			float64(growth)/(1<<20), float64(top)/(1<<20), join.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})

	t.Run("300 streams NACKing with a 1 MiB error_detail", func(t *testing.T) {
		const streams = nackStreams
		url := xdstype.Endpoint.URL()
		counted := func() float64 {
			n := testutil.ToFloat64(metrics.NACKsPaced.WithLabelValues("default/sotw")) + testutil.ToFloat64(metrics.NACKsPaced.WithLabelValues("default/delta"))
			return n + testutil.ToFloat64(metrics.NACKs.WithLabelValues("default/sotw", url)) + testutil.ToFloat64(metrics.NACKs.WithLabelValues("default/delta", url))
		}
		before, counted0 := heap(), counted()
		stop := peak()
		var (
			live   atomic.Int64
			joined time.Duration
			wg     sync.WaitGroup
		)
		wg.Add(1)
		attacking := make(chan struct{})
		go func() {
			// Live heap and a legitimate proxy's join while the flood runs.
			defer wg.Done()
			testkit.Eventually(t, "the flood began", func() (bool, string) {
				n := counted() - counted0
				return n > 0, fmt.Sprintf("%v rejections", n)
			})
			for {
				select {
				case <-attacking:
					return
				default:
				}
				live.Store(max(live.Load(), int64(heap())-int64(before)))
				if joined == 0 {
					joined = p.join(adsclient.SotW, "default/sotw")
				}
			}
		}()
		slow := refusals(server.RefusedSlowReader)
		ended := attack(t, p.addr, "nacks")
		ended(false)
		t.Logf("slow readers: %v", refusals(server.RefusedSlowReader)-slow)
		close(attacking)
		wg.Wait()
		top := stop()
		growth := live.Load()
		t.Logf("%d streams × %d NACKs of %d bytes: live heap grew by at most %.2f MiB, peak heap in use %.1f MiB; a SotW proxy joined in %s meanwhile",
			streams, nackRounds, nackBytes, float64(growth)/(1<<20), float64(top)/(1<<20), joined.Round(time.Millisecond))
		// One client has at most MaxStreamsPerClient streams open; the
		// others are refused before they send anything.
		admitted := nackAdmitted(1)
		if got := counted() - counted0; got != float64(admitted) {
			t.Errorf("%v rejections counted, want %d (one per admitted stream's response)", got, admitted)
		}
		for _, k := range []string{"sotw", "delta"} {
			for _, n := range p.Feedback.Get(model.Key{Namespace: "default", Name: k}).NACKs {
				if len(n.Detail) > 4*feedback.MaxDetailChars {
					t.Errorf("a reported NACK keeps a %d-byte detail", len(n.Detail))
				}
			}
		}
		// What the heap holds during the flood is gRPC's receive path
		// assembling one request per stream (up to --xds-max-request-bytes
		// each), which the server does not see before it is whole: bounded
		// by the client's streams (it was ~400 MiB for 300 of them). The
		// server keeps no more than 4 KiB of any error_detail once decoded
		// (checked above and in the codec's tests). The refused streams'
		// DATA frames in flight when they are reset add to it by timing:
		// 6 to 142 MiB over eight runs of the same flood on one machine,
		// so the bound is 6× the admitted streams' NACKs, well under the
		// unbounded 400 MiB.
		if bound := int64(admitted) * 6 * nackBytes; growth > bound {
			t.Errorf("the flood grew the live heap by %.1f MiB, more than %.1f MiB (6× the bytes of the admitted streams' NACKs)", float64(growth)/(1<<20), float64(bound)/(1<<20))
		}
		start := time.Now()
		p.converge()
		fmt.Fprintf(&table, "| %s | OK×%d, ClientStreamLimit×%d | %+.2f MiB | %.1f MiB | %s | %s (after) |\n", t.Name(), admitted, streams-admitted,
			float64(growth)/(1<<20), float64(top)/(1<<20), joined.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})
	t.Log(table.String())
}

// attackEnv names the attack a child process of the test binary runs
// (TestAttacker), and attackAddr the server it attacks: what a client
// buffers must not count as the server's heap.
const attackEnv, attackAddr = "SCOPEPLANE_HOSTILE_ATTACK", "SCOPEPLANE_HOSTILE_ADDR"

// attack starts the named attack against addr in a child process and
// returns a function that waits for it to end, or with kill set ends it.
func attack(t *testing.T, addr, name string) (wait func(kill bool)) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAttacker$", "-test.v")
	cmd.Env = append(os.Environ(), attackEnv+"="+name, attackAddr+"="+addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			t.Logf("attacker stopped at cleanup: %v", <-done)
		}
	})
	return func(kill bool) {
		t.Helper()
		if kill {
			_ = cmd.Process.Kill()
			t.Logf("attacker (%v): %s", <-done, strings.TrimSpace(out.String()))
			return
		}
		if err := <-done; err != nil {
			t.Errorf("the attacker failed: %v\n%s", err, out.String())
			return
		}
		t.Logf("attacker: %s", strings.TrimSpace(out.String()))
	}
}

// TestAttacker is the client side of an attack, run by attack in a child
// process; it does nothing when run otherwise.
func TestAttacker(t *testing.T) {
	name, addr := os.Getenv(attackEnv), os.Getenv(attackAddr)
	if name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	switch name {
	case "claims":
		claimAttack(ctx, t, addr, true)
	case "claims-answered":
		claimAttack(ctx, t, addr, false)
	case "nacks":
		nackAttack(ctx, t, addr, nackFrom)
	case "nacks-spread":
		nackAttack(ctx, t, addr, spreadFrom...)
	default:
		t.Fatalf("no attack %q", name)
	}
}

// claimAttack opens 20 delta streams whose first request claims 75,000
// made-up clusters (over 3 MiB, within the request limit) and reads
// nothing, until the server ends them when hold is set, else until the
// server answered each.
func claimAttack(ctx context.Context, t *testing.T, addr string, hold bool) {
	const streams = 20
	// No BDP window growth: the client takes at most 64 KiB of what it
	// does not read, and the rest stays with the server.
	// A connection each: the server closes a slow reader's connection.
	var ends []discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	for s := range streams {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		req := &discoveryv3.DeltaDiscoveryRequest{Node: node(fmt.Sprintf("claimer-%d", s), "default/delta"), TypeUrl: xdstype.Cluster.URL(),
			InitialResourceVersions: make(map[string]string, 75_000)}
		for i := range 75_000 {
			req.InitialResourceVersions[fmt.Sprintf("default/made-up-%02d-%05d:8080", s, i)] = fmt.Sprintf("%016x", i)
		}
		if n := proto.Size(req); n < 3<<20 || n > server.DefaultOptions.MaxRequestBytes {
			t.Fatalf("a claiming request is %d bytes, want 3 MiB up to the %d-byte limit", n, server.DefaultOptions.MaxRequestBytes)
		}
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(req); err != nil {
			_, err = st.Recv()
			t.Fatalf("stream %d: %v", s, err)
		}
		ends = append(ends, st)
	}
	// The server answers each claim (its response headers come with the
	// first response), which the streams leave unread.
	for s, st := range ends {
		if _, err := st.Header(); err != nil {
			t.Fatalf("stream %d was not answered: %v", s, err)
		}
	}
	if hold {
		t.Logf("%d streams sent their claims and were answered; reading nothing until killed", len(ends))
		<-ctx.Done()
	}
}

// The NACK flood: nackStreams streams of one client (nackFrom, not the
// legitimate proxies' address), half SotW and half delta, each rejecting
// its first response nackRounds times with a nackBytes error_detail (the
// first rejection is the answer, the others repeat it). Spread, the same
// streams come from ten addresses: clients that each stay within their
// own bound. Neither is the attacker of the other rows: an address whose
// connections closed without an admitted stream (a header flood's) spent
// its budget of failures, and its new connections are refused at once.
const (
	nackStreams, nackRounds, nackBytes = 300, 1, 1 << 20
	nackFrom                           = "127.0.3.1"
)

var spreadFrom = []string{"127.0.2.1", "127.0.2.2", "127.0.2.3", "127.0.2.4", "127.0.2.5", "127.0.2.6", "127.0.2.7", "127.0.2.8", "127.0.2.9", "127.0.2.10"}

// nackAttack runs the NACK flood from the addresses froms, on at least
// three connections (the server allows 100 streams per connection) spread
// over them, the streams spread evenly over the connections. Every stream
// first waits until each of the others was answered or refused, so the
// admitted ones NACK all at once and none frees its place for a refused
// one.
func nackAttack(ctx context.Context, t *testing.T, addr string, froms ...string) {
	url := xdstype.Endpoint.URL()
	nack := &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: strings.Repeat("x", nackBytes)}
	conns := make([]*grpc.ClientConn, max(3, len(froms)))
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(froms[i%len(froms)])))
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		defer func() { _ = c.Close() }()
	}
	var (
		o       outcome
		settled sync.WaitGroup
	)
	settled.Add(nackStreams)
	var budgeted atomic.Int64
	parallel(nackStreams, nackStreams, func(i int) {
		ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conns[i%len(conns)])
		cluster := fmt.Sprintf("default/svc-%04d:80", i)
		id := fmt.Sprintf("nacker-%d", i)
		// first opens the stream and returns its first response's nonce;
		// reject sends the NACKs, and end closes and returns how it ended.
		var (
			first  func() (string, error)
			reject func(nonce string)
			end    func() error
		)
		if i%2 == 0 {
			s, err := ads.StreamAggregatedResources(ctx)
			first = func() (string, error) {
				if err != nil {
					return "", err
				}
				if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node(id, "default/sotw"), TypeUrl: url, ResourceNames: []string{cluster}}); err != nil {
					_, err = s.Recv() // Send says only io.EOF of a stream the server ended
					return "", err
				}
				r, err := s.Recv()
				return r.GetNonce(), err
			}
			reject = func(nonce string) {
				_ = s.Send(&discoveryv3.DiscoveryRequest{TypeUrl: url, ResponseNonce: nonce, ResourceNames: []string{cluster}, ErrorDetail: nack})
			}
			end = func() error { _ = s.CloseSend(); _, err := s.Recv(); return err }
		} else {
			s, err := ads.DeltaAggregatedResources(ctx)
			first = func() (string, error) {
				if err != nil {
					return "", err
				}
				if err := s.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node(id, "default/delta"), TypeUrl: url, ResourceNamesSubscribe: []string{cluster}}); err != nil {
					_, err = s.Recv() // Send says only io.EOF of a stream the server ended
					return "", err
				}
				r, err := s.Recv()
				return r.GetNonce(), err
			}
			reject = func(nonce string) {
				_ = s.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: url, ResponseNonce: nonce, ErrorDetail: nack})
			}
			end = func() error { _ = s.CloseSend(); _, err := s.Recv(); return err }
		}
		ended := func(err error) {
			// A server with a memory budget (a Go memory limit) may end
			// admitted streams too, once the heap is above it.
			if status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "--xds-memory-budget") {
				budgeted.Add(1)
			}
			o.add(err)
		}
		nonce, err := first()
		settled.Done()
		if err != nil {
			ended(err)
			return
		}
		settled.Wait()
		for range nackRounds {
			reject(nonce)
		}
		ended(end())
	})
	t.Logf("NACKing streams ended: %s %q", o.String(), o.msgs)
	admitted := nackAdmitted(len(froms))
	ok, exhausted := o.codes[codes.OK], o.codes[codes.ResourceExhausted]
	if ok+exhausted != nackStreams || ok > admitted || ok+int(budgeted.Load()) < admitted {
		t.Errorf("the NACKing streams ended with %s (%d by the memory budget), want OK×%d ResourceExhausted×%d, or fewer OK for streams the memory budget ended", o.String(), budgeted.Load(), admitted, nackStreams-admitted)
	}
}

// nackAdmitted is how many of the flood's streams from addrs addresses
// the server admits: as many of each address's share as one client may
// have open.
func nackAdmitted(addrs int) int {
	return addrs * min(nackStreams/addrs, server.DefaultOptions.MaxStreamsPerClient)
}
