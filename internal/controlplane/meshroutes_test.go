package controlplane_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/plugin"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
)

const meshNS = "mesh"

// meshService is a Service of one gRPC port, 50051, served by backend.
func meshService(t *testing.T, name string, backend *whoami.Backend) {
	t.Helper()
	create(t,
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051, AppProtocol: ptr.To("grpc")}}},
		},
		loopbackSlice(meshNS, name+"-1", name, backend.Port),
	)
}

// serviceParent is a parentRef to a Service of the mesh namespace (GAMMA).
func serviceParent(name string) gatewayv1.ParentReference {
	return gatewayv1.ParentReference{Group: ptr.To(gatewayv1.Group("")), Kind: ptr.To(gatewayv1.Kind("Service")), Name: gatewayv1.ObjectName(name)}
}

func httpBackend(name string, weight int32) gatewayv1.HTTPBackendRef {
	return gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Port: ptr.To(gatewayv1.PortNumber(50051))},
		Weight:                 ptr.To(weight),
	}}
}

// callMD is call with request metadata.
func callMD(conn *grpc.ClientConn, md ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	return whoami.Call(ctx, conn)
}

// split makes n calls and counts them by the backend that answered; a
// failed call counts under its status code.
func split(conn *grpc.ClientConn, n int, md ...string) map[string]int {
	out := map[string]int{}
	for range n {
		got, err := callMD(conn, md...)
		if err != nil {
			got = status.Code(err).String()
		}
		out[got]++
	}
	return out
}

// traffic calls without pause until stopped, as a client in production
// does while its routes change, and counts the calls that failed.
type traffic struct {
	stop          chan struct{}
	done          sync.WaitGroup
	calls, failed atomic.Int64
	mu            sync.Mutex
	errs          []string
}

