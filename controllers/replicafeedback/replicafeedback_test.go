package replicafeedback

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
)

var env *localapi.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	var err error
	if env, err = localapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

var web = model.Key{Namespace: "shop", Name: "web"}

// namespace creates a namespace for one test's ConfigMaps.
func namespace(t *testing.T, name string) string {
	t.Helper()
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// collector runs a Collector as replica self would, and returns it.
func collector(t *testing.T, self Replica) *Collector {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCollector(mgr, self, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	run(t, mgr.Start)
	return c
}

// run runs start until the test ends.
func run(t *testing.T, start func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := start(ctx); err != nil {
			t.Error(err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// connected are the proxies of web a collector counts from other replicas.
func connected(c *Collector, version string) (all, synced int) {
	s := feedback.Merge(c.Get(web)...)
	return s.Connected(version)
}

// Two replicas' proxies reach a third's collector, their rejections too; a
// replica that stops leaves the counts at once, one that dies when its
// heartbeat expires.
func TestReplicasReachTheLeader(t *testing.T) {
	ns := namespace(t, "reach")
	leader := collector(t, Replica{Name: "leader", Namespace: ns, Expiry: 3 * time.Second})
	trackers := map[string]*feedback.Tracker{}
	stops := map[string]func(){}
	for i, name := range []string{"r1", "r2"} {
		tr := feedback.New(0)
		trackers[name] = tr
		for j := range i + 1 {
			id := tr.Connect(web, &corev3.Node{Id: fmt.Sprintf("%s-%d", name, j)}, model.Delta, "127.0.0.1:1", "", model.Location{})
			tr.AtVersion(web, id, "v1", time.Time{})
		}
		p := &Publisher{Client: env.Client, Feedback: tr, Replica: Replica{Name: name, Namespace: ns, Heartbeat: time.Second}, Log: logr.Discard()}
		stops[name] = run(t, p.Start)
	}
	testkit.Eventually(t, "both replicas' proxies counted", func() (bool, string) {
		all, synced := connected(leader, "v1")
		return all == 3 && synced == 3, fmt.Sprintf("%d connected, %d at v1", all, synced)
	})

	id := trackers["r2"].Connect(web, &corev3.Node{Id: "bad"}, model.SotW, "127.0.0.1:2", "system:serviceaccount:shop:envoy", model.Location{})
	trackers["r2"].NACKed(web, id, "type.googleapis.com/envoy.config.cluster.v3.Cluster", "v1", "bad cluster", feedback.HeldBack{})
	testkit.Eventually(t, "a follower's NACK counted", func() (bool, string) {
		s := feedback.Merge(leader.Get(web)...)
		ok := s.NackingCount == 1 && len(s.Nacking) == 1 && s.Nacking[0] == "bad" && len(s.NACKs) == 1 && s.NACKs[0].Detail == "bad cluster" &&
			s.NACKs[0].Identity == "system:serviceaccount:shop:envoy" && s.Speaking(model.SotW) == 1
		return ok, fmt.Sprintf("%+v", s)
	})

	stops["r1"]()
	testkit.Eventually(t, "a stopped replica's proxies leave the counts", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return all == 3 && leader.Replicas() == 1, fmt.Sprintf("%d connected from %d replicas", all, leader.Replicas())
	})

	// r3 dies without deleting its ConfigMap: its report is written once
	// and never renewed.
	dead := &Publisher{Client: env.Client, Feedback: trackers["r1"], Replica: Replica{Name: "r3", Namespace: ns}, Log: logr.Discard()}
	if err := dead.publish(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "a dead replica's proxies counted, then expired", func() (bool, string) {
		return leader.Replicas() == 2, fmt.Sprint(leader.Replicas())
	})
	testkit.Eventually(t, "a dead replica's heartbeat expired", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return all == 3 && leader.Replicas() == 1, fmt.Sprintf("%d connected from %d replicas", all, leader.Replicas())
	})
}

// A manifest that cannot be read (three parts: not a count the writer
// makes) is refused, and the replica's previous report goes with it:
// stale counts would be wrong counts.
func TestDamagedReportIsLeftOut(t *testing.T) {
	ns := namespace(t, "damaged")
	leader := collector(t, Replica{Name: "leader", Namespace: ns})
	tr := feedback.New(0)
	tr.Connect(web, &corev3.Node{Id: "p"}, model.SotW, "", "", model.Location{})
	p := &Publisher{Client: env.Client, Feedback: tr, Replica: Replica{Name: "damaged", Namespace: ns}, Log: logr.Discard()}
	if err := p.publish(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the report counted", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return all == 1, fmt.Sprint(all)
	})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ConfigMapName("damaged"), Labels: map[string]string{Label: "damaged"}},
		Data: map[string]string{ManifestKey: `{"parts":[{"digest":"x"},{"digest":"y"},{"digest":"z"}]}`}}
	if err := env.Client.Update(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the damaged report left out", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return all == 0 && leader.Replicas() == 0, fmt.Sprintf("%d connected from %d replicas", all, leader.Replicas())
	})
}

