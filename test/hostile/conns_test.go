package hostile

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/time/rate"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The rows of this file hold the replica's connection budget from many
// loopback addresses and measure, meanwhile, legitimate proxies joining
// from their own, one after the other: each must.
const (
	// joinsDuring proxies join during a confined row, each given joinBound
	// (a proxy retries with backoff until then).
	joinsDuring = 5
	joinBound   = 20 * time.Second
	// attemptsDuring proxies try once each during the slowloris row, a
	// second apart, each given tplane.join's 10 s.
	attemptsDuring = 20
)

// spread is the loopback address of the i-th of many attacking addresses,
// from 127.0.base.1 on, 250 to a /24.
func spread(base, i int) string {
	return fmt.Sprintf("127.0.%d.%d", base+i/250, 1+i%250)
}

// heldConns are connections an attack holds open; each reports its end.
type heldConns struct {
	mu     sync.Mutex
	conns  []net.Conn
	closed atomic.Int64
}

func (h *heldConns) add(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns = append(h.conns, c)
}

func (h *heldConns) open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns) - int(h.closed.Load())
}

func (h *heldConns) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		_ = c.Close()
	}
}

// holdHTTP2 connects from ip to addr and completes the HTTP/2 handshake;
// with req, it also opens one SotW stream that sends req and waits until
// the server ends that stream. It then holds the connection as an attacker
// does, answering the server's PINGs so that keepalive does not close it,
// until the server closes it. It reports whether the server served the
// connection (false: closed before it answered).
func holdHTTP2(ip, addr string, req []byte, h *heldConns) bool {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: testkit.Timeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return false
	}
	_ = c.SetDeadline(time.Now().Add(testkit.Timeout))
	w := bufio.NewWriter(c)
	_, _ = w.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(w, c)
	_ = fr.WriteSettings()
	if req != nil {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: sotwHeaders(addr), EndHeaders: true})
		_ = fr.WriteData(1, false, req)
	}
	if w.Flush() != nil {
		_ = c.Close()
		return false
	}
	for served := false; !served; {
		f, err := fr.ReadFrame()
		if err != nil {
			_ = c.Close()
			return false
		}
		acknowledge(fr, w, f)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			served = req == nil
		case *http2.HeadersFrame:
			served = f.StreamID == 1 && f.StreamEnded()
		case *http2.RSTStreamFrame:
			served = f.StreamID == 1
		case *http2.GoAwayFrame:
			_ = c.Close()
			return false
		}
	}
	_ = c.SetDeadline(time.Time{})
	h.add(c)
	go func() {
		defer h.closed.Add(1)
		defer func() { _ = c.Close() }()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			acknowledge(fr, w, f)
		}
	}()
	return true
}

// holdFrom has each of ips hold each connections (holdHTTP2 with req),
// at most 100 being opened at once, and returns them.
func holdFrom(t *testing.T, addr string, ips []string, each int, req []byte) *heldConns {
	h := &heldConns{}
	t.Cleanup(h.close)
	parallel(len(ips)*each, 100, func(i int) { holdHTTP2(ips[i%len(ips)], addr, req, h) })
	return h
}

// joins has n legitimate proxies join one after the other, a second apart,
// and returns how many did and the slowest join; it fails the test unless
// every one did.
func joins(t *testing.T, row string, n int, join func() (time.Duration, error)) (int, time.Duration) {
	t.Helper()
	joined, slowest := 0, time.Duration(0)
	for i := range n {
		if i > 0 {
			time.Sleep(time.Second)
		}
		took, err := join()
		if err != nil {
			t.Logf("%s: a legitimate proxy did not join: %v", row, err)
			continue
		}
		joined++
		slowest = max(slowest, took)
	}
	if joined != n {
		t.Errorf("%s: %d of %d legitimate proxies joined", row, joined, n)
	}
	return joined, slowest
}

