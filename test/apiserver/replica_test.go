// Package apiserver checks what the control plane does with the API server:
// that it rides out an outage of it (every replica serving, the leader-only
// writing pausing and resuming), that it writes no bootstrap ConfigMap when
// told not to, and that a status patch the API server refuses is retried.
package apiserver

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// replica is one control plane, wired as main wires it, in this process.
type replica struct {
	name    string
	cp      *controlplane.ControlPlane
	addr    string
	cancel  context.CancelFunc
	stopped chan struct{} // closed when the manager's Start returned
	err     error         // what it returned
}

// startReplica runs a control plane against env with opts, serving xDS on
// a loopback port of its own, until the test ends.
func startReplica(t *testing.T, env *localapi.Env, name string, opts controlplane.Options) *replica {
	t.Helper()
	return startReplicaAs(t, env.Config, name, opts)
}

// startReplicaAs is startReplica with the API server credentials of cfg
// (for example an impersonated ServiceAccount with the chart's RBAC).
func startReplicaAs(t *testing.T, cfg *rest.Config, name string, opts controlplane.Options) *replica {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(opts.BootstrapNamespaces...),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Replicas share this test process, and so controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.XDSListener, opts.XDSServerAddress = lis, lis.Addr().String()
	if opts.Server.Authenticator == nil {
		opts.Server.Authenticator = &auth.Authenticator{AllowAnonymous: true}
	}
	opts.CoalesceWindow, opts.StatusWindow = 5*time.Millisecond, 50*time.Millisecond
	opts.TLS.Insecure = true // these tests are about replicas, not TLS
	opts.Replica.Name = name
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := controlplane.Setup(ctx, mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cp: cp, addr: lis.Addr().String(), cancel: cancel, stopped: make(chan struct{})}
	go func() {
		r.err = mgr.Start(ctx)
		close(r.stopped)
	}()
	t.Cleanup(func() {
		r.cancel()
		<-r.stopped
		if r.err != nil {
			t.Errorf("replica %s: the manager ended with %v", name, r.err)
		}
	})
	// Until then it refuses streams (Unavailable), and these proxies do
	// not reconnect.
	testkit.Eventually(t, "replica "+name+" ready", func() (bool, string) {
		err := cp.Ready(nil)
		return err == nil, fmt.Sprint(err)
	})
	return r
}

// running reports whether the replica's manager is still running.
func (r *replica) running() bool {
	select {
	case <-r.stopped:
		return false
	default:
		return true
	}
}

// proxy is an ADS client on one stream: it does not reconnect, so a reset
// stream shows as ended.
type proxy struct {
	name  string
	c     *adsclient.Client
	ended chan struct{} // closed when its one stream ended
	err   error
}

// connect opens one ADS stream of protocol p to addr for a proxy of scope,
// subscribed to every type, for the rest of the test.
func connect(t *testing.T, addr string, p adsclient.Protocol, id, scope string) *proxy {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{name: id, c: adsclient.New(testkit.WildcardClient(p, testkit.Node(id, scope))), ended: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		px.err = px.c.Run(ctx, conn)
		close(px.ended)
	}()
	t.Cleanup(func() {
		cancel()
		<-px.ended
		_ = conn.Close()
	})
	return px
}

// open reports whether the proxy's stream is still the one it opened.
func (px *proxy) open() bool {
	select {
	case <-px.ended:
		return false
	default:
		return true
	}
}

// clusters is the set of cluster names the proxy holds.
func (px *proxy) clusters() map[string]bool {
	out := map[string]bool{}
	for n := range px.c.State(xdstype.Cluster.URL()) {
		out[n] = true
	}
	return out
}

// scope is a ProxyScope of ns selecting the Services labelled app=<app>, for proxyless gRPC.
func scope(ns, name, app string, p xdsv1alpha1.Protocol) *xdsv1alpha1.ProxyScope {
	return &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: xdsv1alpha1.ProxyScopeSpec{
		Protocol: p,
		Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}},
		Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
	}}
}

func getScope(t *testing.T, env *localapi.Env, ns, name string) (*xdsv1alpha1.ProxyScope, error) {
	t.Helper()
	ps := &xdsv1alpha1.ProxyScope{}
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, ps)
	return ps, err
}

func create(t *testing.T, env *localapi.Env, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func describe(px *proxy) string {
	return fmt.Sprintf("%s: open %v, clusters %v, err %v", px.name, px.open(), px.clusters(), px.c.Err())
}
