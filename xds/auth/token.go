package auth

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/peer"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/scopeplane/scopeplane/xds/peerrate"
)

// DefaultAudience is the audience a proxy's projected token must carry.
const DefaultAudience = "scopeplane"

// KeyRefreshInterval is how often the issuer's keys are fetched again while
// tokens are verified, so a retired key stops verifying; a token signed by
// a key not in the cache fetches them at once (at most every
// minKeyRefresh). Fetches run on their own context, bounded by
// keyFetchTimeout, one at a time: whoever asked for one (and may give up)
// neither cancels it nor makes the next one wait, and a token whose key is
// cached is verified with the cached keys while a refresh runs.
const (
	KeyRefreshInterval = 5 * time.Minute
	minKeyRefresh      = 10 * time.Second
	keyFetchTimeout    = 10 * time.Second
)

// DefaultMaxTokenLifetime is the longest lifetime (exp - iat) of a token
// the verifier accepts: a projected token lives an hour by default and the
// kubelet renews it at 80% of that; a token minted for a year (TokenRequest
// allows it) would otherwise outlive every revocation but the checks of its
// bound objects.
const DefaultMaxTokenLifetime = 24 * time.Hour

// ReviewsPerSecond and ReviewBurst bound the TokenReviews the verifier
// asks for: anyone reaching the xDS port can send a token of a made-up
// key, and each would otherwise cost the API server a review.
// ReviewsPerPeerPerSecond and ReviewsPerPeerBurst bound those of one client
// IP address within them, so that one client cannot spend them for all.
const (
	ReviewsPerSecond        = 10
	ReviewBurst             = 100
	ReviewsPerPeerPerSecond = 1
	ReviewsPerPeerBurst     = 10
)

// signatureAlgorithms are those kube-apiserver signs ServiceAccount tokens with.
var signatureAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512}

// Keys is where the issuer and its signing keys come from: the API server's
// OIDC discovery (/.well-known/openid-configuration and /openid/v1/jwks),
// read through the manager's own connection, since the issuer URL is often
// not reachable from inside the cluster.
type Keys interface {
	Fetch(ctx context.Context) (issuer string, keys jose.JSONWebKeySet, err error)
}

// Reviewer asks the API server whether a token is valid for an audience;
// it is the fallback for a token whose key the verifier cannot get.
type Reviewer interface {
	Review(ctx context.Context, token, audience string) (*Identity, error)
}

// TokenVerifier verifies ServiceAccount tokens locally against cached
// issuer keys, so that a proxy whose token is signed by a known key
// reconnects while the API server is away, and falls back to TokenReview
// only for a token whose key it does not have.
type TokenVerifier struct {
	audience string
	keys     Keys
	reviewer Reviewer
	reviews  *peerrate.Limiter
	now      func() time.Time
	// fetchTimeout bounds one fetch of the keys.
	fetchTimeout time.Duration
	// MaxLifetime is the longest exp - iat accepted (DefaultMaxTokenLifetime
	// when zero).
	MaxLifetime time.Duration

	mu        sync.Mutex
	issuer    string
	set       jose.JSONWebKeySet
	fetched   time.Time // last successful fetch
	attempted time.Time // end of the last fetch, successful or not
	// fetching is closed when the fetch under way ends; nil when none is.
	fetching chan struct{}
}

// NewTokenVerifier verifies tokens for audience with keys from keys and
// reviews those it cannot verify with reviewer (nil: refuse them).
func NewTokenVerifier(audience string, keys Keys, reviewer Reviewer) *TokenVerifier {
	return &TokenVerifier{audience: audience, keys: keys, reviewer: reviewer, now: time.Now, fetchTimeout: keyFetchTimeout,
		reviews: peerrate.New(ReviewsPerPeerPerSecond, ReviewsPerPeerBurst, rate.NewLimiter(ReviewsPerSecond, ReviewBurst))}
}

// kubernetesClaims is the "kubernetes.io" claim of a ServiceAccount token.
type kubernetesClaims struct {
	Namespace      string `json:"namespace"`
	ServiceAccount struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"serviceaccount"`
	Pod *struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"pod,omitempty"`
	Node *struct {
		Name string `json:"name"`
	} `json:"node,omitempty"`
}

type tokenClaims struct {
	Kubernetes *kubernetesClaims `json:"kubernetes.io"`
}

