package auth_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
)

// pods is a PodIndex over a fixed list: the informer-backed index is
// tested against a real API server in internal/controlplane.
type pods struct {
	list     []auth.Pod
	ips      map[string][]netip.Addr // Pod UID -> its podIPs
	hostIPs  []netip.Addr
	notReady bool
}

func (p *pods) Holders(addr netip.Addr) ([]auth.Pod, bool, error) {
	if p.notReady {
		return nil, false, errors.New("not synced")
	}
	var out []auth.Pod
	for _, pod := range p.list {
		for _, ip := range p.ips[pod.UID] {
			if ip == addr {
				out = append(out, pod)
			}
		}
	}
	for _, h := range p.hostIPs {
		if h == addr {
			return out, true, nil
		}
	}
	return out, false, nil
}

func (p *pods) Changed(string, netip.Addr) (<-chan struct{}, func()) { return nil, func() {} }

func running(ns, name, sa string) auth.Pod {
	return auth.Pod{Namespace: ns, Name: name, UID: name + "-uid", ServiceAccount: sa, NodeName: "node-1", Running: true}
}

// peerCtx is a stream context whose peer is addr (host:port).
func peerCtx(addr string) context.Context {
	ap := netip.MustParseAddrPort(addr)
	return peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
}

// TestPeerAddress derives identities from the one Pod holding the peer
// address, and refuses every address that is not held by exactly one
// Running, not deleting, not host-network Pod, or is a Node's.
func TestPeerAddress(t *testing.T) {
	pending := running("shop", "pending", "grpc")
	pending.Running = false
	deleting := running("shop", "deleting", "grpc")
	deleting.Deleting = true
	hostNet := running("shop", "hostnet", "grpc")
	hostNet.HostNetwork = true
	idx := &pods{
		list: []auth.Pod{running("shop", "client", "grpc"), running("shop", "twin-a", "grpc"), running("bank", "twin-b", "teller"),
			pending, deleting, hostNet, running("shop", "on-node", "grpc")},
		ips: map[string][]netip.Addr{
			"client-uid":   {netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")},
			"twin-a-uid":   {netip.MustParseAddr("10.0.0.6")},
			"twin-b-uid":   {netip.MustParseAddr("10.0.0.6")},
			"pending-uid":  {netip.MustParseAddr("10.0.0.7")},
			"deleting-uid": {netip.MustParseAddr("10.0.0.8")},
			"hostnet-uid":  {netip.MustParseAddr("192.168.1.10")},
			// A Pod whose address is also a Node's: a misconfigured
			// network, or an address the node masquerades others behind.
			"on-node-uid": {netip.MustParseAddr("192.168.1.11")},
		},
		hostIPs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("192.168.1.11")},
	}
	a := &auth.Authenticator{PeerAddress: true, Pods: idx}
	for _, peerAddr := range []string{"10.0.0.5:40000", "[::ffff:10.0.0.5]:40000", "[fd00::5]:40000"} {
		id, err := a.Authenticate(peerCtx(peerAddr))
		if err != nil {
			t.Fatalf("%s: %v", peerAddr, err)
		}
		if id.Method != auth.MethodPeerAddress || id.Namespace != "shop" || id.ServiceAccount != "grpc" || id.PodName != "client" || id.PodUID != "client-uid" || id.NodeName != "node-1" {
			t.Fatalf("%s: identity %+v, want shop/grpc, Pod client on node-1", peerAddr, *id)
		}
		if !auth.Admits(id, "shop", nil, true) || !auth.Admits(id, "shop", []string{"grpc"}, true) {
			t.Errorf("%s: not admitted by a scope of shop that opts in", peerAddr)
		}
		if auth.Admits(id, "shop", nil, false) {
			t.Errorf("%s: admitted by a scope that does not opt in", peerAddr)
		}
		if auth.Admits(id, "shop", []string{"gateway"}, true) || auth.Admits(id, "bank", nil, true) {
			t.Errorf("%s: admitted past the namespace and spec.proxies rules", peerAddr)
		}
	}
	if got, want := first(a.Authenticate(peerCtx("10.0.0.5:1"))).String(), "system:serviceaccount:shop:grpc (pod client, by peer address 10.0.0.5)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := first(a.Authenticate(peerCtx("10.0.0.5:1"))).Refused(), "the client at 10.0.0.5, which presented no credential"; got != want {
		t.Errorf("Refused() = %q, want %q: a refusal must not name the Pod", got, want)
	}
	for _, tc := range []struct{ name, addr string }{
		{"no holder", "10.9.9.9:1"},
		{"two holders", "10.0.0.6:1"},
		{"Pending", "10.0.0.7:1"},
		{"deleting", "10.0.0.8:1"},
		{"host network", "192.168.1.10:1"},
		{"a Node's address", "192.168.1.11:1"},
		{"a Node's address, mapped", "[::ffff:192.168.1.11]:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := a.Authenticate(peerCtx(tc.addr))
			if err != nil {
				t.Fatalf("refused before the scope is known (%v): a refusal must read as a scope's", err)
			}
			if id == nil || id.Namespace != "" || id.ServiceAccount != "" || id.PodName != "" {
				t.Fatalf("identity %+v, want none", id)
			}
			for _, ns := range []string{"", "shop", "bank"} {
				if auth.Admits(id, ns, nil, true) {
					t.Errorf("admitted by a scope of %q that opts in", ns)
				}
			}
			want := "the client at " + netip.MustParseAddrPort(tc.addr).Addr().Unmap().String() + ", which presented no credential"
			if id.Refused() != want || id.String() != want {
				t.Errorf("named %q / %q, want %q", id.Refused(), id.String(), want)
			}
		})
	}
	idx.notReady = true
	if id, err := a.Authenticate(peerCtx("10.0.0.5:1")); err != nil || id.Namespace != "" {
		t.Errorf("an index that cannot answer yet gave %+v, %v; want no identity", id, err)
	}
	// With the anonymous opt-out too, an address held by no Pod is
	// anonymous, and one held is still its Pod.
	a.AllowAnonymous, idx.notReady = true, false
	if id, err := a.Authenticate(peerCtx("10.9.9.9:1")); id != nil || err != nil {
		t.Errorf("unheld address with anonymous allowed: %+v, %v; want anonymous", id, err)
	}
	if id, err := a.Authenticate(peerCtx("10.0.0.5:1")); err != nil || id.PodName != "client" {
		t.Errorf("held address with anonymous allowed: %+v, %v; want Pod client", id, err)
	}
}

