package server

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/scopeplane/scopeplane/xds/peerrate"
)

// loopbackConns opens n TCP connections to a loopback listener from the
// loopback address ip, and returns the server's ends.
func loopbackConns(t *testing.T, ip string, n int) []net.Conn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	var served []net.Conn
	for range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := lis.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
		served = append(served, s)
	}
	return served
}

// TestEvictionMakesRoomFromIdleConnections walks the bounds of open
// connections: the replica's and a peer's are met by evicting the oldest
// connection that never carried an authenticated stream — the peer's own
// when the peer is full, the fullest peer's when the replica is, and only
// from a peer holding more than the newcomer's — and never one that did
// carry one, nor one younger than the cutoff.
func TestEvictionMakesRoomFromIdleConnections(t *testing.T) {
	cs := newConns(4, 3)
	past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	add := func(c net.Conn) *conn {
		t.Helper()
		p := peerrate.Of(c.RemoteAddr())
		if !cs.reserve(p) {
			t.Fatalf("no room for a connection of %s: %d open, %v by peer", p, cs.Open(), cs.byPeer)
		}
		return cs.add(c, p).(*conn)
	}
	a := loopbackConns(t, "127.0.0.2", 4)
	var held []*conn
	for _, c := range a[:3] {
		held = append(held, add(c))
	}
	if cs.reserve("127.0.0.2") {
		t.Fatal("a fourth connection of a peer allowed three was reserved")
	}
	if cs.evict("127.0.0.2", past) {
		t.Error("a connection younger than the cutoff was evicted")
	}
	if !cs.evict("127.0.0.2", future) {
		t.Fatal("a full peer's own idle connection was not evicted for its new one")
	}
	if !closed(held[0]) || closed(held[1]) {
		t.Error("the evicted connection is not the peer's oldest")
	}
	held = append(held[1:], add(a[3]))

	b := loopbackConns(t, "127.0.0.3", 2)
	held = append(held, add(b[0])) // the replica's fourth
	if cs.reserve("127.0.0.3") {
		t.Fatal("a fifth connection of a replica allowed four was reserved")
	}
	if !cs.evict("127.0.0.3", future) {
		t.Fatal("the fullest peer's idle connection was not evicted for a peer holding fewer")
	}
	if !closed(held[0]) {
		t.Error("the evicted connection is not the fullest peer's oldest")
	}
	held = append(held[1:], add(b[1]))
	// Both peers hold two now: neither gives way to the other.
	if cs.reserve("127.0.0.3") || cs.evict("127.0.0.3", future) {
		t.Error("a peer holding as many as the fullest one took a connection from it")
	}
	// A connection that carried an authenticated stream is never evicted.
	for _, h := range held {
		cs.prove(peer.NewContext(context.Background(), &peer.Peer{Addr: h.RemoteAddr()}))
	}
	if cs.evict("127.0.0.4", future) {
		t.Error("a proven connection was evicted")
	}
	if open := cs.Open(); open != 4 {
		t.Errorf("%d connections counted open, want 4", open)
	}
}

// closed reports whether c's server end was closed (Close uncounted it).
func closed(c *conn) bool {
	_, err := c.Write([]byte{0})
	return err != nil
}
