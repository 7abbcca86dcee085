package status

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// countingClient counts the status patches sent through it and, when read
// is set, records the ProxyScopes read through it.
type countingClient struct {
	client.Client
	patches *atomic.Int64
	read    *readScopes
}

func (c countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := c.Client.Get(ctx, key, obj, opts...)
	if _, ok := obj.(*xdsv1alpha1.ProxyScope); ok && err == nil && c.read != nil {
		c.read.mu.Lock()
		c.read.names[key.String()] = true
		c.read.mu.Unlock()
	}
	return err
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingWriter{c.Client.Status(), c.patches}
}

type countingWriter struct {
	client.SubResourceWriter
	patches *atomic.Int64
}

func (w countingWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	w.patches.Add(1)
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// TestStatusWritesAtStartAndAsTheCostWindowRolls runs the status
// controller on a real API server over 100 scopes and counts its status
// patches.
//
// A start: the controller starts before the pipeline's first build, which
// takes a while; it writes every status once, after the build, not once
// saying SnapshotNotBuilt and again when built.
//
// The cost window: every scope's proxies are sent something all the time,
// with buckets of 200 ms, so the window's figures move every bucket; the
// statuses change at most once per CostRefreshBuckets buckets each (one
// write per scope per 2 s here), not once per bucket.
func TestStatusWritesAtStartAndAsTheCostWindowRolls(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	const ns, scopes, bucket = "writes", 100, 200 * time.Millisecond
	store := snapshot.NewStore()
	var models []*model.Scope
	keys := make([]model.Key, scopes)
	for i := range keys {
		keys[i] = model.Key{Namespace: ns, Name: fmt.Sprintf("scope-%03d", i)}
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name},
			Spec: xdsv1alpha1.ProxyScopeSpec{Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}}}}
		if err := env.Client.Create(ctx, ps); err != nil {
			t.Fatal(err)
		}
		models = append(models, &model.Scope{Key: key, Generation: ps.Generation, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
			Selections: []model.Selection{{Namespace: ns, Names: map[string]struct{}{"web": {}}}}})
	}
	// world is a catalog of the scopes and their Service, as a process
	// reads them at its start.
	world := func() *catalog.Catalog {
		cat := catalog.New()
		for _, m := range models {
			cat.UpsertScope(m)
		}
		cat.UpsertService(&model.Service{Key: model.Key{Namespace: ns, Name: "web"}, Ports: []model.ServicePort{{Port: 80, Protocol: model.ProtocolTCP, TargetPort: 80}}})
		return cat
	}
	cat := world()

	var patches atomic.Int64
	firstBuild := make(chan struct{})
	tracker := feedback.New(bucket)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Client: countingClient{Client: mgr.GetClient(), patches: &patches}, Store: store, Feedback: tracker, Bootstrap: bootstrapconfig.NewConflicts(),
		Recorder: mgr.GetEventRecorder("scopeplane"), Window: 10 * time.Millisecond, Workers: 8, Built: firstBuild}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	// The first build comes only once the controller has listed every
	// scope, as at a start at scale: each scope's reconcile waits for it.
	testkit.Eventually(t, "the controller listed every scope", func() (bool, string) {
		var l xdsv1alpha1.ProxyScopeList
		if err := mgr.GetCache().List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == scopes, fmt.Sprintf("%d of %d scopes listed", len(l.Items), scopes)
	})
	snapshot.NewBuilder(cat, store, 0).Apply(cat.Take())
	close(firstBuild)
	built := func() (int, error) {
		var l xdsv1alpha1.ProxyScopeList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		n := 0
		for _, ps := range l.Items {
			if ps.Status.ObservedGeneration == ps.Generation && meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted) != nil {
				n++
			}
		}
		return n, nil
	}
	testkit.Eventually(t, "every status written after the build", func() (bool, string) {
		n, err := built()
		return err == nil && n == scopes, fmt.Sprintf("%d of %d written at their generation (%v), %d patches", n, scopes, err, patches.Load())
	})
	time.Sleep(time.Second) // room for writes that should not come
	start := patches.Load()
	t.Logf("start: %d status patches for %d scopes", start, scopes)
	if start > scopes {
		t.Errorf("start: %d status patches for %d scopes, more than one each", start, scopes)
	}

	// A proxy of every scope connects, and is sent a response every 20 ms.
	for _, key := range keys {
		tracker.Sent(key, model.SotW, xdstype.Cluster.URL(), feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 120, Connect: true})
		tracker.Connect(key, testkit.Node("p", key.String()), model.SotW, "", "", model.Location{})
	}
	feed, stopFeed := context.WithCancel(ctx)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-feed.Done():
				return
			case <-tick.C:
				for _, key := range keys {
					tracker.Sent(key, model.SotW, xdstype.Cluster.URL(), feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 120})
				}
			}
		}
	}()
	testkit.EventuallyWithin(t, 2*time.Minute, "every scope's first cost figures written", func() (bool, string) {
		var l xdsv1alpha1.ProxyScopeList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, ps := range l.Items {
			if ps.Status.Cost != nil && ps.Status.Cost.Pushes > 0 {
				n++
			}
		}
		return n == scopes, fmt.Sprintf("%d of %d with cost figures", n, scopes)
	})
	rolling := patches.Load()
	began := time.Now()
	time.Sleep(12 * time.Second) // 60 buckets: 6 refresh periods
	stopFeed()
	<-fed
	elapsed := time.Since(began)
	writes := patches.Load() - rolling
	period := CostRefreshBuckets * bucket
	bound := int64(scopes) * (int64(elapsed/period) + 2)
	t.Logf("cost window rolling every %s for %s: %d status patches for %d scopes (%.1f per scope per refresh period of %s; at most %d)",
		bucket, elapsed.Round(time.Millisecond), writes, scopes, float64(writes)/float64(scopes)/(float64(elapsed)/float64(period)), period, bound)
	if writes > bound {
		t.Errorf("%d status patches for %d scopes in %s: more than one per scope per %s (%d)", writes, scopes, elapsed, period, bound)
	}

	// A new leader over the same world: the first stops, and another
	// process builds the same versions again and sees the same proxies
	// reconnect, with an empty cost window of its own. Every status is
	// current already, so it reconciles every scope and writes none.
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	done <- nil // the first manager's cleanup, above, reads it again
	store = snapshot.NewStore()
	cat = world()
	snapshot.NewBuilder(cat, store, 0).Apply(cat.Take())
	tracker = feedback.New(time.Hour)
	for _, key := range keys {
		tracker.Sent(key, model.SotW, xdstype.Cluster.URL(), feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 120, Connect: true})
		tracker.Connect(key, testkit.Node("p", key.String()), model.SotW, "", "", model.Location{})
	}
	mgr, err = ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	var restart atomic.Int64
	read := &readScopes{names: map[string]bool{}}
	ready := make(chan struct{})
	close(ready)
	r = &Reconciler{Client: countingClient{Client: mgr.GetClient(), patches: &restart, read: read}, Store: store, Feedback: tracker, Bootstrap: bootstrapconfig.NewConflicts(),
		Recorder: mgr.GetEventRecorder("scopeplane"), Window: 10 * time.Millisecond, Workers: 8, Built: ready}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	again, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(again) }()
	defer func() {
		stop()
		if err := <-stopped; err != nil {
			t.Error(err)
		}
	}()
	testkit.Eventually(t, "the new leader reconciled every scope", func() (bool, string) {
		n := read.count()
		return n == scopes, fmt.Sprintf("%d of %d scopes read, %d patches", n, scopes, restart.Load())
	})
	time.Sleep(time.Second) // room for the patches of the last scopes read
	t.Logf("restart: %d status patches for %d scopes", restart.Load(), scopes)
	if n := restart.Load(); n != 0 {
		t.Errorf("a new leader over an unchanged world wrote %d of %d statuses", n, scopes)
	}
}

