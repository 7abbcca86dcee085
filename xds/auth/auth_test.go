package auth_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
)

type reviewer struct{ calls int }

func (r *reviewer) Review(_ context.Context, _, audience string) (*auth.Identity, error) {
	r.calls++
	return nil, &reviewErr{audience}
}

type reviewErr struct{ audience string }

func (e *reviewErr) Error() string {
	return "the API server does not authenticate it for audience " + e.audience
}

// TestTokenVerifier checks each claim a ServiceAccount token is held to,
// with tokens signed by a local key: TokenRequest cannot mint an expired
// or not-yet-valid token.
func TestTokenVerifier(t *testing.T) {
	iss := authtest.NewIssuer(t, "k1")
	now := time.Now()
	v := auth.NewTokenVerifier("scopeplane", iss, nil)
	id, err := v.Verify(context.Background(), iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now.Add(-time.Minute), now.Add(10*time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	want := auth.Identity{Method: auth.MethodToken, Namespace: "shop", ServiceAccount: "envoy", PodName: "envoy-7f9", PodUID: "c2d3", NodeName: "node-1",
		ServiceAccountUID: "0a1b", Expiry: id.Expiry}
	if !id.Expiry.Equal(now.Add(10 * time.Minute).Truncate(time.Second)) {
		t.Errorf("expiry %v, want the token's exp %v", id.Expiry, now.Add(10*time.Minute).Truncate(time.Second))
	}
	if *id != want {
		t.Fatalf("identity %+v, want %+v", *id, want)
	}
	if got := id.String(); got != "system:serviceaccount:shop:envoy (pod envoy-7f9)" {
		t.Errorf("String() = %q", got)
	}
	other := authtest.NewIssuer(t, "k1") // same kid, another key
	for _, tc := range []struct {
		name, token, want string
	}{
		{"expired", iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now.Add(-time.Hour), now.Add(-5*time.Minute))),
			"it has expired: the kubelet refreshes a projected token; a proxy must read the file again on reconnect"},
		{"not yet valid", iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now.Add(5*time.Minute), now.Add(time.Hour))),
			"it is not valid yet (nbf/iat in the future): check the node's clock"},
		{"wrong audience", iss.Sign(authtest.SAClaims("shop", "envoy", "api", now, now.Add(time.Hour))),
			`its audience is not "scopeplane": set audience: scopeplane on the projected serviceAccountToken volume (--xds-token-audience)`},
		{"forged", other.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour))), "its signature does not verify"},
		{"not a JWT", "abc", "it is not a signed JWT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.token)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
	c := authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour))
	c.Issuer = "https://elsewhere"
	if _, err := v.Verify(context.Background(), iss.Sign(c)); err == nil || err.Error() != "its issuer is not this cluster's ("+authtest.IssuerURL+")" {
		t.Errorf("foreign issuer: %v", err)
	}
}

// TestTokenVerifierKeepsKeysThroughOutage verifies a token while the
// issuer's keys cannot be fetched: the cached keys still verify it, and a
// token of an unknown key goes to the reviewer.
func TestTokenVerifierKeepsKeysThroughOutage(t *testing.T) {
	iss := authtest.NewIssuer(t, "k1")
	r := &reviewer{}
	v := auth.NewTokenVerifier("scopeplane", iss, r)
	now := time.Now()
	clock := now
	auth.SetClock(v, func() time.Time { return clock })
	token := iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	if _, err := v.Verify(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	iss.SetDown(true)
	if _, err := v.Verify(context.Background(), token); err != nil {
		t.Fatalf("with the API server away: %v", err)
	}
	stranger := authtest.NewIssuer(t, "k2")
	clock = clock.Add(11 * time.Second) // past the pace of fetches for unknown keys
	_, err := v.Verify(context.Background(), stranger.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour))))
	if err == nil || r.calls != 1 {
		t.Fatalf("unknown key: error %v after %d reviews, want the reviewer's refusal", err, r.calls)
	}
	if iss.FetchCount() != 2 {
		t.Errorf("%d fetches of the keys, want 2 (the first, and one for the unknown key)", iss.FetchCount())
	}
	// Past the refresh interval the keys are fetched again, in the
	// background; failing, the cached ones still verify.
	clock = clock.Add(auth.KeyRefreshInterval)
	if _, err := v.Verify(context.Background(), token); err != nil {
		t.Fatalf("after the refresh interval: %v", err)
	}
	testkit.Eventually(t, "the keys fetched again", func() (bool, string) {
		n := iss.FetchCount()
		return n == 3, fmt.Sprintf("%d fetches, want 3", n)
	})
}

