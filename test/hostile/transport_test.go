package hostile

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The transport rows attack from 127.0.0.2, a client without credentials;
// the legitimate proxy connects from 127.0.0.1 with a ServiceAccount token.
const (
	attacker   = "127.0.0.2"
	legitimate = "127.0.0.1"
)

// tplane is a server requiring tokens, on a 2,000-Service world, with one
// legitimate SotW proxy connected before the attack.
type tplane struct {
	t     *testing.T
	p     *pipeline.Pipeline
	addr  string
	token string
	iss   *authtest.Issuer // signs token; tests sign other tokens with it
	proxy *adsclient.Client
	tls   *tls.Config // the client side, when the server speaks TLS
	rows  int
}

func startTransport(t *testing.T, opts server.Options, serverTLS *tls.Config, clientTLS *tls.Config) *tplane {
	t.Helper()
	iss := authtest.NewIssuer(t, "k1")
	opts.Authenticator = &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", iss, nil)}
	p := pipeline.New(pipeline.Options{Server: opts})
	for i := range services {
		p.Catalog.UpsertService(testkit.Service("default", fmt.Sprintf("svc-%04d", i), "10.0.0.1", "10.0.0.2"))
	}
	p.Catalog.UpsertScope(scope("sotw", model.SotW))
	p.Sync()
	now := time.Now()
	tp := &tplane{t: t, p: p, tls: clientTLS, iss: iss,
		token: iss.Sign(authtest.SAClaims("default", "envoy", "scopeplane", now.Add(-time.Minute), now.Add(time.Hour)))}
	if serverTLS != nil {
		tp.addr = testkit.ServeTLS(t, p.Server.ServeListener, serverTLS)
	} else {
		tp.addr = serve(t, p)
	}
	conn := tp.dialFrom(legitimate)
	t.Cleanup(func() { _ = conn.Close() })
	cfg := testkit.WildcardClient(adsclient.SotW, testkit.Node("legitimate", "default/sotw"))
	cfg.RecordEvents = false
	tp.proxy = adsclient.New(cfg)
	ctx, cancel := context.WithCancel(tp.authorized(context.Background()))
	done := make(chan struct{})
	go func() { defer close(done); _ = tp.proxy.Run(ctx, conn) }()
	t.Cleanup(func() { cancel(); <-done })
	tp.push()
	return tp
}

func (tp *tplane) authorized(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tp.token)
}

// dialFrom is a gRPC connection from the loopback address ip.
func (tp *tplane) dialFrom(ip string) *grpc.ClientConn {
	creds := insecure.NewCredentials()
	if tp.tls != nil {
		creds = credentials.NewTLS(tp.tls)
	}
	conn, err := grpc.NewClient(tp.addr, grpc.WithTransportCredentials(creds), grpc.WithContextDialer(from(ip)))
	if err != nil {
		tp.t.Fatal(err)
	}
	return conn
}

// from is a gRPC dialer whose connections come from the loopback address
// ip: the server keeps per-address bounds, and each attack and legitimate
// proxy of a test comes from its own address.
func from(ip string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// rawFrom is a TCP connection from the loopback address ip.
func rawFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// join opens a new connection from the legitimate address and a SotW
// stream with the token on it, and returns how long the clusters took to
// arrive.
func (tp *tplane) join() (time.Duration, error) {
	start := time.Now()
	conn := tp.dialFrom(legitimate)
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(tp.authorized(context.Background()), 10*time.Second)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return 0, err
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("joiner", "default/sotw"), TypeUrl: xdstype.Cluster.URL()}); err != nil {
		_, err = s.Recv()
		return 0, err
	}
	r, err := s.Recv()
	if err != nil {
		return 0, err
	}
	if len(r.GetResources()) < services {
		return 0, fmt.Errorf("%d clusters, want at least %d", len(r.GetResources()), services)
	}
	return time.Since(start), nil
}

// push adds a Service and returns how long the connected proxy took to
// hold its cluster.
func (tp *tplane) push() time.Duration {
	tp.t.Helper()
	tp.rows++
	name := fmt.Sprintf("push-%02d", tp.rows)
	start := time.Now()
	tp.p.Catalog.UpsertService(testkit.Service("default", name, "10.0.1.1"))
	tp.p.Sync()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	cluster := "default/" + name + ":80"
	if err := tp.proxy.WaitFor(ctx, func(c *adsclient.Client) bool {
		_, ok := c.State(xdstype.Cluster.URL())[cluster]
		return ok
	}); err != nil {
		tp.t.Fatalf("the legitimate proxy did not get %s: %v (stream: %v)", cluster, err, tp.proxy.Err())
	}
	return time.Since(start)
}

