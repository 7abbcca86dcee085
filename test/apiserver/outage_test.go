package apiserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/metrics"
)

// outage is how long the API server stays stopped: several times the
// Lease's renew deadline, so the leader loses its Lease meanwhile.
const outage = 60 * time.Second

// TestAPIServerOutage stops the API server for a minute under two replicas
// with leader election (production timings) and a SotW and a delta proxy on
// each. Throughout, every replica keeps serving: no stream is reset, no
// manager ends, and proxies connecting (or reconnecting) during the outage
// get the last snapshot. The leader's Lease lapses, which stops only the
// status writing. After the API server's return a Service change reaches
// every proxy and the status is written again. The timeline is logged.
func TestAPIServerOutage(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	const ns = "outage"
	create(t, env,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api", Labels: map[string]string{"app": "outage"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
		scope(ns, "sotw", "outage", xdsv1alpha1.ProtocolSotW),
		scope(ns, "delta", "outage", xdsv1alpha1.ProtocolDelta),
	)
	le := controlplane.LeaderElection{Enabled: true, Namespace: "default"} // client-go's timings as main runs them
	replicas := []*replica{
		startReplica(t, env, "a", controlplane.Options{LeaderElection: le}),
		startReplica(t, env, "b", controlplane.Options{LeaderElection: le}),
	}
	protocols := map[string]adsclient.Protocol{"sotw": adsclient.SotW, "delta": adsclient.Delta}
	var early []*proxy
	for _, r := range replicas {
		for s, p := range protocols {
			early = append(early, connect(t, r.addr, p, r.name+"-"+s, ns+"/"+s))
		}
	}
	awaitClusters(t, "every proxy configured", early, 1)
	// A delta proxy per replica whose stream ends during the outage and
	// opens again on the same client: a reconnect, which declares what it
	// holds (initial_resource_versions).
	var rejoin []*rejoiner
	for _, r := range replicas {
		rejoin = append(rejoin, startRejoiner(t, r.addr, r.name+"-delta-rejoin", ns+"/delta"))
	}

	leader := awaitLeader(t, replicas)
	awaitStatus(t, env, ns, leader, map[string]int32{"sotw": 1, "delta": 2}, 1)
	t.Logf("leader %s; every proxy configured and the status written", leader.name)

	// The outage.
	stopping := time.Now()
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	at := func(what string) {
		t.Logf("%6.1fs after the API server stopped: %s", time.Since(stopped).Seconds(), what)
	}
	t.Logf("stopping the API server took %.1fs", stopped.Sub(stopping).Seconds())
	testkit.Eventually(t, "the leader's Lease lapsed (no replica leading)", func() (bool, string) {
		return !replicas[0].cp.Leading() && !replicas[1].cp.Leading(), "still leading"
	})
	at("no replica leads (the Lease could not be renewed)")
	// A reconnecting delta proxy that holds the current version gets no
	// response: that its new stream is open and served shows in the
	// streams the replicas count (what the status reports).
	for _, rj := range rejoin {
		rj.reconnect(t)
	}
	deltaStreams := func() (bool, string) {
		n := testutil.ToFloat64(metrics.ConnectedProxies.WithLabelValues(ns+"/delta", "Delta"))
		return n == 4, fmt.Sprintf("%v open delta streams", n)
	}
	testkit.Eventually(t, "the rejoining delta proxies admitted again", deltaStreams)
	awaitClusters(t, "the rejoining delta proxies still configured", rejoiners(rejoin), 1)
	at("delta proxies reconnecting during the outage admitted")
	var late []*proxy
	for _, r := range replicas {
		for s, p := range protocols {
			late = append(late, connect(t, r.addr, p, r.name+"-"+s+"-late", ns+"/"+s))
		}
	}
	awaitClusters(t, "proxies connecting during the outage configured", late, 1)
	at("new proxies connecting during the outage got the last snapshot")
	time.Sleep(time.Until(stopped.Add(outage)))
	checkServing(t, replicas, early)
	down := time.Since(stopped) // taken first: the age, taken after, is at least this
	age, ok := metrics.WatchAge.Age("Service")
	if !ok || age < down {
		t.Errorf("scopeplane_watch_age_seconds{kind=Service} is %v (reported %v) at the outage's end, %v after the API server stopped: it heard from a stopped API server", age, ok, down)
	}
	at(fmt.Sprintf("restarting the API server; every replica still serving, no stream reset, Service data %.0fs old", age.Seconds()))

	// The return.
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	after := func(what string) {
		t.Logf("%6.1fs after the API server answered again: %s", time.Since(up).Seconds(), what)
	}
	after(fmt.Sprintf("the API server answers (it took %.1fs to start)", up.Sub(stopped.Add(outage)).Seconds()))
	testkit.Eventually(t, "the informers heard from the API server again", func() (bool, string) {
		for _, k := range []string{"Service", "ProxyScope", "Namespace", "EndpointSlice"} {
			if a, _ := metrics.WatchAge.Age(k); a > time.Since(up) {
				return false, fmt.Sprintf("%s data %v old", k, a)
			}
		}
		return true, ""
	})
	after("every watched kind heard from again (scopeplane_watch_age_seconds below the time since)")
	leader = awaitLeader(t, replicas)
	after("replica " + leader.name + " leads again")
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := &corev1.Service{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "api"}, svc); err != nil {
			return err
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "admin", Port: 9000})
		return env.Client.Update(context.Background(), svc)
	}); err != nil {
		t.Fatal(err)
	}
	after("a Service changed through the API")
	all := append(append(early, late...), rejoiners(rejoin)...)
	awaitClusters(t, "the change reached every proxy", all, 2)
	after("the change reached every proxy")
	// The leader's proxies: early and late ones, and a rejoiner for delta.
	awaitStatus(t, env, ns, leader, map[string]int32{"sotw": 2, "delta": 3}, 2)
	after("the status of both scopes written by " + leader.name)
	checkServing(t, replicas, early)
}

