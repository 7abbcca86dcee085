package auth_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"google.golang.org/grpc/peer"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
)

// slowKeys answers a fetch after delay, or fails it when the fetch's
// context ends first, as the API server's discovery client does.
type slowKeys struct {
	*authtest.Issuer
	delay time.Duration
}

func (k slowKeys) Fetch(ctx context.Context) (string, jose.JSONWebKeySet, error) {
	select {
	case <-time.After(k.delay):
		return k.Issuer.Fetch(ctx)
	case <-ctx.Done():
		return "", jose.JSONWebKeySet{}, ctx.Err()
	}
}

// hangingKeys is an API server that accepts the key requests and never
// answers: a fetch ends only with its context (or the test).
type hangingKeys struct {
	*authtest.Issuer
	mu      sync.Mutex
	hanging bool
	release chan struct{}
}

func (k *hangingKeys) Fetch(ctx context.Context) (string, jose.JSONWebKeySet, error) {
	k.mu.Lock()
	hanging := k.hanging
	k.mu.Unlock()
	if !hanging {
		return k.Issuer.Fetch(ctx)
	}
	select {
	case <-ctx.Done():
		return "", jose.JSONWebKeySet{}, ctx.Err()
	case <-k.release:
		return "", jose.JSONWebKeySet{}, fmt.Errorf("released")
	}
}

func from(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

// TestKeyFetchOutlivesImpatientClients is the lockout of a fresh replica:
// a client without credentials sends tokens of a made-up key with deadlines
// far shorter than a key fetch, hundreds of times, with the clock still.
// The fetch its first token started runs on its own and completes; no
// other is started meanwhile; and a valid proxy's token then verifies with
// the fetched keys (before, each fetch ran on the impatient client's
// context, failed, counted as the attempt, and the proxy was refused).
func TestKeyFetchOutlivesImpatientClients(t *testing.T) {
	iss := authtest.NewIssuer(t, "k1")
	v := auth.NewTokenVerifier("scopeplane", slowKeys{Issuer: iss, delay: 50 * time.Millisecond}, nil)
	now := time.Now()
	auth.SetClock(v, func() time.Time { return now })
	made := authtest.NewIssuer(t, "made-up").Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	for range 300 {
		ctx, cancel := context.WithTimeout(from("127.0.0.2"), time.Millisecond)
		if _, err := v.Verify(ctx, made); err == nil {
			t.Fatal("a token of a made-up key was accepted")
		}
		cancel()
	}
	ctx, cancel := context.WithTimeout(from("127.0.0.1"), testkit.Timeout)
	defer cancel()
	if _, err := v.Verify(ctx, iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))); err != nil {
		t.Fatalf("a valid token after the made-up ones: %v", err)
	}
	if n := iss.FetchCount(); n != 1 {
		t.Errorf("%d completed fetches of the keys, want 1 (one at a time, at most every 10 s)", n)
	}
}

// TestReviewsArePacedPerPeer has one client address spend twice the
// replica's review burst on tokens of an unknown key: only its own budget
// goes, and a token of another address is still reviewed.
func TestReviewsArePacedPerPeer(t *testing.T) {
	r := &reviewer{}
	v := auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), r)
	now := time.Now()
	stranger := authtest.NewIssuer(t, "k2").Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	for range 2 * auth.ReviewBurst {
		_, _ = v.Verify(from("127.0.0.2"), stranger)
	}
	if r.calls != auth.ReviewsPerPeerBurst {
		t.Fatalf("one client address had %d tokens reviewed, want its burst of %d", r.calls, auth.ReviewsPerPeerBurst)
	}
	before := r.calls
	_, err := v.Verify(from("127.0.0.1"), stranger)
	if r.calls != before+1 {
		t.Fatalf("another client's token was not reviewed: %v", err)
	}
}

// TestHangingKeyRefreshDoesNotBlock caches the keys, steps past the
// refresh interval and makes the key endpoints hang: tokens of the cached
// key verify at once, concurrently, from callers without deadlines (an ADS
// stream has none), while the refresh waits in the background.
func TestHangingKeyRefreshDoesNotBlock(t *testing.T) {
	iss := authtest.NewIssuer(t, "k1")
	keys := &hangingKeys{Issuer: iss, release: make(chan struct{})}
	defer close(keys.release)
	v := auth.NewTokenVerifier("scopeplane", keys, nil)
	now := time.Now()
	var mu sync.Mutex
	clock := now
	auth.SetClock(v, func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	token := iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))
	if _, err := v.Verify(context.Background(), token); err != nil {
		t.Fatal(err)
	}
	keys.mu.Lock()
	keys.hanging = true
	keys.mu.Unlock()
	mu.Lock()
	clock = clock.Add(auth.KeyRefreshInterval + time.Second)
	mu.Unlock()
	results := make(chan error, 10)
	for range 10 {
		go func() {
			_, err := v.Verify(context.Background(), token)
			results <- err
		}()
	}
	for i := range 10 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("proxy %d: %v", i, err)
			}
		case <-time.After(testkit.Timeout):
			t.Fatalf("%d of 10 proxies with a cached key were not verified while the key endpoints hang", 10-i)
		}
	}
}

// TestTokenLifetimeIsCapped refuses a token valid for longer than the
// lifetime cap (a year-long token TokenRequest grants on request), and
// accepts one within it.
func TestTokenLifetimeIsCapped(t *testing.T) {
	iss := authtest.NewIssuer(t, "k1")
	v := auth.NewTokenVerifier("scopeplane", iss, nil)
	now := time.Now()
	if _, err := v.Verify(context.Background(), iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(time.Hour)))); err != nil {
		t.Fatalf("an hour-long token: %v", err)
	}
	_, err := v.Verify(context.Background(), iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now, now.Add(365*24*time.Hour))))
	if want := "it is valid for 8760h0m0s, longer than this server accepts (24h0m0s, --xds-max-token-lifetime): mount a projected token with a shorter expirationSeconds"; err == nil || err.Error() != want {
		t.Fatalf("a year-long token: %v, want %q", err, want)
	}
}