// during measures, while an attack holds what it holds, the live heap and
// a legitimate proxy's join and push, and logs the row of the attack table.
func (tp *tplane) during(attack, code string, before uint64) {
	tp.t.Helper()
	if err := tp.measure(attack, code, before); err != nil {
		tp.t.Errorf("a legitimate proxy could not join during the attack: %v", err)
	}
}

// measure is during without the verdict: it returns how the join failed.
func (tp *tplane) measure(attack, code string, before uint64) error {
	tp.t.Helper()
	peak := heap()
	joined, err := tp.join()
	join := "join " + joined.Round(time.Millisecond).String()
	if err != nil {
		join = "join refused (" + status.Code(err).String() + ")"
	}
	pushed := tp.push()
	tp.t.Logf("\n| %s | %s | live heap %.1f → %.1f MiB | %s, push %s |", attack, code,
		float64(before)/(1<<20), float64(peak)/(1<<20), join, pushed.Round(time.Millisecond))
	return err
}

// handshake sends the HTTP/2 preface and SETTINGS on c and reports whether
// the server answered with its SETTINGS (false: it closed the connection).
func handshake(t *testing.T, c net.Conn) (*http2.Framer, bool) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(testkit.Timeout))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return nil, false
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		return nil, false
	}
	f, err := fr.ReadFrame()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the server neither served nor closed a connection within %s", testkit.Timeout)
	}
	_, ok := f.(*http2.SettingsFrame)
	return fr, err == nil && ok
}

// TestIdleConnectionsAreBounded opens 1,000 connections from one address
// that complete the HTTP/2 handshake and then open no stream, as the probe
// that OOM-killed a replica with 13,000 of them did. Only as many as one
// peer may hold are open at once (a new one takes the place of the
// address's oldest, counted ConnectionEvicted), the rest are closed as they
// are accepted (counted ConnectionPaced past the peer's pace), a
// legitimate proxy joins and is pushed to meanwhile, and the server closes
// the served ones once they stayed idle for the idle timeout.
func TestIdleConnectionsAreBounded(t *testing.T) {
	const idle = 2 * time.Second // production: a minute
	tp := startTransport(t, server.Options{MaxConnectionIdle: idle}, nil, nil)
	before, evicted := heap(), refusals(server.RefusedConnectionEvicted)
	var mu sync.Mutex
	var served []net.Conn
	parallel(1000, 100, func(int) {
		c := rawFrom(t, attacker, tp.addr)
		fr, ok := handshake(t, c)
		if !ok {
			_ = c.Close()
			return
		}
		mu.Lock()
		served = append(served, c)
		mu.Unlock()
		_ = fr
	})
	// The address's new connections beyond the bound took the place of
	// its oldest (evicted) while the attack opened them.
	if open, max := len(served)-int(refusals(server.RefusedConnectionEvicted)-evicted), server.DefaultOptions.MaxConnectionsPerPeer; open > max {
		t.Errorf("%d idle connections of one address are open, want at most %d (--xds-max-connections-per-peer)", open, max)
	}
	tp.during("1,000 idle HTTP/2 connections from one address", fmt.Sprintf("%d served, %d closed at accept", len(served), 1000-len(served)), before)
	// The server closes what it served once idle: each read ends (after
	// the GOAWAY) with the connection closed, not with the read deadline.
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, c := range served {
		open.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = c.Close() }()
			_ = c.SetReadDeadline(time.Now().Add(testkit.Timeout))
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						open.Add(-1)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := open.Load(); n != 0 {
		t.Errorf("%d of %d idle connections were still open after %s (the idle timeout is %s)", n, len(served), testkit.Timeout, idle)
	}
	testkit.Eventually(t, "the heap back within the bound", func() (bool, string) {
		g := int64(heap()) - int64(before)
		return g <= heapBound, fmt.Sprintf("the heap grew by %d bytes", g)
	})
}

// TestHandshakeIsBounded opens 200 TCP connections from one address to a
// TLS port and sends nothing: each is closed once the handshake timeout
// passed, not after gRPC's 120 s.
func TestHandshakeIsBounded(t *testing.T) {
	cert, roots := selfSignedCert(t)
	tp := startTransport(t, server.Options{HandshakeTimeout: time.Second},
		&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	before := heap()
	conns := make([]net.Conn, 200)
	for i := range conns {
		conns[i] = rawFrom(t, attacker, tp.addr)
	}
	tp.during("200 TCP connections that never start TLS", "closed after the handshake timeout", before)
	var stuck atomic.Int64
	parallel(len(conns), len(conns), func(i int) {
		c := conns[i]
		defer func() { _ = c.Close() }()
		_ = c.SetReadDeadline(time.Now().Add(testkit.Timeout))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
			stuck.Add(1)
		}
	})
	if n := stuck.Load(); n != 0 {
		t.Errorf("%d of %d connections that never handshook were still open after %s", n, len(conns), testkit.Timeout)
	}
}

