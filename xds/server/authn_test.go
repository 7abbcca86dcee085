package server_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// authnPlane serves, over TLS that asks for (but does not verify) client
// certificates, three scopes: shop/open (every ServiceAccount of shop),
// shop/narrow (spec.proxies: gateway) and shop/delta (Delta protocol).
type authnPlane struct {
	p    *pipeline.Pipeline
	addr string
	ca   *authtest.CA
	iss  *authtest.Issuer
}

func startAuthnPlane(t *testing.T) *authnPlane {
	t.Helper()
	ca := authtest.NewCA(t, "proxies")
	iss := authtest.NewIssuer(t, "k1")
	spiffe, err := auth.NewSPIFFEVerifier("cluster.local", authtest.BundleFile(t, t.TempDir(), ca))
	if err != nil {
		t.Fatal(err)
	}
	a := &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", iss, nil), SPIFFE: spiffe}
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	for _, sc := range []*model.Scope{
		{Key: model.Key{Namespace: "shop", Name: "open"}, Protocol: model.SotW},
		{Key: model.Key{Namespace: "shop", Name: "narrow"}, Protocol: model.SotW, Proxies: []string{"gateway"}},
		{Key: model.Key{Namespace: "shop", Name: "delta"}, Protocol: model.Delta},
	} {
		sc.Listener = model.Listener{Mode: model.ListenerEnvoy, Port: 10080}
		sc.Selections = []model.Selection{{Namespace: "shop", Selector: labels.Everything()}}
		p.Catalog.UpsertScope(sc)
	}
	p.Sync()
	addr := testkit.ServeTLS(t, p.Server.ServeListener, ca.ServerTLS())
	return &authnPlane{p: p, addr: addr, ca: ca, iss: iss}
}

