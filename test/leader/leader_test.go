// Package leader checks that with several replicas every one serves xDS
// while only the elected leader writes ProxyScope status, counting every
// replica's proxies, and that another replica takes over when the leader
// goes away; and, with three replicas and SotW and delta proxies spread
// over them, that failovers, crashes and a storm of restarts under endpoint
// churn leave every proxy holding exactly what the API objects say.
package leader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Lease timings of the test replicas: short, so that a crashed leader's
// Lease expires in seconds, and valid for client-go (LeaseDuration >
// RenewDeadline > 1.2 × RetryPeriod).
const (
	leaseDuration = 2 * time.Second
	renewDeadline = 1500 * time.Millisecond
	retryPeriod   = 300 * time.Millisecond
)

// replica is one control plane replica, as a pod runs it: its own manager,
// xDS port and API connections, in this test process.
type replica struct {
	name    string
	cp      *controlplane.ControlPlane
	addr    string
	cancel  context.CancelFunc
	stopped chan struct{}
	// conn is the proxies' connection to the replica (as a Service's
	// virtual IP routed to this pod would be).
	conn *grpc.ClientConn
	// xds holds the connections its xDS port accepted, api those it made
	// to the API server, so that a crash can break them all.
	xds, api *connSet
	// clusterWideReads counts its lists and watches of Services or
	// EndpointSlices across every namespace.
	clusterWideReads atomic.Int64
}

// startReplica starts replica name, campaigning for the Lease lease in
// namespace default.
func startReplica(t *testing.T, env *localapi.Env, name, lease string) *replica {
	t.Helper()
	return startShardReplica(t, env, name, lease, shard.Shards{})
}

// startShardReplica starts replica name of shards' shard, as
// startReplica does; its shard campaigns for a Lease named after lease and
// the shard. Each of with changes its options.
func startShardReplica(t *testing.T, env *localapi.Env, name, lease string, shards shard.Shards, with ...func(*controlplane.Options)) *replica {
	t.Helper()
	r := &replica{name: name, stopped: make(chan struct{}), xds: &connSet{}, api: &connSet{}}
	// The replica reaches the API server through connections it can lose
	// all at once, as a crashed pod does.
	cfg := rest.CopyConfig(env.Config)
	cfg.UserAgent = userAgent(name)
	var dialer net.Dialer
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			if p := req.URL.Path; strings.HasSuffix(p, "/api/v1/services") || strings.HasSuffix(p, "/discovery.k8s.io/v1/endpointslices") {
				r.clusterWideReads.Add(1)
			}
			return rt.RoundTrip(req)
		})
	}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return r.api.add(c)
	}
	// The manager as main builds it, and leader election as main asks
	// controlplane.Setup for it, with shorter timings.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// The replicas share this test process, and so controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	opts := controlplane.Options{
		XDSListener: trackingListener{Listener: lis, conns: r.xds}, XDSServerAddress: lis.Addr().String(),
		StatusWindow: 50 * time.Millisecond, TLS: controlplane.TLS{Insecure: true},
		Server: server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}},
		LeaderElection: controlplane.LeaderElection{
			Enabled: true, ID: lease, Namespace: "default",
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		},
		Replica: replicafeedback.Replica{Name: name},
		Shards:  shards,
	}
	for _, f := range with {
		f(&opts)
	}
	cp, err := controlplane.Setup(ctx, mgr, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r.cp, r.addr, r.cancel, r.conn = cp, lis.Addr().String(), cancel, conn
	go func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
		close(r.stopped)
	}()
	t.Cleanup(r.stop)
	return r
}

// roundTripper is a function as an http.RoundTripper.
type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// userAgent is what replica name's writes are recorded under.
func userAgent(name string) string { return "scopeplane-replica-" + name }

// stop shuts the replica down as a pod's termination does: its streams are
// ended with Unavailable, its feedback ConfigMap is deleted and the Lease
// is given up.
func (r *replica) stop() {
	r.cancel()
	<-r.stopped
	_ = r.conn.Close()
}

// kill ends the replica as a crash does: it loses the API server first, so
// it can neither give the Lease up (another replica takes over only once it
// expired) nor delete its feedback ConfigMap (the leader drops it from the
// counts once it expired), and its proxies' connections break without a
// word.
func (r *replica) kill() {
	r.api.closeAll()
	r.xds.closeAll()
	r.stop()
}