// checkServing fails the test if a replica's manager ended or a proxy's
// first stream did.
func checkServing(t *testing.T, replicas []*replica, proxies []*proxy) {
	t.Helper()
	for _, r := range replicas {
		if !r.running() {
			t.Errorf("replica %s: the manager ended (%v)", r.name, r.err)
		}
	}
	for _, px := range proxies {
		if !px.open() {
			t.Errorf("proxy %s: its stream was reset: %v", px.name, px.err)
		}
	}
}

func awaitClusters(t *testing.T, what string, proxies []*proxy, n int) {
	t.Helper()
	testkit.Eventually(t, what, func() (bool, string) {
		var bad []string
		for _, px := range proxies {
			if len(px.clusters()) != n || !px.open() {
				bad = append(bad, describe(px))
			}
		}
		return len(bad) == 0, strings.Join(bad, "; ")
	})
}

func awaitLeader(t *testing.T, replicas []*replica) *replica {
	t.Helper()
	var leader *replica
	testkit.Eventually(t, "one replica leading", func() (bool, string) {
		var leading []string
		for _, r := range replicas {
			if r.cp.Leading() {
				leader = r
				leading = append(leading, r.name)
			}
		}
		return len(leading) == 1, fmt.Sprint("leading: ", leading)
	})
	return leader
}

// awaitStatus waits until each scope's status counts the wanted proxies
// (the leader's own: the status is its view) synced to a snapshot of
// clusters.
func awaitStatus(t *testing.T, env *localapi.Env, ns string, leader *replica, want map[string]int32, clusters int32) {
	t.Helper()
	for s, w := range want {
		testkit.Eventually(t, fmt.Sprintf("%s/%s status: %d proxies of %s synced to %d clusters", ns, s, w, leader.name, clusters), func() (bool, string) {
			ps, err := getScope(t, env, ns, s)
			if err != nil {
				return false, err.Error()
			}
			st := ps.Status
			return ptr.Deref(st.ConnectedProxies, -1) == w && st.SyncedProxies == w && st.Clusters == clusters,
				fmt.Sprintf("connected %d, synced %d, clusters %d", ptr.Deref(st.ConnectedProxies, -1), st.SyncedProxies, st.Clusters)
		})
	}
}

// rejoiner is a delta proxy whose stream the test ends and opens again.
type rejoiner struct {
	px     *proxy
	conn   *grpc.ClientConn
	cancel context.CancelFunc
}

func startRejoiner(t *testing.T, addr, id, scopeName string) *rejoiner {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	rj := &rejoiner{conn: conn, px: &proxy{name: id, c: adsclient.New(testkit.WildcardClient(adsclient.Delta, testkit.Node(id, scopeName)))}}
	rj.run(t)
	t.Cleanup(func() { _ = conn.Close() })
	awaitClusters(t, id+" configured", []*proxy{rj.px}, 1)
	return rj
}

func (rj *rejoiner) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	rj.cancel = cancel
	ended := make(chan struct{})
	rj.px.ended = ended
	go func() {
		rj.px.err = rj.px.c.Run(ctx, rj.conn)
		close(ended)
	}()
	t.Cleanup(func() { cancel(); <-ended })
}

// reconnect ends the stream and opens a new one on the same client, which
// keeps what it holds.
func (rj *rejoiner) reconnect(t *testing.T) {
	rj.cancel()
	<-rj.px.ended
	rj.run(t)
}

func rejoiners(rs []*rejoiner) []*proxy {
	var out []*proxy
	for _, r := range rs {
		out = append(out, r.px)
	}
	return out
}