// TestHeaderListIsBounded opens streams whose authorization header is
// 15 MiB, sent in CONTINUATION frames, as the probe that OOM-killed a
// replica did with 300 of them: each is reset (FRAME_SIZE_ERROR) without
// the header being held, and the heap sampled meanwhile stays far below
// what the headers weigh.
func TestHeaderListIsBounded(t *testing.T) {
	tp := startTransport(t, server.Options{}, nil, nil)
	const streams = 8
	block := headerBlock(tp.addr)
	// The heap is measured with the attack's own header block already on
	// it: what is sampled above it is what the server holds.
	before := heap()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	o := headerFlood(t, tp.addr, block, streams)
	close(stop)
	<-sampled
	runtime.KeepAlive(block)
	tp.during(fmt.Sprintf("%d streams with a 15 MiB authorization header", streams), o.String()+" "+strings.Join(o.msgs, "; "), before)
	t.Logf("sampled peak heap %.1f MiB (%d MiB of headers sent)", float64(peak.Load())/(1<<20), streams*len(block)>>20)
	if len(o.codes) != 1 || o.codes[codes.ResourceExhausted] != streams {
		t.Errorf("the streams ended %s (%q), want each reset", o.String(), o.msgs)
	}
	if growth := int64(peak.Load()) - int64(before); growth > 32<<20 {
		t.Errorf("the heap peaked %d MiB above where it was, holding the headers", growth>>20)
	}
}

// headerBlock is the HPACK block of an ADS stream to addr whose
// authorization header is 15 MiB, as the probe that OOM-killed a replica
// sent.
func headerBlock(addr string) []byte {
	return sotwHeaders(addr, hpack.HeaderField{Name: "authorization", Value: "Bearer " + strings.Repeat("x", 15<<20)})
}

// headerFlood opens streams connections from the attacker's address to
// addr, each sending block in CONTINUATION frames, and returns how each
// ended: ResourceExhausted when the server reset or closed it, Unknown when
// it answered.
func headerFlood(t *testing.T, addr string, block []byte, streams int) *outcome {
	var o outcome
	parallel(streams, min(streams, 50), func(int) {
		c := rawFrom(t, attacker, addr)
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(testkit.Timeout))
		w := bufio.NewWriterSize(c, 64<<10)
		_, _ = w.WriteString(http2.ClientPreface)
		fr := http2.NewFramer(w, c)
		_ = fr.WriteSettings()
		const chunk = 16 << 10
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:chunk]})
		for off := chunk; off < len(block); off += chunk {
			end := min(off+chunk, len(block))
			if err := fr.WriteContinuation(1, end == len(block), block[off:end]); err != nil {
				break
			}
		}
		_ = w.Flush()
		rd := http2.NewFramer(nil, c)
		rd.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				// The server closed the connection: a header value longer
				// than the whole list may be is a connection error in HPACK
				// decoding, before any of it is kept.
				o.add(status.Errorf(codes.ResourceExhausted, "connection closed"))
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				o.add(status.Errorf(codes.ResourceExhausted, "RST_STREAM %v", f.ErrCode))
				return
			case *http2.GoAwayFrame:
				o.add(status.Errorf(codes.ResourceExhausted, "GOAWAY %v", f.ErrCode))
				return
			case *http2.MetaHeadersFrame:
				o.add(status.Errorf(codes.Unknown, "answered: %v", f.Fields))
				return
			}
		}
	})
	return &o
}

