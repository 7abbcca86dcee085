package controlplane

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	typedauthenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/scopeplane/scopeplane/xds/peerrate"
)

// The metrics port reviews a bearer token it has not seen authenticated
// within metricsTokenTTL with the API server (TokenReview), at most
// MetricsReviewsPerPeerPerSecond (burst MetricsReviewsPerPeerBurst) for one
// client address and MetricsReviewsPerSecond (burst MetricsReviewBurst) in
// all: anyone who reaches the port can send made-up tokens, and each would
// otherwise cost the API server a review. A scraper's token, once
// authenticated, is not reviewed again within the TTL and spends nothing.
const (
	MetricsReviewsPerSecond        = 5
	MetricsReviewBurst             = 20
	MetricsReviewsPerPeerPerSecond = 1
	MetricsReviewsPerPeerBurst     = 5
	metricsTokenTTL                = time.Minute
	metricsKnownTokens             = 256
)

// metricsFilter authenticates (TokenReview) and authorizes
// (SubjectAccessReview, get on the request's non-resource path) every
// request to the metrics port: 401 for a missing or invalid token, 429 past
// the review pace, 403 without the permission, 503 when the API server
// cannot answer. Refusals are logged at debug level and without stack
// traces: a stranger's bad token is not an operator's error.
func metricsFilter(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	cs, err := kubernetes.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: cs.AuthorizationV1(),
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5},
	}.New()
	if err != nil {
		return nil, fmt.Errorf("the metrics authorizer: %w", err)
	}
	a := &metricsAuth{
		reviews: cs.AuthenticationV1().TokenReviews(), authz: authz, now: time.Now,
		pace:  peerrate.New(MetricsReviewsPerPeerPerSecond, MetricsReviewsPerPeerBurst, rate.NewLimiter(MetricsReviewsPerSecond, MetricsReviewBurst)),
		known: map[[sha256.Size]byte]knownToken{},
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.serve(log, next, w, r) }), nil
	}, nil
}

type metricsAuth struct {
	reviews typedauthenticationv1.TokenReviewInterface
	authz   authorizer.Authorizer
	pace    *peerrate.Limiter
	now     func() time.Time

	mu    sync.Mutex
	known map[[sha256.Size]byte]knownToken
}

type knownToken struct {
	user    user.Info
	expires time.Time
}

func (a *metricsAuth) serve(log logr.Logger, next http.Handler, w http.ResponseWriter, r *http.Request) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		http.Error(w, "Unauthorized: send a bearer token (Authorization: Bearer <token>)", http.StatusUnauthorized)
		return
	}
	u, code, why := a.authenticate(r, token)
	if u == nil {
		log.V(1).Info("metrics request refused", "code", code, "reason", why, "remote", r.RemoteAddr)
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, why, code)
		return
	}
	decision, reason, err := a.authz.Authorize(r.Context(), authorizer.AttributesRecord{User: u, Verb: strings.ToLower(r.Method), Path: r.URL.Path})
	if err != nil {
		log.V(1).Info("metrics request: the API server could not authorize it", "user", u.GetName(), "err", err.Error())
		http.Error(w, "the API server could not authorize the request; retry", http.StatusServiceUnavailable)
		return
	}
	if decision != authorizer.DecisionAllow {
		log.V(1).Info("metrics request forbidden", "user", u.GetName(), "reason", reason)
		http.Error(w, fmt.Sprintf("Forbidden: %s may not get %s", u.GetName(), r.URL.Path), http.StatusForbidden)
		return
	}
	next.ServeHTTP(w, r)
}

// authenticate returns the user token proves, or the status and message of
// the refusal.
func (a *metricsAuth) authenticate(r *http.Request, token string) (user.Info, int, string) {
	key := sha256.Sum256([]byte(token))
	now := a.now()
	a.mu.Lock()
	k, ok := a.known[key]
	a.mu.Unlock()
	if ok && now.Before(k.expires) {
		return k.user, 0, ""
	}
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = r.RemoteAddr
	}
	if !a.pace.Allow(peer) {
		return nil, http.StatusTooManyRequests, fmt.Sprintf("Too many tokens to review: this port reviews at most %d a second (%d from one address); retry", MetricsReviewsPerSecond, MetricsReviewsPerPeerPerSecond)
	}
	tr, err := a.reviews.Create(r.Context(), &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, http.StatusServiceUnavailable, "the API server could not review the token; retry"
	}
	if !tr.Status.Authenticated {
		return nil, http.StatusUnauthorized, "Unauthorized: the API server does not authenticate the token"
	}
	extra := map[string][]string{}
	for k, v := range tr.Status.User.Extra {
		extra[k] = v
	}
	u := &user.DefaultInfo{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups, Extra: extra}
	a.mu.Lock()
	if len(a.known) >= metricsKnownTokens {
		for h, k := range a.known {
			if !now.Before(k.expires) || len(a.known) >= metricsKnownTokens {
				delete(a.known, h)
			}
		}
	}
	a.known[key] = knownToken{user: u, expires: now.Add(metricsTokenTTL)}
	a.mu.Unlock()
	return u, 0, ""
}