// errUnknownKey means the token's key is not among the issuer's known keys.
var errUnknownKey = errors.New("unknown signing key")

// Verify returns the identity a token proves. The errors say what is wrong
// without repeating the token.
func (v *TokenVerifier) Verify(ctx context.Context, raw string) (*Identity, error) {
	tok, err := jwt.ParseSigned(raw, signatureAlgorithms)
	if err != nil {
		return nil, errors.New("it is not a signed JWT")
	}
	if len(tok.Headers) != 1 {
		return nil, errors.New("it is not a signed JWT with exactly one signature")
	}
	id, err := v.verifyLocally(ctx, tok)
	if errors.Is(err, errUnknownKey) && v.reviewer != nil {
		if !v.reviews.Allow(peerOf(ctx)) {
			return nil, fmt.Errorf("its signing key is not known, and this replica reviews at most %d such tokens a second (%d from one client address); retry", ReviewsPerSecond, ReviewsPerPeerPerSecond)
		}
		return v.reviewer.Review(ctx, raw, v.audience)
	}
	return id, err
}

// peerOf is the client IP address of the stream of ctx, "" when unknown.
func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return peerrate.Of(p.Addr)
	}
	return ""
}

func (v *TokenVerifier) verifyLocally(ctx context.Context, tok *jwt.JSONWebToken) (*Identity, error) {
	kid := tok.Headers[0].KeyID
	issuer, key, err := v.key(ctx, kid)
	if err != nil {
		return nil, err
	}
	var std jwt.Claims
	var k8s tokenClaims
	if err := tok.Claims(key.Key, &std, &k8s); err != nil {
		return nil, errors.New("its signature does not verify")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: issuer, AnyAudience: jwt.Audience{v.audience}, Time: v.now()}, time.Minute); err != nil {
		return nil, claimsError(err, issuer, v.audience)
	}
	if std.Expiry == nil {
		return nil, errors.New("it has no expiry (exp): mount a projected token, not a legacy Secret token")
	}
	issued := v.now()
	if std.IssuedAt != nil {
		issued = std.IssuedAt.Time()
	}
	maxLifetime := cmp.Or(v.MaxLifetime, DefaultMaxTokenLifetime)
	if life := std.Expiry.Time().Sub(issued); life > maxLifetime {
		return nil, fmt.Errorf("it is valid for %s, longer than this server accepts (%s, --xds-max-token-lifetime): mount a projected token with a shorter expirationSeconds", life.Round(time.Second), maxLifetime)
	}
	c := k8s.Kubernetes
	if c == nil || c.Namespace == "" || c.ServiceAccount.Name == "" {
		return nil, errors.New("it is not a ServiceAccount token (no kubernetes.io namespace and serviceaccount claims)")
	}
	if want := "system:serviceaccount:" + c.Namespace + ":" + c.ServiceAccount.Name; std.Subject != want {
		return nil, errors.New("its subject does not match its kubernetes.io claims")
	}
	id := &Identity{Method: MethodToken, Namespace: c.Namespace, ServiceAccount: c.ServiceAccount.Name,
		ServiceAccountUID: c.ServiceAccount.UID, Expiry: std.Expiry.Time()}
	if c.Pod != nil {
		id.PodName, id.PodUID = c.Pod.Name, c.Pod.UID
	}
	if c.Node != nil {
		id.NodeName = c.Node.Name
	}
	return id, nil
}

func claimsError(err error, issuer, audience string) error {
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return errors.New("it has expired: the kubelet refreshes a projected token; a proxy must read the file again on reconnect")
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return errors.New("it is not valid yet (nbf/iat in the future): check the node's clock")
	case errors.Is(err, jwt.ErrInvalidAudience):
		return fmt.Errorf("its audience is not %q: set audience: %s on the projected serviceAccountToken volume (--xds-token-audience)", audience, audience)
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return fmt.Errorf("its issuer is not this cluster's (%s)", issuer)
	}
	return errors.New("its claims are not valid")
}

