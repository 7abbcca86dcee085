package apiserver_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestTokenAuthentication verifies tokens the real API server mints with
// TokenRequest: through the issuer keys it serves (OIDC discovery and
// JWKS), with TokenReview for a key it does not know, and with the cached
// keys while the API server is stopped.
func TestTokenAuthentication(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"shop", "bank"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "envoy"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mint := func(ns, aud string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "envoy", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To(int64(600))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	a, err := auth.Config{Methods: "token", Audience: "scopeplane"}.Build(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := mint("shop", "scopeplane")
	id, err := a.Tokens.Verify(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	if id.Namespace != "shop" || id.ServiceAccount != "envoy" {
		t.Fatalf("identity %+v, want shop/envoy", id)
	}
	if id, err := a.Tokens.Verify(ctx, mint("bank", "scopeplane")); err != nil || id.Namespace != "bank" {
		t.Fatalf("a token of bank: %+v, %v", id, err)
	}
	_, err = a.Tokens.Verify(ctx, mint("shop", "api"))
	if want := `its audience is not "scopeplane"`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("a token for another audience: %v, want %q", err, want)
	}
	// A token of a key the issuer does not have goes to TokenReview.
	stranger := authtest.NewIssuer(t, "stranger")
	now := time.Now()
	_, err = a.Tokens.Verify(ctx, stranger.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour))))
	if want := `the API server does not authenticate it for audience "scopeplane"`; err == nil || err.Error() != want {
		t.Errorf("a token of an unknown key: %v, want %q", err, want)
	}
	streamAuthenticates(t, a, token)
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.StartAPIServer() })
	if id, err := a.Tokens.Verify(ctx, token); err != nil || id.Namespace != "shop" {
		t.Fatalf("with the API server stopped: %+v, %v, want the cached keys to verify the token", id, err)
	}
}

// streamAuthenticates opens an ADS stream over TLS with token as call
// credentials to a server authenticating with a, and checks that it is
// bound to shop/s, a scope of the token's namespace, and that a scope of
// another namespace refuses it.
func streamAuthenticates(t *testing.T, a *auth.Authenticator, token string) {
	t.Helper()
	ca := authtest.NewCA(t, "xds")
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	for _, key := range []model.Key{{Namespace: "shop", Name: "s"}, {Namespace: "bank", Name: "s"}} {
		p.Catalog.UpsertScope(&model.Scope{
			Key: key, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
			Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}},
		})
	}
	p.Sync()
	addr := testkit.ServeTLS(t, p.Server.ServeListener, ca.ServerTLS())
	ctx := context.Background()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(nil, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	open := func(scope string) error {
		sctx, end := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token))
		defer end()
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
		if err != nil {
			return err
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", scope), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = s.Recv()
		return err
	}
	if err := open("shop/s"); err != nil {
		t.Fatalf("a TokenRequest token of shop on shop/s: %v", err)
	}
	err = open("bank/s")
	want := `ProxyScope "bank/s" does not exist or does not admit system:serviceaccount:shop:envoy: a scope admits the ServiceAccounts of its own namespace, narrowed by its spec.proxies`
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || st.Message() != want {
		t.Fatalf("a TokenRequest token of shop on bank/s: %v, want PermissionDenied %q", err, want)
	}
}
