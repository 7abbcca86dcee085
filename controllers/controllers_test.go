package controllers_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

var (
	env         *localapi.Env
	cat         *catalog.Catalog
	initialSync *controllers.InitialSync
	seen        = &updateLog{count: map[string]int{}}
)

// updateLog consumes the catalog as the snapshot layer does and counts, per
// scope, the updates it received.
type updateLog struct {
	mu    sync.Mutex
	count map[string]int
}

func (l *updateLog) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.count))
	for k, v := range l.count {
		out[k] = v
	}
	return out
}

func TestMain(m *testing.M) {
	var err error
	if env, err = localapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cat = catalog.New()
	if initialSync, err = controllers.Setup(ctx, mgr, cat, catalog.CrossNamespaceGrant, shard.Shards{}, servicecache.New(servicecache.ForManager(mgr, cache.Options{}), ctrl.Log)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-cat.Changed():
				for _, u := range cat.Take() {
					seen.mu.Lock()
					seen.count[u.Key.String()]++
					seen.mu.Unlock()
				}
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
	}
	_ = env.Stop()
	os.Exit(code)
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func service(ns, name string, labels map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.ServiceSpec{Ports: ports},
	}
}

func port(name string, n int32, target intstr.IntOrString, appProtocol string) corev1.ServicePort {
	p := corev1.ServicePort{Name: name, Port: n, TargetPort: target, Protocol: corev1.ProtocolTCP}
	if appProtocol != "" {
		p.AppProtocol = &appProtocol
	}
	return p
}

func slice(ns, name, svc, portName string, portNum int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &portNum, Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

func endpoint(addr, zone string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Zone:       &zone,
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
	}
}

func proxyScope(ns, name string, listener xdsv1alpha1.ListenerSpec, sels ...xdsv1alpha1.ServiceSelection) *xdsv1alpha1.ProxyScope {
	return &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       xdsv1alpha1.ProxyScopeSpec{Services: sels, Listener: listener},
	}
}

// grantAll is a ReferenceGrant of all Services of ns to the ProxyScopes of
// the from namespaces.
func grantAll(ns string, from ...string) *gatewayv1beta1.ReferenceGrant {
	g := &gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proxyscopes"},
		Spec:       gatewayv1beta1.ReferenceGrantSpec{To: []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: "Service"}}},
	}
	for _, f := range from {
		g.Spec.From = append(g.Spec.From, gatewayv1beta1.ReferenceGrantFrom{Group: gatewayv1beta1.Group(xdsv1alpha1.GroupVersion.Group), Kind: "ProxyScope", Namespace: gatewayv1beta1.Namespace(f)})
	}
	return g
}

var (
	envoyListener     = xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)}
	proxylessListener = xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC}
)

