// Package servicecache holds the Services and EndpointSlices a replica
// reads, the bulk of what it lists from the API server: one informer cache
// for the whole cluster, or, on a shard's replica, one per namespace its
// scopes can reach (catalog.Reach), started when a namespace joins that set
// and stopped when it leaves, so that a shard lists, watches and holds its
// own namespaces' Services only (docs/sharding.md).
//
// controller-runtime's cache takes its namespaces when it is built, and a
// controller's watches are fixed at its start: Caches is therefore a
// client.Reader that asks the cache of the object's namespace (read.go), a
// source of events that follows every cache, present and future
// (source.go), and what tells the builder and the start when the
// namespaces' Services are in the catalog (wait.go).
package servicecache

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// SliceServiceIndex indexes EndpointSlices by the Service they belong to,
// so that reconciling a Service lists its slices without scanning the
// namespace.
const SliceServiceIndex = "scopeplane.dev/service-name"

// All is the namespace of the one cache that holds every namespace.
const All = ""

// MaxNamespaces is the most namespaces a shard watches one by one. Each
// costs two watches on the API server, and a scope whose namespaceSelector
// matches every namespace of a large cluster would make that thousands:
// past MaxNamespaces a shard watches every namespace with one cache
// instead, as an unsharded replica does. It returns to one cache per
// namespace once at most half of it remain, and not before allDwell, so
// that a set near the bound does not switch back and forth: each switch
// costs a list of the namespaces' Services.
const MaxNamespaces = 500

// reachCoalesce is how long Start gathers changes of the reach before it
// follows them.
const reachCoalesce = 100 * time.Millisecond

// allDwell is how long a shard that watches every namespace with one cache
// keeps it at least.
const allDwell = 5 * time.Minute

// NewCache builds an unstarted cache of the namespace's Services and
// EndpointSlices (every namespace's for All).
type NewCache func(namespace string) (cache.Cache, error)

// Reach returns the namespaces to watch, and a version that changes
// whenever they may have (catalog.Reach).
type Reach func() ([]string, uint64)

// Caches are a replica's Service and EndpointSlice caches. Add them to the
// manager as a Runnable: they start with it.
type Caches struct {
	newCache NewCache
	// reach is nil when every namespace is watched, with one cache.
	reach   Reach
	version func() uint64
	changed <-chan struct{}
	log     logr.Logger

	started chan struct{}
	ctx     context.Context // the caches' parent, set before started closes
	// recheck wakes Start to settle again: a dwell ended, or a cache
	// could not be built.
	recheck chan struct{}

	mu sync.Mutex
	// maxNamespaces and allDwell are MaxNamespaces and allDwell; tests
	// lower them.
	maxNamespaces int
	allDwell      time.Duration
	// applied is the reach version the caches follow, settled whether
	// they followed one; forced makes the next settle apply its version
	// again (a dwell ended).
	applied uint64
	settled bool
	forced  bool
	// dwelling is the cache of every namespace whose dwell's end is
	// awaited.
	dwelling *nsCache
	byNS     map[string]*nsCache
	subs     map[*subscription]struct{}
	// ready is closed while every namespace's cache is listed and each of
	// the Services it listed reconciled (Done); a namespace that joins
	// replaces it.
	ready chan struct{}
}

// nsCache is one namespace's cache and what its first listing awaits.
type nsCache struct {
	ns     string
	joined time.Time
	cache  cache.Cache
	// ctx ends when the cache is stopped.
	ctx    context.Context
	cancel context.CancelFunc
	regs   map[*subscription][]toolscache.ResourceEventHandlerRegistration
	// listed is set once the cache synced and its Services were listed:
	// pending are those not yet reconciled; done, until then, those that
	// were (the informer delivers its list before it reports synced).
	listed  bool
	pending map[types.NamespacedName]struct{}
	done    map[types.NamespacedName]struct{}
	// ready is closed once listed and nothing is pending.
	ready chan struct{}
}

// New returns caches of every namespace's Services: one cache, built by
// newCache(All).
func New(newCache NewCache, log logr.Logger) *Caches {
	return &Caches{newCache: newCache, log: log, maxNamespaces: MaxNamespaces, allDwell: allDwell,
		started: make(chan struct{}), recheck: make(chan struct{}, 1), byNS: map[string]*nsCache{},
		subs: map[*subscription]struct{}{}, ready: make(chan struct{})}
}

