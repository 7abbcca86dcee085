package hostile

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/scopeplane/scopeplane/xds/server"
)

// TestConnectionHeapIsWhatTheBudgetCounts measures the live heap an idle
// connection makes the server hold, over plaintext and over TLS, and holds
// server.ConnectionHeap to it: the memory budget counts every open
// connection as that many bytes of the replica's floor (what it holds
// whatever its streams do). A figure below what a connection holds would
// charge idle connections to the proxies' streams and end them for
// nothing (a replica holding 5,500 idle connections ended its one proxy's
// stream so); one far above what a TLS connection (the chart's default)
// holds would give clients room the budget does not mean to. A plaintext
// connection holds about half as much, which is room for clients. What
// the test's own ends of the connections hold is counted too; it is small
// next to the server's (a TCP socket, a TLS client connection), and errs
// towards room for clients.
func TestConnectionHeapIsWhatTheBudgetCounts(t *testing.T) {
	const n = 4000 // 500 from each of 8 addresses: --xds-max-connections-per-peer
	cert, roots := selfSignedCert(t)
	for _, tc := range []struct {
		name           string
		server, client *tls.Config
	}{
		{name: "plaintext"},
		{name: "TLS",
			server: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			client: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, ServerName: "127.0.0.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := startTransport(t, server.Options{}, tc.server, tc.client)
			var (
				mu   sync.Mutex
				held []net.Conn
				next = 1
			)
			t.Cleanup(func() {
				for _, c := range held {
					_ = c.Close()
				}
			})
			open := func(n int) {
				for ; n > 0; n -= 500 {
					ip := fmt.Sprintf("127.0.1.%d", next)
					next++
					parallel(500, 50, func(int) {
						c := rawFrom(t, ip, tp.addr)
						if tc.client != nil {
							tc := tls.Client(c, tc.client)
							if err := tc.Handshake(); err != nil {
								t.Errorf("TLS handshake: %v", err)
								_ = c.Close()
								return
							}
							c = tc
						}
						if _, ok := handshake(t, c); !ok {
							t.Errorf("the server closed an idle connection before %d were open", n)
							_ = c.Close()
							return
						}
						mu.Lock()
						held = append(held, c)
						mu.Unlock()
					})
				}
			}
			before := heap()
			open(n)
			after := heap()
			if t.Failed() {
				return
			}
			per := (int64(after) - int64(before)) / n
			t.Logf("%s: %d idle connections hold %.1f MiB of live heap, %.1f KiB each (server.ConnectionHeap: %.1f KiB)",
				tc.name, n, float64(int64(after)-int64(before))/(1<<20), float64(per)/1024, float64(server.ConnectionHeap)/1024)
			if per > server.ConnectionHeap {
				t.Errorf("an idle %s connection holds %.1f KiB of live heap, more than server.ConnectionHeap (%.1f KiB)",
					tc.name, float64(per)/1024, float64(server.ConnectionHeap)/1024)
			}
			if tc.server != nil && per < server.ConnectionHeap*6/10 {
				t.Errorf("an idle TLS connection holds %.1f KiB of live heap; server.ConnectionHeap (%.1f KiB) is more than 5/3 of it",
					float64(per)/1024, float64(server.ConnectionHeap)/1024)
			}
		})
	}
}