func clusters(scope string) []string {
	ns, name, _ := cutKey(scope)
	res, ok := cat.Resources(model.Key{Namespace: ns, Name: name})
	if !ok {
		return nil
	}
	out := []string{}
	for n := range res[xdstype.Cluster] {
		// ProxylessGRPC names end in the Service's UID ("@<uid>"), which
		// the translator's tests cover; these compare the Services.
		n, _, _ = strings.Cut(n, "@")
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func cutKey(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}

func expectClusters(t *testing.T, scope string, want ...string) {
	t.Helper()
	testkit.Eventually(t, "clusters of "+scope, func() (bool, string) {
		got := clusters(scope)
		return slices.Equal(got, want), fmt.Sprintf("got %v, want %v", got, want)
	})
}

// quiet waits until no update arrived for a while, and returns the counts.
func quiet(t *testing.T) map[string]int {
	t.Helper()
	prev := seen.snapshot()
	for {
		time.Sleep(300 * time.Millisecond)
		cur := seen.snapshot()
		if fmt.Sprint(cur) == fmt.Sprint(prev) {
			return cur
		}
		prev = cur
	}
}

// touched returns the scopes whose update count grew between two counts.
func touched(before, after map[string]int) []string {
	var out []string
	for k, v := range after {
		if v != before[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func TestScopesConvergeAndOnlyAffectedScopesChange(t *testing.T) {
	ctx := context.Background()
	create(t,
		namespace("shop", nil), namespace("team-a", map[string]string{"shared": "true"}), namespace("team-b", nil), namespace("mesh", nil),
		service("shop", "cart", map[string]string{"app": "cart"}, port("http", 80, intstr.FromString("web"), "")),
		service("shop", "checkout", nil, port("grpc", 9090, intstr.FromInt32(9090), "grpc")),
		service("team-a", "api", map[string]string{"tier": "shared"}, port("http", 80, intstr.FromInt32(8080), "")),
		service("team-b", "api", map[string]string{"tier": "shared"}, port("http", 80, intstr.FromInt32(8080), "")),
		// Two slices of one Service resolve the named target port "web" differently.
		slice("shop", "cart-a", "cart", "http", 8080, endpoint("10.0.0.1", "z1", true, true, false), endpoint("10.0.0.2", "z1", false, true, true)),
		slice("shop", "cart-b", "cart", "http", 8081, endpoint("10.0.1.1", "z2", true, true, false), endpoint("10.0.1.2", "z2", false, false, false)),
		slice("shop", "checkout-a", "checkout", "grpc", 9090, endpoint("10.0.2.1", "z1", true, true, false)),
		slice("team-a", "api-a", "api", "http", 8080, endpoint("10.1.0.1", "z1", true, true, false)),
		slice("team-b", "api-a", "api", "http", 8080, endpoint("10.2.0.1", "z1", true, true, false)),
		// team-a and team-b consent to the scopes of mesh and shop.
		grantAll("team-a", "mesh", "shop"), grantAll("team-b", "mesh", "shop"),
		proxyScope("shop", "gw", envoyListener, xdsv1alpha1.ServiceSelection{Selector: &metav1.LabelSelector{}}),
		proxyScope("shop", "grpc", proxylessListener, xdsv1alpha1.ServiceSelection{Names: []xdsv1alpha1.DNSLabel{"checkout"}}),
		proxyScope("mesh", "shared", proxylessListener, xdsv1alpha1.ServiceSelection{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"shared": "true"}},
			Selector:          &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "shared"}},
		}),
	)

	t.Run("initial sync", func(t *testing.T) {
		expectClusters(t, "shop/gw", "shop/cart:80", "shop/checkout:9090")
		expectClusters(t, "shop/grpc", "shop/checkout:9090")
		expectClusters(t, "mesh/shared", "team-a/api:80")
		select {
		case <-initialSync.Synced():
		case <-time.After(20 * time.Second):
			t.Fatal("the initial sync never completed, so /readyz would never pass")
		}
		if err := initialSync.Check(nil); err != nil {
			t.Errorf("readiness after the initial sync: %v", err)
		}
		res, _ := cat.Resources(model.Key{Namespace: "shop", Name: "gw"})
		cla := res[xdstype.Endpoint]["shop/cart:80"].(*endpointv3.ClusterLoadAssignment)
		var got []string
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				got = append(got, fmt.Sprintf("%s/%s:%d=%s@%d", l.GetLocality().GetZone(), sa.GetAddress(), sa.GetPortValue(), e.GetHealthStatus(), l.GetPriority()))
			}
		}
		sort.Strings(got)
		want := []string{"z1/10.0.0.1:8080=HEALTHY@0", "z1/10.0.0.2:8080=HEALTHY@1", "z2/10.0.1.1:8081=HEALTHY@0"}
		if !slices.Equal(got, want) {
			t.Errorf("endpoints of shop/cart merged across slices:\n got %v\nwant %v", got, want)
		}
	})

	t.Run("endpoint change", func(t *testing.T) {
		before := quiet(t)
		s := &discoveryv1.EndpointSlice{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "checkout-a"}, s); err != nil {
			t.Fatal(err)
		}
		s.Endpoints = append(s.Endpoints, endpoint("10.0.2.2", "z1", true, true, false))
		if err := env.Client.Update(ctx, s); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, "the new checkout endpoint", func() (bool, string) {
			res, _ := cat.Resources(model.Key{Namespace: "shop", Name: "grpc"})
			n := 0
			for name, m := range res[xdstype.Endpoint] {
				if strings.HasPrefix(name, "shop/checkout:9090@") { // a gRPC-mode name ends in the UID
					for _, l := range m.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
						n += len(l.GetLbEndpoints())
					}
				}
			}
			return n == 2, fmt.Sprintf("%d endpoints", n)
		})
		if got := touched(before, quiet(t)); !slices.Equal(got, []string{"shop/grpc", "shop/gw"}) {
			t.Errorf("an endpoint change of shop/checkout touched %v, want the two scopes selecting it", got)
		}
	})

	t.Run("delete a service", func(t *testing.T) {
		before := quiet(t)
		if err := env.Client.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}}); err != nil {
			t.Fatal(err)
		}
		expectClusters(t, "shop/gw", "shop/checkout:9090")
		if got := touched(before, quiet(t)); !slices.Equal(got, []string{"shop/gw"}) {
			t.Errorf("deleting shop/cart touched %v, want [shop/gw]", got)
		}
	})

	t.Run("relabel a namespace", func(t *testing.T) {
		before := quiet(t)
		ns := &corev1.Namespace{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "team-b"}, ns); err != nil {
			t.Fatal(err)
		}
		ns.Labels = map[string]string{"shared": "true"}
		if err := env.Client.Update(ctx, ns); err != nil {
			t.Fatal(err)
		}
		expectClusters(t, "mesh/shared", "team-a/api:80", "team-b/api:80")
		if got := touched(before, quiet(t)); !slices.Equal(got, []string{"mesh/shared"}) {
			t.Errorf("relabelling team-b touched %v, want [mesh/shared]", got)
		}
	})

	t.Run("edit a selection", func(t *testing.T) {
		before := quiet(t)
		ps := &xdsv1alpha1.ProxyScope{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "grpc"}, ps); err != nil {
			t.Fatal(err)
		}
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Namespace: "team-a", Selector: &metav1.LabelSelector{}}}
		if err := env.Client.Update(ctx, ps); err != nil {
			t.Fatal(err)
		}
		expectClusters(t, "shop/grpc", "team-a/api:80")
		if got := touched(before, quiet(t)); !slices.Equal(got, []string{"shop/grpc"}) {
			t.Errorf("editing shop/grpc touched %v, want [shop/grpc]", got)
		}
	})

	t.Run("delete a scope", func(t *testing.T) {
		if err := env.Client.Delete(ctx, &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "mesh", Name: "shared"}}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, "mesh/shared gone", func() (bool, string) {
			_, ok := cat.Resources(model.Key{Namespace: "mesh", Name: "shared"})
			return !ok, "still there"
		})
	})
}