// NewSharded returns caches of the namespaces reach names, one cache each,
// recomputed whenever changed receives and before every Hold; version is
// reach's version alone, which Hold compares cheaply.
func NewSharded(newCache NewCache, reach Reach, version func() uint64, changed <-chan struct{}, log logr.Logger) *Caches {
	c := New(newCache, log)
	c.reach, c.version, c.changed = reach, version, changed
	return c
}

// ForManager builds the caches from base (transforms, informers) with the
// manager's configuration, client and scheme: a cache of one namespace, or
// of every one for All, that reads only the informers built for it.
func ForManager(mgr manager.Manager, base cache.Options) NewCache {
	return func(ns string) (cache.Cache, error) {
		o := base
		o.HTTPClient, o.Scheme, o.Mapper = mgr.GetHTTPClient(), mgr.GetScheme(), mgr.GetRESTMapper()
		o.DefaultNamespaces = nil
		if ns != All {
			o.DefaultNamespaces = map[string]cache.Config{ns: {}}
		}
		o.ReaderFailOnMissingInformer = true
		return cache.New(mgr.GetConfig(), o)
	}
}

// Start builds the caches of the namespaces to watch now, and follows the
// set until ctx ends, which stops every cache. A cache that cannot be
// built is tried again a second later.
func (c *Caches) Start(ctx context.Context) error {
	c.ctx = ctx
	close(c.started)
	c.wake(0)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
			// A start upserts its scopes one by one, each a change of
			// the reach: gather them rather than compute the reach for
			// each. Hold and Await settle at once when they need to.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(reachCoalesce):
			}
		case <-c.recheck:
		}
		if err := c.settle(); err != nil {
			c.log.Error(err, "following the namespaces the scopes reach; trying again in a second")
			c.wake(time.Second)
		}
	}
}

// wake has Start settle again after d.
func (c *Caches) wake(d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case c.recheck <- struct{}{}:
		default:
		}
	})
}

// NeedLeaderElection is false: every replica reads its Services.
func (*Caches) NeedLeaderElection() bool { return false }

