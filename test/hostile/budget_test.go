package hostile

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The addresses of the peer-address rows: tenants hold a Running Pod each
// (as the legitimate proxy's address does), strangers none.
func tenant(i int) string   { return fmt.Sprintf("127.0.7.%d", i+1) }
func stranger(i int) string { return fmt.Sprintf("127.0.8.%d", i+1) }

// tenants is how many tenant addresses hold a Pod; the rows of many
// streams per address use the first crowd of them.
const (
	tenants = 60
	crowd   = 20
)

// fastSendProfile is peerAddressProfile with a send timeout of
// fastSendTimeout, for the row of streams that cannot be written to;
// slowSendProfile one with a send timeout longer than any row, for a row
// whose streams only the memory budget may end.
const (
	fastSendProfile = "peer-address-fast-send"
	fastSendTimeout = 2 * time.Second
	slowSendProfile = "peer-address-slow-send"
)

// peerAddressOptions are the production limits with the chart's default
// authentication, peer-address without tokens in this world: the
// legitimate address and each tenant's hold one Running Pod of default.
func peerAddressOptions(profile string) server.Options {
	pod := func(name string) auth.Pod {
		return auth.Pod{Namespace: "default", Name: name, UID: name + "-uid", ServiceAccount: "envoy", Running: true}
	}
	pods := &podTable{pods: map[netip.Addr][]auth.Pod{netip.MustParseAddr(legitimate): {pod("legitimate")}}, gone: map[string]chan struct{}{}}
	for i := range tenants {
		pods.pods[netip.MustParseAddr(tenant(i))] = []auth.Pod{pod(fmt.Sprintf("tenant-%d", i))}
	}
	opts := server.Options{Authenticator: &auth.Authenticator{PeerAddress: true, Pods: pods}}
	switch profile {
	case fastSendProfile:
		opts.SendTimeout = fastSendTimeout
	case slowSendProfile:
		opts.SendTimeout = time.Hour
	}
	return opts
}

// messageHead is gRPC's prefix of an uncompressed message of n bytes.
func messageHead(n int) []byte {
	b := make([]byte, 5)
	binary.BigEndian.PutUint32(b[1:], uint32(n))
	return b
}

// stalled sends, on stream id of h, a message announcing 4 MB and stops
// 1,000 bytes short of it; it reports whether all of that was taken.
func stalled(h *h2conn, id uint32) bool {
	return h.send(id, messageHead(stalledSize)) == nil && h.send(id, stalledBody) == nil
}

// stalledSize is what a stalled message announces, stalledBody what of it
// is sent (shared: the client holds it once).
const stalledSize = 4 << 20

var stalledBody = make([]byte, stalledSize-1000)