// TestUnauthenticatedStreamsDoNotSpendThePace has a client without
// credentials open 500 streams from one address on a server whose pace of
// new streams admits 60 and then (practically) none: they are refused,
// first as unauthenticated and then before their credentials are looked
// at, and a legitimate proxy's 20 new streams after them are all served.
func TestUnauthenticatedStreamsDoNotSpendThePace(t *testing.T) {
	tp := startTransport(t, server.Options{NewStreamsPerSecond: 1e-6, NewStreamsBurst: 60}, nil, nil)
	before := heap()
	conn := tp.dialFrom(attacker)
	defer func() { _ = conn.Close() }()
	var o outcome
	req := &discoveryv3.DiscoveryRequest{Node: testkit.Node("stranger", "default/sotw"), TypeUrl: xdstype.Cluster.URL()}
	parallel(500, 50, func(int) {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
		defer cancel()
		o.add(sotwOnce(ctx, conn, req))
	})
	if len(o.codes) != 2 || o.codes[codes.Unauthenticated] == 0 || o.codes[codes.ResourceExhausted] == 0 {
		t.Errorf("the streams without credentials ended %s, want Unauthenticated and then ResourceExhausted (%q)", o.String(), o.msgs)
	}
	failed := 0
	for range 20 {
		if _, err := tp.join(); err != nil {
			failed++
			t.Logf("a legitimate stream: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 20 new streams of a legitimate proxy failed after the unauthenticated flood", failed)
	}
	tp.during("500 streams without credentials from one address", o.String(), before)
}

// TestConnectionFloodDoesNotSpendThePace has a client open 300
// connections from one address on a server whose pace of new connections
// admits 100 and then (practically) none: the peer's own budget (40)
// stops it, and a legitimate proxy's 20 new connections after it are all
// served.
func TestConnectionFloodDoesNotSpendThePace(t *testing.T) {
	tp := startTransport(t, server.Options{
		NewConnectionsPerSecond: 1e-6, NewConnectionsBurst: 100,
		NewConnectionsPerPeerPerSecond: 1e-6, NewConnectionsPerPeerBurst: 40,
	}, nil, nil)
	before := heap()
	served := 0
	for range 300 {
		c := rawFrom(t, attacker, tp.addr)
		if _, ok := handshake(t, c); ok {
			served++
		}
		_ = c.Close()
	}
	if served > 40 {
		t.Errorf("%d connections of one address were served, want at most its burst of 40", served)
	}
	failed := 0
	for range 20 {
		if _, err := tp.join(); err != nil {
			failed++
			t.Logf("a legitimate connection: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 20 new connections of a legitimate proxy failed after the flood", failed)
	}
	tp.during("300 new connections from one address", fmt.Sprintf("%d served, %d closed at accept", served, 300-served), before)
}

// idleConnections opens each connections from each of addrs loopback
// addresses (127.0.1.1 on) to addr that complete the HTTP/2 handshake and
// open no stream, and returns those the server served; they are closed
// when the test ends.
func idleConnections(t *testing.T, addr string, addrs, each int) []net.Conn {
	var mu sync.Mutex
	var served []net.Conn
	for a := range addrs {
		ip := fmt.Sprintf("127.0.1.%d", a+1)
		parallel(each, 100, func(int) {
			c := rawFrom(t, ip, addr)
			if _, ok := handshake(t, c); !ok {
				_ = c.Close()
				return
			}
			mu.Lock()
			served = append(served, c)
			mu.Unlock()
		})
	}
	t.Cleanup(func() {
		for _, c := range served {
			_ = c.Close()
		}
	})
	return served
}

// TestConnectionCapBoundsMemory opens 5,500 idle connections from 11
// addresses (500 each, within the per-address bound): the replica serves
// at most its 5,000, closes the rest as they are accepted, and the live
// heap they hold stays far inside the chart's 512 MiB while the connected
// proxy is pushed to. A new proxy still joins the full replica: once the
// attack's connections have carried no authenticated stream for the
// handshake timeout, the fullest address's oldest one makes room (it was
// refused until the idle timeout closed them).
func TestConnectionCapBoundsMemory(t *testing.T) {
	const handshakeTimeout = 2 * time.Second // production: 10 s
	tp := startTransport(t, server.Options{HandshakeTimeout: handshakeTimeout}, nil, nil)
	before, evicted := heap(), refusals(server.RefusedConnectionEvicted)
	served := idleConnections(t, tp.addr, 11, 500)
	// The attack's last addresses may have evicted its first ones' oldest.
	open := len(served) - int(refusals(server.RefusedConnectionEvicted)-evicted)
	if max := server.DefaultOptions.MaxConnections; open > max {
		t.Errorf("%d idle connections are open, want at most %d (--xds-max-connections)", open, max)
	}
	after := heap()
	testkit.Eventually(t, "a new proxy joined the full replica", func() (bool, string) {
		_, err := tp.join()
		return err == nil, fmt.Sprintf("refused: %v", err)
	})
	tp.during("5,500 idle connections from 11 addresses", fmt.Sprintf("%d served, %d closed at accept, %v evicted", len(served), 5500-len(served), refusals(server.RefusedConnectionEvicted)-evicted), before)
	if growth := int64(after) - int64(before); growth > 256<<20 {
		t.Errorf("the idle connections hold %d MiB of heap", growth>>20)
	}
}