// settle starts and stops caches so that they are those of the namespaces
// to watch now, if these may have changed since the last time. The
// deletions of a stopped namespace's Services are handed to the
// subscribers once the lock is released.
func (c *Caches) settle() error {
	want, version := []string{All}, uint64(0)
	if c.reach != nil {
		version = c.version()
		c.mu.Lock()
		current := c.settled && !c.forced && version <= c.applied
		c.mu.Unlock()
		if current {
			return nil
		}
		want, version = c.reach()
	}
	var deletes []func()
	defer func() {
		for _, d := range deletes {
			d()
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Versions only grow: of two settles at once, the older set must not
	// replace the newer.
	if c.settled && !c.forced && version <= c.applied {
		return nil
	}
	if c.reach != nil {
		want = c.boundLocked(want)
	}
	wanted := make(map[string]struct{}, len(want))
	for _, ns := range want {
		wanted[ns] = struct{}{}
	}
	var joined, left []string
	for ns := range c.byNS {
		if _, ok := wanted[ns]; !ok {
			deletes = append(deletes, c.stopLocked(ns))
			left = append(left, nameOf(ns))
		}
	}
	var err error
	for _, ns := range want {
		if c.byNS[ns] != nil {
			continue
		}
		if err = c.startLocked(ns); err != nil {
			break
		}
		joined = append(joined, nameOf(ns))
	}
	if c.reach != nil && len(joined)+len(left) > 0 {
		sort.Strings(left)
		c.log.Info("following the namespaces the scopes reach", "watching", len(c.byNS), "joined", joined, "left", left)
	}
	if err != nil {
		return err // the version is not applied: the next settle tries again
	}
	c.settled, c.forced, c.applied = true, false, version
	c.checkLocked()
	return nil
}

// boundLocked is the caches to have for the namespaces want: one each, or
// one of every namespace past maxNamespaces (see MaxNamespaces).
func (c *Caches) boundLocked(want []string) []string {
	whole := c.byNS[All]
	switch {
	case len(want) > c.maxNamespaces:
	case whole == nil:
		return want
	case len(want) > c.maxNamespaces/2:
	case time.Since(whole.joined) >= c.allDwell:
		return want
	case c.dwelling != whole:
		// Kept for the dwell; the set is looked at again once it ends.
		c.dwelling = whole
		time.AfterFunc(time.Until(whole.joined.Add(c.allDwell)), func() {
			c.mu.Lock()
			if c.byNS[All] == whole {
				c.forced = true
			}
			c.mu.Unlock()
			c.wake(0)
		})
	}
	return []string{All}
}

// startLocked builds, wires and starts the namespace's cache, and lists it
// once it synced.
func (c *Caches) startLocked(ns string) error {
	cc, err := c.newCache(ns)
	if err != nil {
		return fmt.Errorf("the Service cache of namespace %q: %w", ns, err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	if err := cc.IndexField(ctx, &discoveryv1.EndpointSlice{}, SliceServiceIndex, func(o client.Object) []string {
		if name := o.GetLabels()[discoveryv1.LabelServiceName]; name != "" {
			return []string{name}
		}
		return nil
	}); err != nil {
		cancel()
		return err
	}
	// Both informers exist before the cache starts, subscribed or not, so
	// that Get and List never build one (NewCache's caches refuse to).
	for _, o := range []client.Object{&corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		if _, err := cc.GetInformer(ctx, o, cache.BlockUntilSynced(false)); err != nil {
			cancel()
			return err
		}
	}
	n := &nsCache{ns: ns, joined: time.Now(), cache: cc, ctx: ctx, cancel: cancel, regs: map[*subscription][]toolscache.ResourceEventHandlerRegistration{},
		pending: map[types.NamespacedName]struct{}{}, done: map[types.NamespacedName]struct{}{}, ready: make(chan struct{})}
	for s := range c.subs {
		if err := n.subscribe(ctx, s); err != nil {
			cancel()
			return err
		}
	}
	c.byNS[ns] = n
	if c.isReady() {
		c.ready = make(chan struct{})
	}
	go func() {
		if err := cc.Start(ctx); err != nil {
			c.log.Error(err, "the Service cache stopped", "namespace", nameOf(ns))
		}
	}()
	go c.list(ctx, n)
	return nil
}

// list waits for the namespace's cache to sync and records its Services as
// pending their first reconcile.
func (c *Caches) list(ctx context.Context, n *nsCache) {
	if !n.cache.WaitForCacheSync(ctx) {
		return
	}
	l := &corev1.ServiceList{}
	if err := n.cache.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Error(err, "listing the Service cache", "namespace", nameOf(n.ns))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byNS[n.ns] != n {
		return
	}
	for i := range l.Items {
		key := types.NamespacedName{Namespace: l.Items[i].Namespace, Name: l.Items[i].Name}
		if _, ok := n.done[key]; !ok {
			n.pending[key] = struct{}{}
		}
	}
	n.done, n.listed = nil, true
	c.checkLocked()
}

// stopLocked stops the namespace's cache: its Services are no longer read
// from it (see Get), and it returns what tells each subscriber of Services
// of their deletion, so that the catalog forgets them. Until its Service
// informer synced, no read of the cache found a Service (a read waits for
// the sync), so the catalog holds none of them.
func (c *Caches) stopLocked(ns string) func() {
	n := c.byNS[ns]
	delete(c.byNS, ns)
	defer n.cancel()
	inf, err := n.cache.GetInformer(context.Background(), &corev1.Service{}, cache.BlockUntilSynced(false))
	if err != nil || !inf.HasSynced() {
		return func() {}
	}
	l := &corev1.ServiceList{}
	if err := n.cache.List(context.Background(), l, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Error(err, "listing the Service cache being stopped", "namespace", nameOf(ns))
		return func() {}
	}
	var handlers []toolscache.ResourceEventHandler
	for s := range c.subs {
		if _, ok := s.obj.(*corev1.Service); ok {
			handlers = append(handlers, s.handler)
		}
	}
	return func() {
		for _, h := range handlers {
			for i := range l.Items {
				h.OnDelete(&l.Items[i])
			}
		}
	}
}

// Namespaces are the namespaces watched now, sorted ("*" for every one).
func (c *Caches) Namespaces() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.byNS))
	for ns := range c.byNS {
		out = append(out, nameOf(ns))
	}
	sort.Strings(out)
	return out
}

// nameOf is how the logs and the readiness check name a cache.
func nameOf(ns string) string {
	if ns == All {
		return "*"
	}
	return ns
}