// stallAll opens a connection from each of addrs addresses (at(i)) with
// streams SotW streams each, which send their first request (none when first is
// nil) and then a message stalled 1,000 bytes short (stalled); it returns
// once each stream stalled or was refused or ended.
func stallAll(t *testing.T, addr string, addrs, streams int, at func(int) string, first func(a, i int) []byte) attackRun {
	var taken, refused atomic.Int64
	var conns []*h2conn
	var wg sync.WaitGroup
	var mu sync.Mutex
	stalledOn := map[*h2conn][]uint32{}
	for a := range addrs {
		h := dialH2(t, at(a), addr, false, time.Now().Add(2*testkit.Timeout))
		conns = append(conns, h)
		for i := range streams {
			id, err := h.open(sotwHeaders(addr))
			if err != nil {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if (first == nil || h.send(id, first(a, i)) == nil) && stalled(h, id) {
					taken.Add(1)
					mu.Lock()
					stalledOn[h] = append(stalledOn[h], id)
					mu.Unlock()
				} else {
					refused.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	return attackRun{ended: fmt.Sprintf("%d stalled, %d refused or ended", taken.Load(), refused.Load()), stop: func() {
		for _, h := range conns {
			h.close()
		}
	}, endedSince: func() int {
		n := 0
		for h, ids := range stalledOn {
			h.mu.Lock()
			for _, id := range ids {
				if h.reset[id] {
					n++
				}
			}
			h.mu.Unlock()
		}
		return n
	}}
}

// admittedFirst is the first request of a tenant's stream i on its a-th
// address, which its scope admits.
func admittedFirst(a, i int) []byte {
	return grpcMessage(&discoveryv3.DiscoveryRequest{Node: node(fmt.Sprintf("tenant-%d-%d", a, i), "default/sotw"),
		TypeUrl: xdstype.Cluster.URL(), ResourceNames: []string{"default/svc-0000:80"}})
}

// attackRun is what a row's attack left running: how it ended so far and
// the function that stops it.
type attackRun struct {
	ended string
	stop  func()
	// endedSince, when set, is how many of the streams the attack left
	// holding the server ended since.
	endedSince func() int
}

// joins has n new proxies join one after the other from the legitimate
// address, each retrying as a proxy does (a second apart) for up to 10 s,
// and returns how many held every cluster within that and the slowest.
func (c *confined) joins(n int) (int, time.Duration) {
	c.t.Helper()
	ok, slowest := 0, time.Duration(0)
	for i := range n {
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			if c.joinOnce(fmt.Sprintf("joining-%d", i), start.Add(10*time.Second)) {
				ok++
				slowest = max(slowest, time.Since(start))
				break
			}
			time.Sleep(time.Second)
		}
	}
	return ok, slowest
}

// joinOnce connects a new proxy and reports whether it held every cluster
// before its stream ended or the deadline passed.
func (c *confined) joinOnce(id string, deadline time.Time) bool {
	conn := c.dial()
	defer func() { _ = conn.Close() }()
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node(id, "default/sotw"))
	cfg.RecordEvents = false
	px := adsclient.New(cfg)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	ended := make(chan struct{})
	go func() { defer close(ended); _ = px.Run(ctx, conn) }()
	_ = px.WaitFor(ctx, func(px *adsclient.Client) bool {
		return len(px.State(xdstype.Cluster.URL())) >= services || px.Err() != nil
	})
	joined := len(px.State(xdstype.Cluster.URL())) >= services
	if !joined {
		c.t.Logf("a join attempt failed: %v", px.Err())
	}
	cancel()
	<-ended
	return joined
}

// budgetRow runs one attack against its own confined server, and checks
// that the server survives it, that legitimate proxies join while it
// runs (all of joinsPerRow, each within 10 s, retrying as a proxy does) and that the connected one
// is pushed to. It returns the table row.
func budgetRow(t *testing.T, profile, name string, run func(addr string) attackRun) string {
	cg := memoryCgroup(t, chartMemoryLimit)
	c := startConfined(t, cg, profile)
	c.push("before " + name)
	base := cgroupRead(t, cg, "memory.usage_in_bytes")
	cgroupWrite(t, cg, "memory.max_usage_in_bytes", "0")
	a := run(c.addr)
	c.alive(name)
	const joinsPerRow = 5
	joined, slowest := c.joins(joinsPerRow)
	push := c.push(name)
	c.alive(name)
	if a.endedSince != nil {
		a.ended += fmt.Sprintf(", %d of them ended since", a.endedSince())
	}
	a.stop()
	c.alive(name)
	peak := cgroupRead(t, cg, "memory.max_usage_in_bytes")
	if joined != joinsPerRow {
		t.Errorf("%s: %d of %d legitimate proxies joined during the attack", name, joined, joinsPerRow)
	}
	return fmt.Sprintf("| %s | %s | %.1f MiB (%.1f before) | %d/%d, slowest %s | %s |", name, a.ended,
		float64(peak)/(1<<20), float64(base)/(1<<20), joined, joinsPerRow, slowest.Round(time.Millisecond), push.Round(time.Millisecond))
}

// TestBudgetUnderTheChartsMemoryLimit replays, against the server
// confined as the chart confines it and authenticating as the chart does
// by default (peer-address among the methods), the attacks that a
// replica's budget of memory and admission answers: each in its own
// cgroup, each with legitimate proxies joining during it.
func TestBudgetUnderTheChartsMemoryLimit(t *testing.T) {
	var (
		mu    sync.Mutex
		table = []string{"", "| attack | ended | cgroup peak (limit 512 MiB) | joins during | push |", "|---|---|---|---|---|"}
	)
	add := func(row string) {
		mu.Lock()
		table = append(table, row)
		mu.Unlock()
	}
	t.Cleanup(func() { t.Log(strings.Join(table, "\n")) })

	t.Run("no credential, 4 MB first requests stalled", func(t *testing.T) {
		add(budgetRow(t, peerAddressProfile, "6 addresses without a Pod × 32 streams, 4 MB first requests stalled 1,000 bytes short", func(addr string) attackRun {
			return stallAll(t, addr, 6, 32, stranger, nil)
		}))
	})

	t.Run("no credential, rapid reset", func(t *testing.T) {
		add(budgetRow(t, peerAddressProfile, "4 addresses without a Pod opening and resetting streams", func(addr string) attackRun {
			var opened atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for a := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					h := dialH2(t, stranger(10+a), addr, false, time.Now().Add(2*testkit.Timeout))
					defer h.close()
					block := sotwHeaders(addr)
					// Bounded: 20,000 streams a connection at most.
					for range 20_000 {
						if ctx.Err() != nil || h.closed() {
							return
						}
						id, err := h.open(block)
						if err != nil {
							return
						}
						h.wmu.Lock()
						err = h.fr.WriteRSTStream(id, http2.ErrCodeCancel)
						if err == nil {
							err = h.w.Flush()
						}
						h.wmu.Unlock()
						if err != nil {
							return
						}
						opened.Add(1)
					}
				}()
			}
			time.Sleep(2 * time.Second) // the attack under way
			return attackRun{ended: "running", stop: func() {
				cancel()
				wg.Wait()
				t.Logf("%d streams opened and reset", opened.Load())
			}}
		}))
	})

	t.Run("admitted clients, 4 MB requests stalled", func(t *testing.T) {
		add(budgetRow(t, peerAddressProfile, "20 admitted addresses × 32 streams, 4 MB requests stalled 1,000 bytes short", func(addr string) attackRun {
			return stallAll(t, addr, crowd, 32, tenant, admittedFirst)
		}))
	})

	t.Run("admitted clients of one stream each, 4 MB requests stalled", func(t *testing.T) {
		// 60 × 4 MB is over the budget by about a third of it: the
		// budget ends stalled proxies until the heap is back under, and
		// only those (the proxy connected before stays: budgetRow pushes
		// to it). The stalled proxies read nothing they are sent; with
		// the send timeout an hour, only the budget ends them.
		var a attackRun
		add(budgetRow(t, slowSendProfile, "60 admitted addresses × 1 stream, 4 MB requests stalled 1,000 bytes short", func(addr string) attackRun {
			a = stallAll(t, addr, tenants, 1, tenant, admittedFirst)
			return a
		}))
		if n := a.endedSince(); n == 0 || n == tenants {
			t.Errorf("the budget ended %d of the %d stalled proxies, want some, not all", n, tenants)
		}
	})

	t.Run("streams that grant no window", func(t *testing.T) {
		add(budgetRow(t, fastSendProfile, "20 addresses × 32 delta streams granting no window, answering guessed nonces", func(addr string) attackRun {
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var conns []*h2conn
			for a := range crowd {
				h := dialH2(t, tenant(a), addr, true, time.Now().Add(2*testkit.Timeout))
				conns = append(conns, h)
				var ids []uint32
				for i := range 32 {
					id, err := h.open(deltaHeaders(addr))
					if err != nil {
						break
					}
					if h.send(id, grpcMessage(&discoveryv3.DeltaDiscoveryRequest{Node: node(fmt.Sprintf("zero-%d-%d", a, i), "default/delta"),
						TypeUrl: xdstype.Cluster.URL(), ResourceNamesSubscribe: []string{"default/svc-0000:80"}})) != nil {
						break
					}
					ids = append(ids, id)
				}
				// Answer what a stream would have been sent, without
				// reading it: the nonces a counter would give.
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 1; ctx.Err() == nil && !h.closed(); n = n%5 + 1 {
						for _, id := range ids {
							_ = h.send(id, grpcMessage(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), ResponseNonce: fmt.Sprint(n)}))
						}
						select {
						case <-ctx.Done():
						case <-time.After(200 * time.Millisecond):
						}
					}
				}()
			}
			// The server must close each connection: every stream on it
			// answered nothing it could have read.
			deadline := time.Now().Add(testkit.Timeout)
			open := 0
			for _, h := range conns {
				select {
				case <-h.ended:
				case <-time.After(time.Until(deadline)):
					open++
				}
			}
			if open > 0 {
				t.Errorf("%d of %d connections of streams granting no window were open %s after they started (send timeout %s)", open, len(conns), testkit.Timeout, fastSendTimeout)
			}
			return attackRun{ended: fmt.Sprintf("%d of %d connections closed by the server", len(conns)-open, len(conns)), stop: func() {
				cancel()
				wg.Wait()
				for _, h := range conns {
					h.close()
				}
			}}
		}))
	})
}

