package servicecache

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
)

// reachOf is a Reach the test sets.
type reachOf struct {
	mu      sync.Mutex
	nss     []string
	version uint64
	changed chan struct{}
}

func (r *reachOf) set(nss ...string) {
	r.mu.Lock()
	r.nss, r.version = nss, r.version+1
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *reachOf) reach() ([]string, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.nss), r.version
}

func (r *reachOf) current() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// A shard's caches follow the namespaces its scopes reach, one cache per
// namespace, and past the bound one cache of every namespace; each
// namespace that joins is listed and reconciled before Hold returns, and
// a namespace that leaves is no longer read.
func TestCachesFollowTheReach(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	nss := []string{"n1", "n2", "n3", "n4"}
	for _, ns := range nss {
		for _, o := range []client.Object{
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}},
		} {
			if err := env.Client.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &reachOf{changed: make(chan struct{}, 1)}
	r.set("n1")
	c := NewSharded(ForManager(mgr, cache.Options{}), r.reach, r.current, r.changed, ctrl.Log)
	c.maxNamespaces, c.allDwell = 2, 0

	// A subscriber reconciles what it is told: it records it as Done. It
	// also records the deletions it is told of.
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	var (
		deletedMu sync.Mutex
		deleted   = map[string]int{}
	)
	enqueue := &handler.EnqueueRequestForObject{}
	h := handler.Funcs{
		CreateFunc: enqueue.Create,
		UpdateFunc: enqueue.Update,
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			deletedMu.Lock()
			deleted[e.Object.GetNamespace()]++
			deletedMu.Unlock()
			enqueue.Delete(ctx, e, q)
		},
	}
	if err := c.Source(&corev1.Service{}, h).Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	deletions := func(ns string) int {
		deletedMu.Lock()
		defer deletedMu.Unlock()
		return deleted[ns]
	}
	go func() {
		for {
			req, stop := q.Get()
			if stop {
				return
			}
			c.Done(req.NamespacedName)
			q.Done(req)
		}
	}()
	go func() {
		if err := c.Start(ctx); err != nil {
			t.Error(err)
		}
	}()

	expect := func(what string, watched []string, held ...string) {
		t.Helper()
		c.Hold(ctx)
		if got := c.Listing(); len(got) > 0 {
			t.Errorf("%s: Hold returned with %v listing", what, got)
		}
		if got := c.Namespaces(); !slices.Equal(got, watched) {
			t.Errorf("%s: watching %v, want %v", what, got, watched)
		}
		for _, ns := range nss {
			err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, &corev1.Service{})
			switch want := slices.Contains(held, ns); {
			case want && err != nil:
				t.Errorf("%s: %s/web: %v", what, ns, err)
			case !want && !apierrors.IsNotFound(err):
				t.Errorf("%s: %s/web read (%v), its namespace is not watched", what, ns, err)
			}
		}
	}
	if err := c.Await(ctx); err != nil {
		t.Fatal(err)
	}
	expect("one namespace", []string{"n1"}, "n1")
	r.set("n1", "n2")
	expect("a namespace joins", []string{"n1", "n2"}, "n1", "n2")
	r.set("n1", "n2", "n3")
	expect("past the bound", []string{"*"}, nss...)
	r.set("n2", "n3")
	expect("above half the bound", []string{"*"}, nss...)
	before := deletions("n4")
	r.set("n3")
	expect("at half the bound", []string{"n3"}, "n3")
	if deletions("n4") == before {
		t.Error("the subscriber was not told that n4/web left with the cache of every namespace")
	}
	before = deletions("n3")
	r.set()
	expect("none", nil)
	if deletions("n3") == before {
		t.Error("the subscriber was not told that n3/web left with its namespace")
	}

	// Once it watches every namespace, a shard keeps doing so for a
	// while, and looks again when that ends, whether the reach changed
	// or not.
	c.mu.Lock()
	c.allDwell = 500 * time.Millisecond
	c.mu.Unlock()
	r.set("n1", "n2", "n3")
	expect("past the bound again", []string{"*"}, nss...)
	r.set("n2")
	c.Hold(ctx)
	testkit.Eventually(t, "back to one cache per namespace once the dwell ends", func() (bool, string) {
		got := c.Namespaces()
		return slices.Equal(got, []string{"n2"}), fmt.Sprint(got)
	})
	c.mu.Lock()
	c.allDwell = time.Hour
	c.mu.Unlock()
	r.set("n1", "n2", "n3")
	expect("past the bound a third time", []string{"*"}, nss...)
	r.set("n1")
	expect("below half the bound, within the dwell", []string{"*"}, nss...)
}
