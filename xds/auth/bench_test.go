package auth_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
)

// BenchmarkAuthenticateToken is what authentication costs a new stream
// whose token's key is cached: reading the metadata, parsing the JWT,
// verifying its signature and checking the claims; RS256 is
// kube-apiserver's default key.
func BenchmarkAuthenticateToken(b *testing.B) {
	b.Run("RS256", func(b *testing.B) { benchmarkAuthenticate(b, authtest.NewRSAIssuer(b, "k1")) })
	b.Run("ES256", func(b *testing.B) { benchmarkAuthenticate(b, authtest.NewIssuer(b, "k1")) })
}

func benchmarkAuthenticate(b *testing.B, iss *authtest.Issuer) {
	a := &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", iss, nil)}
	now := time.Now()
	ctx := metadata.NewIncomingContext(context.Background(),
		metadata.Pairs("authorization", "Bearer "+iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))))
	if _, err := a.Authenticate(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Authenticate(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