func startTraffic(conn *grpc.ClientConn) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	tr.done.Add(1)
	go func() {
		defer tr.done.Done()
		for {
			select {
			case <-tr.stop:
				return
			default:
			}
			tr.calls.Add(1)
			if _, err := callMD(conn); err != nil {
				tr.failed.Add(1)
				tr.mu.Lock()
				if len(tr.errs) < 5 {
					tr.errs = append(tr.errs, err.Error())
				}
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

// end stops the calls and fails the test if any failed.
func (tr *traffic) end(t *testing.T, what string) {
	t.Helper()
	close(tr.stop)
	tr.done.Wait()
	t.Logf("%s: %d calls, %d failed", what, tr.calls.Load(), tr.failed.Load())
	if n := tr.failed.Load(); n > 0 {
		t.Errorf("%s: %d of %d calls failed: %v", what, n, tr.calls.Load(), tr.errs)
	}
}

// TestMeshRoutesSteerAGRPCClient drives grpc-go's own xDS client through
// a ProxylessGRPC scope that selects one Service, "reviews", whose traffic
// HTTPRoutes and a GRPCRoute shape: a canary rolled out step by step with
// no failed call, a header match, a method match, a timeout, a retry, and
// the route deleted, all against real backends on 127.0.0.1. The scope
// selects only "reviews": the canary's backends reach it through the
// routes.
func TestMeshRoutesSteerAGRPCClient(t *testing.T) {
	backends := map[string]*whoami.Backend{}
	for _, name := range []string{"reviews", "reviews-v1", "reviews-v2"} {
		b, err := whoami.Start(name)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Stop()
		backends[name] = b
	}
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meshNS}})
	for name, b := range backends {
		meshService(t, name, b)
	}
	create(t, &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: "clients"},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"reviews"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		},
	})
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrapOf(t, meshNS, "clients", bootstrap.GRPCKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///reviews.mesh.svc.cluster.local:50051",
		grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	testkit.Eventually(t, "calls answered by the Service's own endpoints", func() (bool, string) {
		got, err := call(conn)
		return got == "reviews", fmt.Sprintf("%q, %v", got, err)
	})

	// A canary: 90/10 between two Services the scope does not select.
	route := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: "canary"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("reviews")}},
			Rules:           []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v1", 90), httpBackend("reviews-v2", 10)}}},
		},
	}
	create(t, route)
	testkit.Eventually(t, "the canary's split in effect", func() (bool, string) {
		got := split(conn, 50)
		return got["reviews"] == 0 && got["reviews-v2"] > 0, fmt.Sprint(got)
	})
	scopeRoutes(t, "one route and two backends on the scope's status", func(r *xdsv1alpha1.RoutesStatus) bool {
		return r != nil && r.Attached == 1 && r.Backends == 2
	})
	const n = 2000
	got := split(conn, n)
	share := float64(got["reviews-v2"]) / n
	t.Logf("90/10 over %d calls: %v (reviews-v2 %.1f%%)", n, got, 100*share)
	if got["reviews-v1"]+got["reviews-v2"] != n || share < 0.07 || share > 0.13 {
		t.Errorf("90/10 split over %d calls: %v, want reviews-v2 within 10%% ± 3 points and no failure", n, got)
	}

	// The rollout, one step at a time, under continuous calls.
	setWeights := func(v1, v2 int32) {
		mutate(t, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
			r.Spec.Rules = []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v1", v1), httpBackend("reviews-v2", v2)}}}
		})
	}
	tr := startTraffic(conn)
	setWeights(50, 50)
	testkit.Eventually(t, "the 50/50 step in effect", func() (bool, string) {
		got := split(conn, 200)
		return got["reviews-v2"] > 70, fmt.Sprint(got)
	})
	setWeights(0, 100)
	testkit.Eventually(t, "the 0/100 step in effect", func() (bool, string) {
		got := split(conn, 100)
		return got["reviews-v2"] == 100, fmt.Sprint(got)
	})
	tr.end(t, "canary rollout 90/10 → 50/50 → 0/100")

	// A header match: calls that say x-canary: yes go to v2, the rest to v1.
	mutate(t, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{
			{
				Matches:     []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{Name: "X-Canary", Value: "yes"}}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v2", 1)},
			},
			{BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v1", 1)}},
		}
	})
	testkit.Eventually(t, "the header match in effect", func() (bool, string) {
		with, without := split(conn, 20, "x-canary", "yes"), split(conn, 20)
		return with["reviews-v2"] == 20 && without["reviews-v1"] == 20, fmt.Sprint(with, without)
	})
	with, without := split(conn, 200, "x-canary", "yes"), split(conn, 200)
	t.Logf("header match: with x-canary: yes %v, without %v", with, without)
	if with["reviews-v2"] != 200 || without["reviews-v1"] != 200 {
		t.Errorf("header match: with the header %v, want reviews-v2 only; without %v, want reviews-v1 only", with, without)
	}

	// kubectl scopeplane explain names the route and rule each request
	// goes by, in order, and the client holds what the scope serves.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := plugin.Main(context.Background(), []string{"explain", "clients-grpc", meshNS + "/reviews", "--address", adminAddr, "--kubeconfig", kubeconfig}, &out, &errOut); code != 0 {
		t.Fatalf("kubectl scopeplane explain: exit %d: %s", code, errOut.String())
	}
	t.Logf("kubectl scopeplane explain clients-grpc mesh/reviews:\n%s", out.String())
	for _, want := range []string{
		"Mesh routes of Service mesh/reviews for this scope (producer routes, of the Service's namespace):\n  HTTPRoute mesh/canary\n",
		"  1. HTTPRoute mesh/canary rule 0 match 0 (path prefix /, header x-canary=yes) → cluster mesh/reviews-v2:50051@",
		"  2. HTTPRoute mesh/canary rule 1 match 0 (path prefix /) → cluster mesh/reviews-v1:50051@",
		"the proxy asked for it and is in sync on this type",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain lacks %q", want)
		}
	}

	// A GRPCRoute on the same Service port prevails over the HTTPRoute,
	// and its method match sends Whoami/Get to v2.
	grpcRoute := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: "by-method"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{serviceParent("reviews")}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Service: ptr.To("scopeplane.whoami.Whoami"), Method: ptr.To("Get")}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{
					BackendObjectReference: gatewayv1.BackendObjectReference{Name: "reviews-v2", Port: ptr.To(gatewayv1.PortNumber(50051))},
				}}},
			}},
		},
	}
	create(t, grpcRoute)
	testkit.Eventually(t, "the GRPCRoute's method match in effect", func() (bool, string) {
		got := split(conn, 20)
		return got["reviews-v2"] == 20, fmt.Sprint(got)
	})
	if got := split(conn, 200); got["reviews-v2"] != 200 {
		t.Errorf("method match: %v, want reviews-v2 only", got)
	}
	if err := env.Client.Delete(context.Background(), grpcRoute); err != nil {
		t.Fatal(err)
	}

	// A timeout shorter than a slow backend's delay.
	backends["reviews-v2"].Behave(5*time.Second, 0)
	mutate(t, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{
			BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v2", 1)},
			Timeouts:    &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration("300ms"))},
		}}
	})
	var took time.Duration
	testkit.Eventually(t, "the route's timeout ending a slow call", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := whoami.Call(ctx, conn)
		took = time.Since(start)
		return status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil, fmt.Sprintf("after %v: %v", took, err)
	})
	t.Logf("a call to a backend that answers after 5 s, under a 300ms route timeout and a 10 s deadline of its own: DEADLINE_EXCEEDED after %v", took)

	// A retry policy against a backend failing every other call.
	backends["reviews-v2"].Behave(0, 2)
	flaky := split(conn, 200)
	mutate(t, &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}, func(r *gatewayv1.HTTPRoute) {
		r.Spec.Rules = []gatewayv1.HTTPRouteRule{{
			BackendRefs: []gatewayv1.HTTPBackendRef{httpBackend("reviews-v2", 1)},
			Retry:       &gatewayv1.HTTPRouteRetry{Codes: []gatewayv1.HTTPRouteRetryStatusCode{503}, Attempts: ptr.To(2)},
		}}
	})
	testkit.Eventually(t, "the retry policy in effect", func() (bool, string) {
		got := split(conn, 50)
		return got["reviews-v2"] == 50, fmt.Sprint(got)
	})
	retried := split(conn, 1000)
	t.Logf("a backend failing every other call: without a retry policy %v; with one (503, 2 attempts) %v", flaky, retried)
	if flaky["Unavailable"] < 50 {
		t.Errorf("without a retry policy %v: the backend should fail about half the calls", flaky)
	}
	if retried["reviews-v2"] < 990 {
		t.Errorf("with a retry policy %v, want ≥ 99%% answered", retried)
	}
	backends["reviews-v2"].Behave(0, 0)

	// The route deleted: calls go back to the Service's own endpoints,
	// and none fails on the way.
	tr = startTraffic(conn)
	if err := env.Client.Delete(context.Background(), &gatewayv1.HTTPRoute{ObjectMeta: route.ObjectMeta}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "calls back on the Service's own endpoints", func() (bool, string) {
		got := split(conn, 50)
		return got["reviews"] == 50, fmt.Sprint(got)
	})
	tr.end(t, "route deleted")

	scopeRoutes(t, "no routes on the scope's status", func(r *xdsv1alpha1.RoutesStatus) bool { return r == nil })
}

// scopeRoutes waits for the status.routes of the mesh scope to satisfy ok.
func scopeRoutes(t *testing.T, what string, ok func(*xdsv1alpha1.RoutesStatus) bool) {
	t.Helper()
	testkit.Eventually(t, what, func() (bool, string) {
		ps := &xdsv1alpha1.ProxyScope{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: meshNS, Name: "clients"}, ps)
		return err == nil && ok(ps.Status.Routes), fmt.Sprintf("%+v, %v", ps.Status.Routes, err)
	})
}