// TestPublishedKeyIsNoCredential sends a JWT signed with the published
// key's id: it is treated as no credential (the peer address decides, or
// the stream has none), never as a token to verify, while a JWT of any
// other unknown key is still refused as a token.
func TestPublishedKeyIsNoCredential(t *testing.T) {
	now := time.Now()
	published := authtest.NewRSAIssuer(t, auth.PublishedKeyID).Sign(authtest.SAClaims("shop", "envoy", "https://scopeplane.example/envoy.service.discovery.v3.AggregatedDiscoveryService", now, now.Add(time.Hour)))
	stranger := authtest.NewRSAIssuer(t, "another-key").Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	bearer := func(ctx context.Context, token string) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	idx := &pods{list: []auth.Pod{running("shop", "client", "grpc")}, ips: map[string][]netip.Addr{"client-uid": {netip.MustParseAddr("10.0.0.5")}}}
	tokens := auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), nil)

	peerAuth := &auth.Authenticator{Tokens: tokens, PeerAddress: true, Pods: idx}
	id, err := peerAuth.Authenticate(bearer(peerCtx("10.0.0.5:1"), published))
	if err != nil || id.Method != auth.MethodPeerAddress || id.PodName != "client" {
		t.Fatalf("published-key JWT with peer-address: %+v, %v; want the Pod's identity", id, err)
	}
	// gRPC C-core 1.51 pads its JWT's base64url segments.
	padded := padSegments(published)
	if padded == published {
		t.Fatal("the test JWT needs padding in some segment")
	}
	id, err = peerAuth.Authenticate(bearer(peerCtx("10.0.0.5:1"), padded))
	if err != nil || id.Method != auth.MethodPeerAddress || id.PodName != "client" {
		t.Fatalf("padded published-key JWT with peer-address: %+v, %v; want the Pod's identity", id, err)
	}
	id, err = peerAuth.Authenticate(bearer(peerCtx("10.9.9.9:1"), published))
	if err != nil || id.Namespace != "" {
		t.Fatalf("published-key JWT from an unheld address: %+v, %v; want no identity", id, err)
	}
	if _, err := peerAuth.Authenticate(bearer(peerCtx("10.0.0.5:1"), stranger)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a JWT of another unknown key: %v, want Unauthenticated (a token is authoritative)", err)
	}

	tokenOnly := &auth.Authenticator{Tokens: tokens}
	_, err = tokenOnly.Authenticate(bearer(peerCtx("10.0.0.5:1"), published))
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != noCredentialsMessage {
		t.Fatalf("published-key JWT with tokens only: %v; want the refusal of a stream with no credential", err)
	}
	noTokens := &auth.Authenticator{AllowAnonymous: true}
	if id, err := noTokens.Authenticate(bearer(peerCtx("10.0.0.5:1"), published)); id != nil || err != nil {
		t.Fatalf("published-key JWT on a server without tokens, anonymous allowed: %+v, %v; want anonymous", id, err)
	}
}

// noCredentialsMessage is the refusal of a stream without credentials.
const noCredentialsMessage = "no credentials: scopeplane requires a ServiceAccount token (gRPC call credentials, metadata authorization: Bearer <token>) or a SPIFFE client certificate; see docs/bootstrap.md"

// padSegments adds base64 padding to each segment of a JWT, as C-core does.
func padSegments(jwt string) string {
	parts := strings.Split(jwt, ".")
	for i, p := range parts {
		if n := len(p) % 4; n != 0 {
			parts[i] = p + strings.Repeat("=", 4-n)
		}
	}
	return strings.Join(parts, ".")
}
