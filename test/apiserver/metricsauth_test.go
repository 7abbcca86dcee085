package apiserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/funcr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
)

// countingTransport counts the TokenReviews sent through it.
type countingTransport struct {
	rt      http.RoundTripper
	reviews *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tokenreviews") {
		c.reviews.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// TestMetricsPortRefusesBadTokensCheaply sends the secure metrics port 300
// requests with made-up bearer tokens from one address, against the real
// API server: they are answered 401 while the address's review budget
// lasts and 429 after, the API server is asked for only a handful of
// TokenReviews, nothing is logged at error level, and a scraper whose
// ServiceAccount may get /metrics is then served from another address.
// (Before, each made-up token cost a review, was answered 500 and logged
// an error with its stack trace.)
func TestMetricsPortRefusesBadTokensCheaply(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "prometheus"}}
	reader := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "prometheus"}},
	}
	for _, o := range []client.Object{sa, reader, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	if err := env.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}

	var reviews atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, reviews: &reviews} })
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	filter, err := controlplane.MetricsOptions("127.0.0.1:0", true).FilterProvider(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var errorLines []string
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"`) {
			logMu.Lock()
			errorLines = append(errorLines, args)
			logMu.Unlock()
		}
	}, funcr.Options{Verbosity: 0})
	h, err := filter(log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics") }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	from := func(ip string) *http.Client {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	get := func(c *http.Client, token string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	stranger := from("127.0.0.2")
	codes := map[int]int{}
	for i := range 300 {
		codes[get(stranger, fmt.Sprintf("made-up-token-%d", i))]++
	}
	t.Logf("300 made-up tokens: %v, %d TokenReviews", codes, reviews.Load())
	if codes[http.StatusUnauthorized] == 0 || codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != 300 {
		t.Errorf("made-up tokens were answered %v, want 401 and then 429 only", codes)
	}
	if n := reviews.Load(); n > controlplane.MetricsReviewsPerPeerBurst+5 {
		t.Errorf("300 made-up tokens from one address cost %d TokenReviews, want about the address's burst of %d", n, controlplane.MetricsReviewsPerPeerBurst)
	}
	logMu.Lock()
	if len(errorLines) > 0 {
		t.Errorf("%d error log lines for bad tokens, the first: %.300s", len(errorLines), errorLines[0])
	}
	logMu.Unlock()
	if code := get(from("127.0.0.1"), tr.Status.Token); code != http.StatusOK {
		t.Errorf("the scraper's token was answered %d after the flood, want 200", code)
	}
}