// open opens a SotW stream naming scope, with the client certificate der
// (none when nil) and the bearer token (none when empty), and returns how
// it ends: nil when it is answered.
func (ap *authnPlane) open(t *testing.T, scope string, der []byte, key *ecdsa.PrivateKey, token string) error {
	t.Helper()
	conn, err := grpc.NewClient(ap.addr, grpc.WithTransportCredentials(credentials.NewTLS(ap.ca.ClientTLS(der, key))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A stream refused before its first request may end while it is sent:
	// Send then reports io.EOF and Recv the status.
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", scope), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = s.Recv()
	return err
}

func (ap *authnPlane) token(ns, sa, aud string) string {
	now := time.Now()
	return ap.iss.Sign(authtest.SAClaims(ns, sa, aud, now.Add(-time.Minute), now.Add(10*time.Minute)))
}

// TestAuthenticationRefusals opens streams with each kind of credential
// and asserts the exact status each ends with; a scope that does not exist
// and one that does not admit the identity answer the same.
func TestAuthenticationRefusals(t *testing.T) {
	ap := startAuthnPlane(t)
	now := time.Now()
	expired := ap.iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now.Add(-time.Hour), now.Add(-5*time.Minute)))
	spiffeEnvoy, spiffeKey := ap.ca.Leaf("spiffe://cluster.local/ns/shop/sa/envoy")
	foreign := authtest.NewCA(t, "foreign")
	foreignCert, foreignKey := foreign.Leaf("spiffe://cluster.local/ns/shop/sa/envoy")
	plainCert, plainKey := ap.ca.Leaf("")
	const (
		noCreds = "no credentials: scopeplane requires a ServiceAccount token (gRPC call credentials, metadata authorization: Bearer <token>) or a SPIFFE client certificate; see docs/bootstrap.md"
		denied  = "ProxyScope %s does not exist or does not admit system:serviceaccount:%s (pod envoy-7f9): a scope admits the ServiceAccounts of its own namespace, narrowed by its spec.proxies"
	)
	for _, tc := range []struct {
		name, scope, token string
		cert               []byte
		key                *ecdsa.PrivateKey
		code               codes.Code
		msg                string
	}{
		{name: "token", scope: "shop/open", token: ap.token("shop", "envoy", "scopeplane")},
		{name: "token in spec.proxies", scope: "shop/narrow", token: ap.token("shop", "gateway", "scopeplane")},
		{name: "SPIFFE certificate", scope: "shop/open", cert: spiffeEnvoy, key: spiffeKey},
		{name: "no credentials", scope: "shop/open", code: codes.Unauthenticated, msg: noCreds},
		{name: "expired token", scope: "shop/open", token: expired, code: codes.Unauthenticated,
			msg: "the ServiceAccount token is not accepted: it has expired: the kubelet refreshes a projected token; a proxy must read the file again on reconnect"},
		{name: "wrong audience", scope: "shop/open", token: ap.token("shop", "envoy", "api"), code: codes.Unauthenticated,
			msg: `the ServiceAccount token is not accepted: its audience is not "scopeplane": set audience: scopeplane on the projected serviceAccountToken volume (--xds-token-audience)`},
		{name: "token of another namespace", scope: "shop/open", token: ap.token("bank", "envoy", "scopeplane"), code: codes.PermissionDenied,
			msg: fmtf(denied, `"shop/open"`, "bank:envoy")},
		{name: "not in spec.proxies", scope: "shop/narrow", token: ap.token("shop", "envoy", "scopeplane"), code: codes.PermissionDenied,
			msg: fmtf(denied, `"shop/narrow"`, "shop:envoy")},
		{name: "scope that does not exist", scope: "shop/nope", token: ap.token("shop", "envoy", "scopeplane"), code: codes.PermissionDenied,
			msg: fmtf(denied, `"shop/nope"`, "shop:envoy")},
		{name: "foreign scope that does not exist", scope: "bank/nope", token: ap.token("shop", "envoy", "scopeplane"), code: codes.PermissionDenied,
			msg: fmtf(denied, `"bank/nope"`, "shop:envoy")},
		{name: "admitted, wrong protocol", scope: "shop/delta", token: ap.token("shop", "envoy", "scopeplane"), code: codes.FailedPrecondition,
			msg: `ProxyScope "shop/delta" requires the Delta protocol (spec.protocol: Delta) but this proxy opened a SotW stream: set api_type: DELTA_GRPC in the ADS config of its bootstrap, or change the scope's spec.protocol`},
		{name: "certificate of another CA", scope: "shop/open", cert: foreignCert, key: foreignKey, code: codes.Unauthenticated,
			msg: "the client certificate is not accepted: it does not verify against the trust bundle of cluster.local (--xds-spiffe-trust-bundle): x509svid: could not verify leaf certificate: x509: certificate signed by unknown authority"},
		{name: "certificate without SPIFFE ID", scope: "shop/open", cert: plainCert, key: plainKey, code: codes.Unauthenticated,
			msg: "the client certificate is not accepted: it carries no SPIFFE ID (want one URI SAN spiffe://cluster.local/ns/<namespace>/sa/<serviceaccount>)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ap.open(t, tc.scope, tc.cert, tc.key, tc.token)
			st := status.Convert(err)
			if st.Code() != tc.code || (tc.code != codes.OK && st.Message() != tc.msg) {
				t.Fatalf("ended with %v %q,\nwant %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	// Only the admitted stream's refusal counts against a scope.
	for _, name := range []string{"open", "narrow", "nope"} {
		if r := ap.p.Feedback.Get(model.Key{Namespace: "shop", Name: name}).Refused; len(r) != 0 {
			t.Errorf("scope shop/%s counts refusals %v, want none: they were not admitted", name, r)
		}
	}
	if r := ap.p.Feedback.Get(model.Key{Namespace: "shop", Name: "delta"}).Refused; r[feedback.RefusedWrongProto] != 1 || len(r) != 1 {
		t.Errorf("scope shop/delta counts refusals %v, want one %s", r, feedback.RefusedWrongProto)
	}
	global := ap.p.Feedback.Get(model.Key{}).Refused
	if global[server.RefusedUnauthenticated] != 5 || global[server.RefusedNotAdmitted] != 4 {
		t.Errorf("global refusals %v, want 5 %s and 4 %s", global, server.RefusedUnauthenticated, server.RefusedNotAdmitted)
	}
}

// TestIdentityReported checks that a connected proxy's identity is what
// feedback reports for it.
func TestIdentityReported(t *testing.T) {
	ap := startAuthnPlane(t)
	conn, err := grpc.NewClient(ap.addr, grpc.WithTransportCredentials(credentials.NewTLS(ap.ca.ClientTLS(nil, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+ap.token("shop", "envoy", "scopeplane")))
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := model.Key{Namespace: "shop", Name: "open"}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", key.String()), TypeUrl: xdstype.Cluster.URL()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ap.p.Feedback.Get(key).Proxies {
		if want := "system:serviceaccount:shop:envoy (pod envoy-7f9)"; p.Identity != want {
			t.Errorf("proxy identity %q, want %q", p.Identity, want)
		}
		return
	}
	t.Fatal("no proxy connected to shop/open")
}

func fmtf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// holders is a PodIndex of fixed Pods by address.
type holders map[netip.Addr][]auth.Pod

func (h holders) Holders(addr netip.Addr) ([]auth.Pod, bool, error) { return h[addr], false, nil }
func (h holders) Changed(string, netip.Addr) (<-chan struct{}, func()) {
	return nil, func() {}
}

// TestPeerAddressRefusals admits a stream without credentials as the Pod
// holding its address only in a scope that opts in, and refuses it from a
// scope that does not exactly as from a scope that does not exist; the
// published key's JWT changes nothing.
func TestPeerAddressRefusals(t *testing.T) {
	ca := authtest.NewCA(t, "proxies")
	loopback := netip.MustParseAddr("127.0.0.1")
	idx := holders{loopback: {{Namespace: "shop", Name: "client", UID: "u1", ServiceAccount: "grpc", Running: true}}}
	a := &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), nil), PeerAddress: true, Pods: idx}
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	for _, sc := range []*model.Scope{
		{Key: model.Key{Namespace: "shop", Name: "opted"}, Protocol: model.SotW, AdmitByPeerAddress: true},
		{Key: model.Key{Namespace: "shop", Name: "narrow"}, Protocol: model.SotW, AdmitByPeerAddress: true, Proxies: []string{"gateway"}},
		{Key: model.Key{Namespace: "shop", Name: "closed"}, Protocol: model.SotW},
		{Key: model.Key{Namespace: "bank", Name: "opted"}, Protocol: model.SotW, AdmitByPeerAddress: true},
	} {
		sc.Listener = model.Listener{Mode: model.ListenerEnvoy, Port: 10080}
		sc.Selections = []model.Selection{{Namespace: sc.Key.Namespace, Selector: labels.Everything()}}
		p.Catalog.UpsertScope(sc)
	}
	p.Sync()
	ap := &authnPlane{p: p, addr: testkit.ServeTLS(t, p.Server.ServeListener, ca.ServerTLS()), ca: ca}
	now := time.Now()
	published := authtest.NewRSAIssuer(t, auth.PublishedKeyID).Sign(authtest.SAClaims("bank", "teller", "https://x/y", now, now.Add(time.Hour)))
	const denied = "ProxyScope %s does not exist or does not admit the client at 127.0.0.1, which presented no credential: a scope admits the ServiceAccounts of its own namespace, narrowed by its spec.proxies; a proxy without a credential only when the scope sets spec.admitByPeerAddress and one Running Pod of that namespace holds its address"
	for _, tc := range []struct {
		name, scope, token string
		code               codes.Code
		msg                string
	}{
		{name: "opted in", scope: "shop/opted"},
		{name: "opted in, published key", scope: "shop/opted", token: published},
		{name: "not opted in", scope: "shop/closed", code: codes.PermissionDenied, msg: fmtf(denied, `"shop/closed"`)},
		{name: "does not exist", scope: "shop/nope", code: codes.PermissionDenied, msg: fmtf(denied, `"shop/nope"`)},
		{name: "not in spec.proxies", scope: "shop/narrow", code: codes.PermissionDenied, msg: fmtf(denied, `"shop/narrow"`)},
		{name: "another namespace's, opted in", scope: "bank/opted", token: published, code: codes.PermissionDenied, msg: fmtf(denied, `"bank/opted"`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(ap.open(t, tc.scope, nil, nil, tc.token))
			if st.Code() != tc.code || (tc.code != codes.OK && st.Message() != tc.msg) {
				t.Fatalf("ended with %v %q,\nwant %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	// A client that no scope can admit is refused before its first request
	// is read, alike whether a Pod of a namespace without an opted-in scope
	// holds its address or none does.
	const nowhere = "no ProxyScope admits the client at 127.0.0.1, which presented no credential: a proxy without a credential is admitted only by a scope of its own namespace that sets spec.admitByPeerAddress, when one Running Pod of that namespace holds its address; give the proxy a ServiceAccount token or a SPIFFE certificate otherwise"
	idx[loopback] = []auth.Pod{{Namespace: "elsewhere", Name: "client", UID: "u2", ServiceAccount: "grpc", Running: true}}
	if st := status.Convert(ap.open(t, "shop/opted", nil, nil, "")); st.Code() != codes.PermissionDenied || st.Message() != nowhere {
		t.Fatalf("a Pod no scope admits ended with %v %q, want the refusal before reading", st.Code(), st.Message())
	}
	delete(idx, loopback)
	if st := status.Convert(ap.open(t, "shop/opted", nil, nil, "")); st.Code() != codes.PermissionDenied || st.Message() != nowhere {
		t.Fatalf("an address no Pod holds ended with %v %q, want the refusal before reading", st.Code(), st.Message())
	}
}