// Under feedback that changes all the time (1,000 proxies moving to a new
// version every 100 ms), a replica writes its ConfigMap at most once an
// Interval: the API writes are bounded by the replicas, not the proxies.
func TestWritesAreBoundedUnderChurn(t *testing.T) {
	ns := namespace(t, "churn")
	leader := collector(t, Replica{Name: "leader", Namespace: ns})
	tr := feedback.New(0)
	ids := make([]uint64, 1000)
	for i := range ids {
		ids[i] = tr.Connect(web, &corev3.Node{Id: fmt.Sprintf("p-%d", i)}, model.Delta, "", "", model.Location{})
	}
	const interval = DefaultInterval
	p := &Publisher{Client: env.Client, Feedback: tr, Replica: Replica{Name: "churn", Namespace: ns}, Log: logr.Discard()}
	ok := metrics.FeedbackWrites.WithLabelValues("ok")
	before := testutil.ToFloat64(ok)
	start := time.Now()
	stop := run(t, p.Start)
	const changes = 50
	for v := range changes {
		version := fmt.Sprintf("v%d", v)
		for _, id := range ids {
			tr.AtVersion(web, id, version, time.Time{})
		}
		time.Sleep(100 * time.Millisecond) // the churn's pace, not a synchronization
	}
	last := fmt.Sprintf("v%d", changes-1)
	testkit.Eventually(t, "the last version reported", func() (bool, string) {
		_, synced := connected(leader, last)
		return synced == len(ids), fmt.Sprint(synced)
	})
	stop()
	elapsed := time.Since(start)
	writes := testutil.ToFloat64(ok) - before
	bound := float64(elapsed/interval) + 1
	t.Logf("%d proxies, a new version every 100 ms: %.0f writes in %s (%.1f/s), at most one per %s", len(ids), writes, elapsed.Round(time.Millisecond), writes/elapsed.Seconds(), interval)
	if writes > bound {
		t.Errorf("%.0f writes in %s: more than one per %s (%.0f)", writes, elapsed, interval, bound)
	}
	if writes < 2 {
		t.Errorf("%.0f writes: the changing feedback was not published", writes)
	}
}

// refusingParts refuses every write of a part while refuse is set, as a
// quota or a webhook would.
type refusingParts struct {
	client.Client
	refuse *atomic.Bool
}

func (c refusingParts) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if _, part := obj.GetLabels()[PartLabel]; part && c.refuse.Load() {
		return errors.New("exceeded quota: count/configmaps")
	}
	return c.Client.Update(ctx, obj, opts...)
}