// readScopes records the ProxyScopes a reconciler read.
type readScopes struct {
	mu    sync.Mutex
	names map[string]bool
}

func (r *readScopes) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.names)
}

// TestInputsCountFromTheLeadersStart checks what the reconciler tells
// compute of its leadership: when it began, and, for a scope whose cost it
// has not written, that start as the last cost write, so that a
// predecessor's figures are refreshed at the scope's slot after it.
func TestInputsCountFromTheLeadersStart(t *testing.T) {
	began := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	r := &Reconciler{Store: snapshot.NewStore(), Feedback: feedback.New(time.Minute), Bootstrap: bootstrapconfig.NewConflicts()}
	r.leading = began
	ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "web-1"}}
	if in := r.inputs(ps); !in.Leading.Equal(began) || !in.CostWritten.Equal(began) {
		t.Errorf("before any cost write: leading %v, cost written %v; want both %v", in.Leading, in.CostWritten, began)
	}
	written := began.Add(time.Minute)
	r.costWritten.Store(ps.UID, costWrite{at: written})
	if in := r.inputs(ps); !in.Leading.Equal(began) || !in.CostWritten.Equal(written) {
		t.Errorf("after a cost write: leading %v, cost written %v; want %v and %v", in.Leading, in.CostWritten, began, written)
	}
}