// key returns the issuer and the key kid names. Keys older than
// KeyRefreshInterval are still used while a refresh runs in the
// background; a kid not in the cache starts a fetch (at most every
// minKeyRefresh) and waits for it, or for ctx. Either way the fetch runs on
// its own context, never under v.mu, and one at a time. A failed fetch
// keeps the cached keys.
func (v *TokenVerifier) key(ctx context.Context, kid string) (string, *jose.JSONWebKey, error) {
	v.mu.Lock()
	now := v.now()
	if found := v.lookup(kid); found != nil {
		if now.Sub(v.fetched) >= KeyRefreshInterval && now.Sub(v.attempted) >= minKeyRefresh {
			v.fetch()
		}
		issuer := v.issuer
		v.mu.Unlock()
		return issuer, found, nil
	}
	done := v.fetching
	if done == nil && now.Sub(v.attempted) >= minKeyRefresh {
		done = v.fetch()
	}
	v.mu.Unlock()
	if done == nil {
		return "", nil, errUnknownKey
	}
	select {
	case <-done:
	case <-ctx.Done():
		return "", nil, errors.New("its signing key is not cached yet and the issuer's keys are being fetched; retry")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if found := v.lookup(kid); found != nil {
		return v.issuer, found, nil
	}
	return "", nil, errUnknownKey
}

// fetch starts fetching the keys unless a fetch is under way, and returns
// the channel closed when it ends. v.mu is held.
func (v *TokenVerifier) fetch() chan struct{} {
	if v.fetching != nil {
		return v.fetching
	}
	done := make(chan struct{})
	v.fetching = done
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), v.fetchTimeout)
		issuer, set, err := v.keys.Fetch(ctx)
		cancel()
		v.mu.Lock()
		now := v.now()
		v.attempted = now
		if err == nil {
			v.issuer, v.set, v.fetched = issuer, set, now
		}
		v.fetching = nil
		v.mu.Unlock()
		close(done)
	}()
	return done
}

// lookup finds kid among the cached signing keys; a token without kid
// matches only when the issuer has a single key.
func (v *TokenVerifier) lookup(kid string) *jose.JSONWebKey {
	if kid == "" {
		if len(v.set.Keys) == 1 {
			return &v.set.Keys[0]
		}
		return nil
	}
	for i := range v.set.Keys {
		if k := &v.set.Keys[i]; k.KeyID == kid && k.Use != "enc" {
			return k
		}
	}
	return nil
}

// APIServerKeys fetches the service-account issuer and its keys through
// the API server (the service-account-issuer-discovery endpoints).
type APIServerKeys struct {
	Client rest.Interface
}

// NewAPIServerKeys reads discovery with cfg's credentials.
func NewAPIServerKeys(cfg *rest.Config) (*APIServerKeys, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &APIServerKeys{Client: cs.Discovery().RESTClient()}, nil
}

// Fetch implements Keys.
func (k *APIServerKeys) Fetch(ctx context.Context) (string, jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	body, err := k.Client.Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	if err != nil {
		return "", set, fmt.Errorf("service-account issuer discovery: %w", err)
	}
	var disc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(body, &disc); err != nil || disc.Issuer == "" {
		return "", set, errors.New("service-account issuer discovery: no issuer in /.well-known/openid-configuration")
	}
	body, err = k.Client.Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	if err != nil {
		return "", set, fmt.Errorf("service-account issuer keys: %w", err)
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return "", set, fmt.Errorf("service-account issuer keys: %w", err)
	}
	return disc.Issuer, set, nil
}

// TokenReviewer is a Reviewer asking the API server (TokenReview,
// authentication.k8s.io/v1).
type TokenReviewer struct {
	Client kubernetes.Interface
}

// Review implements Reviewer.
func (r *TokenReviewer) Review(ctx context.Context, token, audience string) (*Identity, error) {
	tr, err := r.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, errors.New("its signing key is not known and the API server could not review it; retry")
	}
	if !tr.Status.Authenticated {
		return nil, fmt.Errorf("the API server does not authenticate it for audience %q", audience)
	}
	rest, ok := strings.CutPrefix(tr.Status.User.Username, "system:serviceaccount:")
	ns, sa, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || sa == "" {
		return nil, errors.New("it authenticates a user that is not a ServiceAccount")
	}
	id := &Identity{Method: MethodToken, Namespace: ns, ServiceAccount: sa, ServiceAccountUID: tr.Status.User.UID}
	extra := tr.Status.User.Extra
	id.PodName = first(extra["authentication.kubernetes.io/pod-name"])
	id.PodUID = first(extra["authentication.kubernetes.io/pod-uid"])
	id.NodeName = first(extra["authentication.kubernetes.io/node-name"])
	return id, nil
}

func first(v authenticationv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