// TestBudgetEndsNoProxyForTheReplicasOwnHeap has the confined server hold
// more heap of its own than its budget, as a world grown after the first
// build does: the budget must refuse new streams, and must not end the
// connected proxy's, which holds nothing that ending it would give back.
// A proxy holding a stalled 4 MB request is ended, which shows that the
// budget weighed the proxies; a proxy that joined after it, the newest,
// stays too. Before, a proxy holding one stream was ended for any heap
// over the budget, the newest first: the last one at the first decision.
func TestBudgetEndsNoProxyForTheReplicasOwnHeap(t *testing.T) {
	cg := memoryCgroup(t, chartMemoryLimit)
	c := startConfined(t, cg, anonymousProfile)
	c.push("before the heap grew")
	holder := stallAll(t, c.addr, 1, 1, tenant, admittedFirst)
	defer holder.stop()
	// From an address of its own: a second stream of the first proxy's
	// client would be ended as such.
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(tenant(1))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("newest", "default/sotw"))
	cfg.RecordEvents = false
	newest := adsclient.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = newest.Run(ctx, conn) }()
	defer func() { cancel(); <-done }()
	joined, stop := context.WithTimeout(ctx, testkit.Timeout)
	defer stop()
	if err := newest.WaitFor(joined, func(px *adsclient.Client) bool { return len(px.State(xdstype.Cluster.URL())) >= services }); err != nil {
		t.Fatalf("the newest proxy did not join: %v (stream: %v)", err, newest.Err())
	}
	c.hold(chartGoMemLimit / 2 >> 20) // 230 MiB: the budget is a third of the Go limit
	probe := c.dial()
	defer func() { _ = probe.Close() }()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(probe)
	testkit.Eventually(t, "a new stream refused for the memory budget", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err == nil {
			err = s.Send(&discoveryv3.DiscoveryRequest{Node: node("refused", "default/sotw"), TypeUrl: xdstype.Cluster.URL()})
		}
		if err == nil {
			_, err = s.Recv()
		}
		return status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "--xds-memory-budget"), fmt.Sprint(err)
	})
	testkit.Eventually(t, "the proxy holding a stalled request ended by the budget", func() (bool, string) {
		n := holder.endedSince()
		return n == 1, fmt.Sprintf("%d ended (%s)", n, holder.ended)
	})
	c.alive("while the heap is over the budget")
	for name, px := range map[string]*adsclient.Client{"the first": c.proxy, "the newest": newest} {
		if err := px.Err(); err != nil {
			t.Fatalf("%s proxy's stream ended while the replica's own heap was over the budget: %v", name, err)
		}
	}
	c.push("while the heap is over the budget")
	c.hold(0)
	c.join("once the heap is back")
}