// TestSPIFFEVerifier checks client certificates against a trust bundle.
func TestSPIFFEVerifier(t *testing.T) {
	trusted, foreign := authtest.NewCA(t, "trusted"), authtest.NewCA(t, "foreign")
	v, err := auth.NewSPIFFEVerifier("cluster.local", authtest.BundleFile(t, t.TempDir(), trusted))
	if err != nil {
		t.Fatal(err)
	}
	good, _ := trusted.Leaf("spiffe://cluster.local/ns/shop/sa/envoy")
	id, err := v.Verify([][]byte{good})
	if err != nil {
		t.Fatal(err)
	}
	if want := (auth.Identity{Method: auth.MethodSPIFFE, Namespace: "shop", ServiceAccount: "envoy", SPIFFEID: "spiffe://cluster.local/ns/shop/sa/envoy"}); *id != want {
		t.Fatalf("identity %+v, want %+v", *id, want)
	}
	for _, tc := range []struct {
		name string
		cert []byte
		want string
	}{
		{"another CA", first(foreign.Leaf("spiffe://cluster.local/ns/shop/sa/envoy")), "it does not verify against the trust bundle of cluster.local"},
		{"no SPIFFE ID", first(trusted.Leaf("")), "it carries no SPIFFE ID (want one URI SAN spiffe://cluster.local/ns/<namespace>/sa/<serviceaccount>)"},
		{"another trust domain", first(trusted.Leaf("spiffe://example.org/ns/shop/sa/envoy")), "it does not verify against the trust bundle of cluster.local"},
		{"not a ServiceAccount", first(trusted.Leaf("spiffe://cluster.local/workload/envoy")), "SPIFFE ID spiffe://cluster.local/workload/envoy: the path is not /ns/<namespace>/sa/<serviceaccount>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify([][]byte{tc.cert})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to start with %q", err, tc.want)
			}
		})
	}
}

func first[A, B any](a A, _ B) A { return a }

// TestAdmits checks the namespace and spec.proxies rule.
func TestAdmits(t *testing.T) {
	id := &auth.Identity{Namespace: "shop", ServiceAccount: "envoy"}
	for _, tc := range []struct {
		ns      string
		proxies []string
		want    bool
	}{
		{"shop", nil, true},
		{"shop", []string{"gateway", "envoy"}, true},
		{"shop", []string{"gateway"}, false},
		{"bank", nil, false},
		{"bank", []string{"envoy"}, false},
	} {
		if got := auth.Admits(id, tc.ns, tc.proxies, false); got != tc.want {
			t.Errorf("Admits(%s, %v) = %v, want %v", tc.ns, tc.proxies, got, tc.want)
		}
	}
	if !auth.Admits(nil, "bank", []string{"x"}, false) {
		t.Error("an anonymous stream (allowed explicitly) is not admitted")
	}
}

// TestTokenReviewsArePaced sends twice the review burst of tokens of an
// unknown key: the reviewer is not asked for all of them, and the rest are
// told to retry.
func TestTokenReviewsArePaced(t *testing.T) {
	r := &reviewer{}
	v := auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), r)
	stranger := authtest.NewIssuer(t, "k2")
	now := time.Now()
	token := stranger.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	paced := 0
	for range 2 * auth.ReviewBurst {
		_, err := v.Verify(context.Background(), token)
		if err != nil && err.Error() == "its signing key is not known, and this replica reviews at most 10 such tokens a second (1 from one client address); retry" {
			paced++
		}
	}
	if r.calls != auth.ReviewsPerPeerBurst || r.calls+paced != 2*auth.ReviewBurst {
		t.Fatalf("%d reviews and %d paced of %d tokens of one client, want its burst (%d) reviewed and the rest paced", r.calls, paced, 2*auth.ReviewBurst, auth.ReviewsPerPeerBurst)
	}
}