func (r *replica) leads() bool { return r.cp.Leading() }

// ready reports whether the replica passes its readiness check, which is
// when a Service would route proxies to it.
func (r *replica) ready() bool { return r.cp.Ready(nil) == nil }

// connSet holds connections to close all at once; once closed, it closes
// what is added to it.
type connSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// errKilled refuses a connection to or from a killed replica.
var errKilled = errors.New("the replica was killed")

// add keeps c, or closes it when the set was closed.
func (s *connSet) add(c net.Conn) (net.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return nil, errKilled
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return c, nil
}

// closeAll closes every connection kept, and those added later.
func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
}

// trackingListener adds every connection it accepts to conns.
type trackingListener struct {
	net.Listener
	conns *connSet
}

func (l trackingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c, err := l.conns.add(c); err == nil {
			return c, nil
		}
	}
}

// connect runs n SotW proxies of scope default/ha against the replica.
func connect(t *testing.T, r *replica, n int) []*adsclient.Client {
	t.Helper()
	var out []*adsclient.Client
	for i := range n {
		c := adsclient.New(adsclient.Config{
			Node:     testkit.Node(fmt.Sprintf("%s-proxy-%d", r.name, i), "default/ha"),
			Types:    []string{xdstype.Cluster.URL(), xdstype.Listener.URL()},
			Wildcard: map[string]bool{xdstype.Cluster.URL(): true, xdstype.Listener.URL(): true},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { // reconnect like a proxy until the test ends
			defer close(done)
			for ctx.Err() == nil {
				_ = c.Run(ctx, r.conn)
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
		out = append(out, c)
	}
	return out
}

func TestOnlyTheLeaderWritesStatusAndAnotherTakesOver(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "api"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
		&xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ha"}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"api"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		}},
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	a, b := startReplica(t, env, "a", "scopeplane-test"), startReplica(t, env, "b", "scopeplane-test")
	// Both replicas serve xDS: one proxy on a, two on b, all configured.
	proxies := map[*replica][]*adsclient.Client{a: connect(t, a, 1), b: connect(t, b, 2)}
	for r, ps := range proxies {
		for _, c := range ps {
			testkit.Eventually(t, "a proxy of replica "+r.name+" configured", func() (bool, string) {
				return len(c.State(xdstype.Cluster.URL())) == 1, fmt.Sprint(c.Err())
			})
		}
	}

	var leader, other *replica
	testkit.Eventually(t, "a leader", func() (bool, string) {
		switch {
		case a.leads() && !b.leads():
			leader, other = a, b
		case b.leads() && !a.leads():
			leader, other = b, a
		default:
			return false, fmt.Sprintf("a leads %v, b leads %v", a.leads(), b.leads())
		}
		return true, ""
	})
	// The status counts every replica's proxies, and only the leader writes
	// it: each replica's manager writes under its own name (its user
	// agent), so the status's field managers say who wrote.
	get := func() *xdsv1alpha1.ProxyScope {
		ps := &xdsv1alpha1.ProxyScope{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "ha"}, ps); err != nil {
			t.Fatal(err)
		}
		return ps
	}
	connected := func() int32 { return ptr.Deref(get().Status.ConnectedProxies, 0) }
	want := int32(len(proxies[a]) + len(proxies[b]))
	testkit.Eventually(t, "status written by the leader "+leader.name+", counting both replicas' proxies", func() (bool, string) {
		return connected() == want, fmt.Sprint(connected())
	})
	for _, f := range get().ManagedFields {
		if f.Subresource == "status" && f.Manager != userAgent(leader.name) {
			t.Errorf("the status was written by %s too, while %s leads", f.Manager, leader.name)
		}
	}

	// The leader goes away; the other replica takes over the status.
	leader.stop()
	// Its proxies, whose streams ended with it, leave the counts: it
	// deleted its feedback ConfigMap as it stopped.
	want = int32(len(proxies[other]))
	testkit.Eventually(t, "replica "+other.name+" leading and writing status", func() (bool, string) {
		return other.leads() && connected() == want, fmt.Sprintf("leads %v, connectedProxies %d", other.leads(), connected())
	})
}
