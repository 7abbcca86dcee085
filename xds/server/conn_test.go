package server

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

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

// TestTakeMakesRoomFromUnadmittedConnections walks the bounds of open
// connections: the replica's and a peer's are met by taking the oldest
// connection that carried no stream admitted to a scope, whatever its age
// (one in its handshake too) — the peer's own when the peer is full, else
// the one of the peer holding the most such connections, if it holds more
// than the newcomer's — and never one that did carry one. A connection
// closed without an admitted stream spends a failure of its peer's.
func TestTakeMakesRoomFromUnadmittedConnections(t *testing.T) {
	var failed []string
	cs := newConns(4, 3, func(p string) { failed = append(failed, p) })
	add := func(c net.Conn) *conn {
		t.Helper()
		p := peerrate.Of(c.RemoteAddr())
		victim, ok := cs.take(p)
		if !ok || victim != nil {
			t.Fatalf("no room for a connection of %s: %d open, %v by peer (victim %v)", p, cs.Open(), cs.byPeer, victim)
		}
		return cs.add(c, p).(*conn)
	}
	// takeFrom takes room for a new connection of p, closing the victim,
	// and returns the victim.
	takeFrom := func(p string) (*conn, bool) {
		victim, ok := cs.take(p)
		if victim != nil {
			_ = victim.Close()
		}
		return victim, ok
	}
	a := loopbackConns(t, "127.0.0.2", 4)
	var held []*conn
	for _, c := range a[:3] {
		held = append(held, add(c))
	}
	if v, ok := takeFrom("127.0.0.2"); !ok || v != held[0] || !closed(held[0]) || closed(held[1]) {
		t.Fatalf("a full peer's new connection took %v (ok %v), want the peer's oldest, %v", v, ok, held[0])
	}
	held = append(held[1:], cs.add(a[3], "127.0.0.2").(*conn))

	b := loopbackConns(t, "127.0.0.3", 3)
	held = append(held, add(b[0])) // the replica's fourth
	if v, ok := takeFrom("127.0.0.3"); !ok || v != held[0] {
		t.Fatalf("a peer holding 1 took %v (ok %v) from a full replica, want the oldest of the peer holding 3, %v", v, ok, held[0])
	}
	held = append(held[1:], cs.add(b[1], "127.0.0.3").(*conn))
	// Both peers hold two now: neither gives way to the other.
	if v, ok := takeFrom("127.0.0.3"); ok || v != nil {
		t.Error("a peer holding as many as the fullest one took a connection from it")
	}
	if len(failed) != 2 || failed[0] != "127.0.0.2" || failed[1] != "127.0.0.2" {
		t.Errorf("the taken connections spent failures of %v, want 127.0.0.2's twice", failed)
	}
	// A connection that carried an admitted stream is never taken, and
	// spends no failure when it closes.
	for _, h := range held {
		cs.admitted(peer.NewContext(context.Background(), &peer.Peer{Addr: h.RemoteAddr()}))
	}
	if v, ok := takeFrom("127.0.0.4"); ok || v != nil {
		t.Error("an admitted connection was taken")
	}
	if open := cs.Open(); open != 4 {
		t.Errorf("%d connections counted open, want 4", open)
	}
	_ = held[0].Close()
	if len(failed) != 2 {
		t.Errorf("closing an admitted connection spent a failure: %v", failed)
	}
}

// TestTakeSharesAFullReplicaOut fills a replica with one connection not
// admitted from each of four addresses: a fifth address takes the oldest,
// and that address, reconnecting, takes the next oldest rather than the
// newest (a proxy's connection in its handshake).
func TestTakeSharesAFullReplicaOut(t *testing.T) {
	cs := newConns(4, 4, nil)
	var held []*conn
	for i := range 5 {
		ip := fmt.Sprintf("127.0.0.%d", 5+i)
		c := loopbackConns(t, ip, 1)[0]
		victim, ok := cs.take(ip)
		if !ok {
			t.Fatalf("no room for the connection of %s", ip)
		}
		if i == 4 && victim != held[0] {
			t.Fatalf("a new address took %v, want the oldest, %v", victim, held[0])
		}
		held = append(held, cs.add(c, ip).(*conn))
	}
	victim, ok := cs.take("127.0.0.5")
	if !ok || victim != held[1] {
		t.Fatalf("the address that lost its connection took %v (ok %v), want the next oldest, %v", victim, ok, held[1])
	}
}

// TestPeerBudgetsKeyIPv6Prefixes fills the budget of one peer from
// addresses of one IPv6 /64: they share it, whatever the address, while an
// address of another /64 has its own; with a prefix length of 128 each
// address is a peer.
func TestPeerBudgetsKeyIPv6Prefixes(t *testing.T) {
	for _, tc := range []struct {
		bits, admitted int
	}{{64, 3}, {128, 5}} {
		cs := newConns(100, 3, nil)
		admitted := 0
		for i := range 5 {
			a := netip.MustParseAddr(fmt.Sprintf("2001:db8:0:7:%x::%x", i*0x1111, i+1))
			if _, ok := cs.take(peerrate.KeyOf(a, tc.bits)); ok {
				admitted++
			}
		}
		if admitted != tc.admitted {
			t.Errorf("/%d: %d of 5 connections of one /64 were taken, want %d", tc.bits, admitted, tc.admitted)
		}
		if _, ok := cs.take(peerrate.KeyOf(netip.MustParseAddr("2001:db8:0:8::1"), tc.bits)); !ok {
			t.Errorf("/%d: a connection of another /64 was refused", tc.bits)
		}
	}
}

// closed reports whether c's server end was closed (Close uncounted it).
func closed(c *conn) bool {
	_, err := c.Write([]byte{0})
	return err != nil
}
