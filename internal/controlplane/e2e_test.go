package controlplane_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/server"
)

var (
	env       *localapi.Env
	cp        *controlplane.ControlPlane
	xdsAddr   string
	adminAddr string
)

// costBucket is the width of status.cost's buckets here: short, so that a
// test sees a bucket complete.
const costBucket = 2 * time.Second

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if env, err = localapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Cache:                  controlplane.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	xdsAddr = lis.Addr().String()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	adminAddr = admin.Addr().String()
	if cp, err = controlplane.Setup(ctx, mgr, controlplane.Options{
		XDSListener: lis, XDSServerAddress: lis.Addr().String(), CoalesceWindow: 5 * time.Millisecond, StatusWindow: 50 * time.Millisecond,
		AdminListener: admin, CostBucket: costBucket, TLS: controlplane.TLS{Insecure: true},
		Server: server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}}, RouteControllerName: routeController,
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
	}
	return code
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// loopbackSlice lists one endpoint for a Service port named "grpc": a
// backend on 127.0.0.1:port, under whoami.SliceAddress since the API server
// refuses loopback addresses in EndpointSlices.
func loopbackSlice(ns, name, svc string, port int) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{whoami.SliceAddress}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}

// mutate reads obj, applies fn and updates it, again on conflicts: the
// status writer updates ProxyScopes concurrently.
func mutate[T client.Object](t *testing.T, obj T, fn func(T)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		fn(obj)
		return env.Client.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatalf("updating %T %s: %v", obj, obj.GetName(), err)
	}
}

// bootstrapOf waits for the scope's bootstrap ConfigMap and returns one of its keys.
func bootstrapOf(t *testing.T, ns, scope, key string) []byte {
	t.Helper()
	var data string
	testkit.Eventually(t, "the bootstrap ConfigMap of "+scope, func() (bool, string) {
		cm := &corev1.ConfigMap{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(scope)}, cm)
		data = cm.Data[key]
		return data != "", fmt.Sprint(err)
	})
	return []byte(data)
}

func call(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return whoami.Call(ctx, conn)
}

// TestGRPCClientRoutesThroughProxylessScope drives grpc-go's own xDS client
// through a ProxylessGRPC scope to real backends on 127.0.0.1.
func TestGRPCClientRoutesThroughProxylessScope(t *testing.T) {
	a, err := whoami.Start("backend-a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	b, err := whoami.Start("backend-b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()

	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "whoami"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051, AppProtocol: ptr.To("grpc")}}},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "other"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
		},
		loopbackSlice("e2e", "whoami-1", "whoami", a.Port),
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "grpc"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
			},
		},
	)

	// The client joins the scope with the gRPC bootstrap the operator wrote.
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrapOf(t, "e2e", "grpc", bootstrap.GRPCKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///whoami.e2e.svc.cluster.local:50051",
		grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()

	testkit.Eventually(t, "an RPC routed to backend-a", func() (bool, string) {
		got, err := call(conn)
		return got == "backend-a", fmt.Sprintf("%q, %v", got, err)
	})

	// Move the endpoint to backend-b: traffic follows.
	mutate(t, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "whoami-1"}}, func(s *discoveryv1.EndpointSlice) {
		s.Ports[0].Port = ptr.To(int32(b.Port))
	})
	testkit.Eventually(t, "RPCs moved to backend-b", func() (bool, string) {
		got, err := call(conn)
		return got == "backend-b", fmt.Sprintf("%q, %v", got, err)
	})

	// Take the Service out of the scope: the client loses its listener and
	// the RPC fails with an xDS error.
	mutate(t, &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "grpc"}}, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"other"}}}
	})
	var last error
	testkit.Eventually(t, "the RPC failing with an xDS error", func() (bool, string) {
		got, err := call(conn)
		last = err
		return err != nil && strings.Contains(err.Error(), "has been removed"), fmt.Sprintf("%q, %v", got, err)
	})
	t.Logf("after the Service left the scope: %v", last)
}