// TestConnectionsUnderTheChartsMemoryLimit fills the connection budget of
// the replica confined as the chart confines it (512 MiB, GOMEMLIMIT at
// 90%) with connections a legitimate proxy must be able to take one of:
// connections from 15 addresses that each carried one refused stream (a
// stream refused at its scope is no proxy's), and idle connections from
// as many addresses as the replica holds connections (one each). The
// server must survive each with no OOM kill, every legitimate proxy that
// joins meanwhile must (within joinBound), and the connected proxy must be
// pushed to. The table gives the cgroup's peak usage per row.
func TestConnectionsUnderTheChartsMemoryLimit(t *testing.T) {
	cg := memoryCgroup(t, chartMemoryLimit)
	c := startConfined(t, cg, anonymousProfile)
	c.push("before the attacks")
	base := cgroupRead(t, cg, "memory.usage_in_bytes")
	var table strings.Builder
	fmt.Fprintf(&table, "\n| attack | held | cgroup peak (limit %d MiB; %.1f MiB serving before) | joined (of %d) | slowest join | push |\n|---|---|---|---|---|---|\n",
		chartMemoryLimit>>20, float64(base)/(1<<20), joinsDuring)
	d := server.DefaultOptions
	// Each row opens the replica's whole burst of new connections and
	// streams: the next waits until the paces refilled.
	refill := time.Duration(float64(max(d.NewConnectionsBurst, d.NewStreamsBurst)) / min(d.NewConnectionsPerSecond, d.NewStreamsPerSecond) * float64(time.Second))
	row := func(name string, run func() *heldConns) {
		t.Helper()
		cgroupWrite(t, cg, "memory.max_usage_in_bytes", "0")
		h := run()
		c.alive(name)
		held := h.open()
		joined, slowest := joins(t, name, joinsDuring, func() (time.Duration, error) { return c.joinWithin(joinBound) })
		push := c.push(name)
		h.close()
		c.alive(name)
		peak := cgroupRead(t, cg, "memory.max_usage_in_bytes")
		fmt.Fprintf(&table, "| %s | %d | %.1f MiB | %d | %s | %s |\n", name, held, float64(peak)/(1<<20), joined, slowest.Round(time.Millisecond), push.Round(time.Millisecond))
		time.Sleep(refill)
	}
	row("5,010 connections from 15 addresses, each carried a refused stream", func() *heldConns {
		ips := make([]string, 15)
		for i := range ips {
			ips[i] = spread(6, i)
		}
		req := grpcMessage(&discoveryv3.DiscoveryRequest{Node: node("refused", "default/none"), TypeUrl: xdstype.Cluster.URL()})
		return holdFrom(t, c.addr, ips, 334, req)
	})
	row("5,000 idle connections from 5,000 addresses", func() *heldConns {
		ips := make([]string, d.MaxConnections)
		for i := range ips {
			ips[i] = spread(7, i)
		}
		return holdFrom(t, c.addr, ips, 1, nil)
	})
	t.Log(table.String())
}

// TestHandshakeSlowlorisFromManyAddresses holds the replica's connection
// budget with TCP connections to its TLS port from 20 addresses that never
// start the TLS handshake, reopening each as soon as the server closes it
// (at the production handshake timeout, 10 s), within the per-address
// pace of new connections. Every legitimate proxy that tries to join
// meanwhile, once each (tplane.join), must.
func TestHandshakeSlowlorisFromManyAddresses(t *testing.T) {
	cert, roots := selfSignedCert(t)
	tp := startTransport(t, server.Options{},
		&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	d := server.DefaultOptions
	const addrs = 20
	each := d.MaxConnections / addrs
	before := heap()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var open, opened atomic.Int64
	defer func() { cancel(); wg.Wait() }()
	for a := range addrs {
		ip := spread(30, a)
		// The attacker's own pace is the server's per-address one.
		pace := rate.NewLimiter(rate.Limit(d.NewConnectionsPerPeerPerSecond), d.NewConnectionsPerPeerBurst)
		for range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for pace.Wait(ctx) == nil {
					dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
					c, err := dl.DialContext(ctx, "tcp", tp.addr)
					if err != nil {
						continue
					}
					open.Add(1)
					opened.Add(1)
					stop := context.AfterFunc(ctx, func() { _ = c.Close() })
					_, _ = c.Read(make([]byte, 1)) // until the server closes it
					stop()
					_ = c.Close()
					open.Add(-1)
				}
			}()
		}
	}
	testkit.Eventually(t, "the attack opened its connections", func() (bool, string) {
		n := opened.Load()
		return n >= int64(d.MaxConnections), fmt.Sprintf("%d opened", n)
	})
	testkit.Eventually(t, "the connections closed at accept are closed", func() (bool, string) {
		n := open.Load()
		return n <= int64(d.MaxConnections), fmt.Sprintf("%d open, at most %d held", n, d.MaxConnections)
	})
	held := open.Load()
	joined, slowest := joins(t, "TLS slowloris", attemptsDuring, tp.join)
	tp.during(fmt.Sprintf("%d TCP connections from %d addresses that never start TLS, reopened", d.MaxConnections, addrs),
		fmt.Sprintf("%d held at the start, %d opened in all; %d of %d joined, slowest %s", held, opened.Load(), joined, attemptsDuring, slowest.Round(time.Millisecond)), before)
}
