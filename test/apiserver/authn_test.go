package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
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
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.StartAPIServer() })
	if id, err := a.Tokens.Verify(ctx, token); err != nil || id.Namespace != "shop" {
		t.Fatalf("with the API server stopped: %+v, %v, want the cached keys to verify the token", id, err)
	}
}