// A part that cannot be written is named in the manifest: the leader keeps
// counting what the part last said, and says why for each of its scopes;
// once the part is written again, the counts are current and nothing is
// said.
func TestUnwrittenPartIsReported(t *testing.T) {
	ns := namespace(t, "unwritten")
	leader := collector(t, Replica{Name: "leader", Namespace: ns})
	tr := feedback.New(0)
	id := tr.Connect(web, &corev3.Node{Id: "p"}, model.Delta, "", "", model.Location{})
	tr.AtVersion(web, id, "v1", time.Time{})
	var refuse atomic.Bool
	p := &Publisher{Client: refusingParts{env.Client, &refuse}, Feedback: tr, Replica: Replica{Name: "w", Namespace: ns}, Log: logr.Discard()}
	if err := p.publish(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the report counted", func() (bool, string) {
		_, synced := connected(leader, "v1")
		return synced == 1, fmt.Sprint(synced)
	})

	refuse.Store(true)
	tr.AtVersion(web, id, "v2", time.Time{})
	if err := p.publish(context.Background(), time.Now()); err == nil {
		t.Fatal("a refused part published without an error")
	}
	testkit.Eventually(t, "the unwritten part said", func() (bool, string) {
		u := leader.Unreported(web)
		return len(u) == 1 && strings.Contains(u[0], "replica w:") && strings.Contains(u[0], "exceeded quota"), fmt.Sprint(u)
	})
	if _, synced := connected(leader, "v1"); synced != 1 {
		t.Errorf("%d proxies at v1: what the part last said is not counted", synced)
	}

	refuse.Store(false)
	if err := p.publish(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the part written again", func() (bool, string) {
		_, synced := connected(leader, "v2")
		u := leader.Unreported(web)
		return synced == 1 && len(u) == 0, fmt.Sprintf("%d at v2, %v", synced, u)
	})
}

// With shards, a collector counts the reports of its own shard's replicas
// only: another shard's replica serves none of its scopes, and a part it
// fails to write is not its scopes' failure.
func TestCollectorReadsItsShardOnly(t *testing.T) {
	ns := namespace(t, "shards")
	leader := collector(t, Replica{Name: "leader", Namespace: ns, Shard: "1"})
	publish := func(r Replica) {
		tr := feedback.New(0)
		id := tr.Connect(web, &corev3.Node{Id: r.Name}, model.Delta, "127.0.0.1:1", "", model.Location{})
		tr.AtVersion(web, id, "v1", time.Time{})
		run(t, (&Publisher{Client: env.Client, Feedback: tr, Replica: r, Log: logr.Discard()}).Start)
	}
	publish(Replica{Name: "same", Namespace: ns, Shard: "1"})
	publish(Replica{Name: "other", Namespace: ns, Shard: "0"})
	testkit.Eventually(t, "the report of the shard's replica counted", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return all == 1 && leader.Replicas() == 1, fmt.Sprintf("%d connected from %d replicas", all, leader.Replicas())
	})
	testkit.Eventually(t, "the other shard's report written", func() (bool, string) {
		cms := &corev1.ConfigMapList{}
		err := env.Client.List(context.Background(), cms, client.InNamespace(ns), client.MatchingLabels{ShardLabel: "0"})
		return err == nil && len(cms.Items) > 0, fmt.Sprint(err)
	})
	// A report of the shard written after the other shard's: the watch
	// delivers in order, so once the collector counts it, it would have
	// counted the other shard's before, had it read it.
	publish(Replica{Name: "later", Namespace: ns, Shard: "1"})
	testkit.Eventually(t, "the later report of the shard's counted", func() (bool, string) {
		all, _ := connected(leader, "v1")
		return leader.Replicas() >= 2, fmt.Sprintf("%d connected from %d replicas", all, leader.Replicas())
	})
	if all, _ := connected(leader, "v1"); all != 2 || leader.Replicas() != 2 {
		t.Errorf("%d connected from %d replicas, want the shard's two", all, leader.Replicas())
	}
}
