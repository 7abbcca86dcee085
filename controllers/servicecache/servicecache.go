// Package servicecache holds the Services and EndpointSlices a replica
// reads, the bulk of what it lists from the API server: one informer cache
// for the whole cluster, or, on a shard's replica, one per namespace its
// scopes can reach (catalog.Reach), started when a namespace joins that set
// and stopped when it leaves, so that a shard lists, watches and holds its
// own namespaces' Services only (docs/sharding.md).
//
// controller-runtime's cache takes its namespaces when it is built, and a
// controller's watches are fixed at its start: Caches is therefore a
// client.Reader that asks the cache of the object's namespace, and a source
// of events (Source) that follows every cache, present and future.
package servicecache

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// MaxHold bounds how long Hold keeps the builder waiting for a namespace
// that joined to be listed: a namespace the API server does not list (an
// outage, a missing permission) must not hold every other change.
const MaxHold = 10 * time.Second

// All is the namespace of the one cache that holds every namespace.
const All = ""

// MaxNamespaces is the most namespaces a shard watches one by one. Each
// costs two watches on the API server, and a scope whose namespaceSelector
// matches every namespace of a large cluster would make that thousands:
// past MaxNamespaces a shard watches every namespace with one cache
// instead, as an unsharded replica does, and returns to one cache per
// namespace only below half of it, so that a set near the bound does not
// switch back and forth.
const MaxNamespaces = 500

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
	// maxNamespaces and allDwell are MaxNamespaces and allDwell; tests
	// lower them.
	maxNamespaces int
	allDwell      time.Duration

	started chan struct{}
	ctx     context.Context // the caches' parent, set before started closes

	mu      sync.Mutex
	applied uint64
	settled bool
	byNS    map[string]*nsCache
	subs    map[*subscription]struct{}
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
	return &Caches{newCache: newCache, log: log, maxNamespaces: MaxNamespaces, allDwell: allDwell, started: make(chan struct{}), byNS: map[string]*nsCache{},
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

// Start builds the caches of the namespaces to watch now, and follows the
// set until ctx ends, which stops every cache. A cache that cannot be
// built is tried again a second later.
func (c *Caches) Start(ctx context.Context) error {
	c.ctx = ctx
	close(c.started)
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
		case <-retry.C:
		}
		if err := c.settle(); err != nil {
			c.log.Error(err, "following the namespaces the scopes reach; trying again in a second")
			retry.Reset(time.Second)
		}
	}
}

// NeedLeaderElection is false: every replica reads its Services.
func (*Caches) NeedLeaderElection() bool { return false }

// settle starts and stops caches so that they are those of the namespaces
// to watch now, if these may have changed since the last time. The
// deletions of a stopped namespace's Services are handed to the
// subscribers after the lock is released.
func (c *Caches) settle() error {
	want, version := []string{All}, uint64(0)
	if c.reach != nil {
		version = c.version()
		c.mu.Lock()
		current := c.settled && version <= c.applied
		whole := c.byNS[All]
		dwelling := whole != nil && time.Since(whole.joined) < c.allDwell
		most := c.maxNamespaces
		c.mu.Unlock()
		if current {
			return nil
		}
		want, version = c.reach()
		if len(want) > most || whole != nil && (len(want) > most/2 || dwelling) {
			want = []string{All}
		}
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
	if c.settled && version <= c.applied {
		return nil
	}
	wanted := make(map[string]struct{}, len(want))
	for _, ns := range want {
		wanted[ns] = struct{}{}
	}
	var joined, left []string
	for ns := range c.byNS {
		if _, ok := wanted[ns]; !ok {
			deletes = append(deletes, c.stopLocked(ns))
			left = append(left, cmpAll(ns))
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
		joined = append(joined, cmpAll(ns))
	}
	if c.reach != nil && len(joined)+len(left) > 0 {
		sort.Strings(left)
		c.log.Info("following the namespaces the scopes reach", "watching", len(c.byNS), "joined", joined, "left", left)
	}
	if err != nil {
		return err // the version is not applied: the next settle tries again
	}
	c.settled, c.applied = true, version
	c.checkLocked()
	return nil
}

// allDwell is how long a shard that watches every namespace with one cache
// keeps it at least: leaving it costs every Service's deletion, and a
// return the whole list again.
const allDwell = 5 * time.Minute

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
			c.log.Error(err, "the Service cache stopped", "namespace", ns)
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
	if err := n.cache.List(ctx, l); err != nil {
		c.log.Error(err, "listing the Service cache", "namespace", n.ns)
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
// (Get answers NotFound, and a read waiting for the cache to sync ends so),
// and it returns what tells each subscriber of Services of their deletion,
// so that the catalog forgets them. Until its Service informer synced, no
// read of the cache found a Service (a read waits for the sync), so the
// catalog holds none of them.
func (c *Caches) stopLocked(ns string) func() {
	n := c.byNS[ns]
	delete(c.byNS, ns)
	defer n.cancel()
	inf, err := n.cache.GetInformer(context.Background(), &corev1.Service{}, cache.BlockUntilSynced(false))
	if err != nil || !inf.HasSynced() {
		return func() {}
	}
	l := &corev1.ServiceList{}
	if err := n.cache.List(context.Background(), l); err != nil {
		c.log.Error(err, "listing the Service cache being stopped", "namespace", ns)
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

func (c *Caches) isReady() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// checkLocked closes the ready channel of each namespace listed and
// reconciled, and the caches' when every namespace is.
func (c *Caches) checkLocked() {
	all := c.settled
	for _, n := range c.byNS {
		if !n.listed || len(n.pending) > 0 {
			all = false
			continue
		}
		select {
		case <-n.ready:
		default:
			close(n.ready)
		}
	}
	if all && !c.isReady() {
		close(c.ready)
	}
}

// Done records that the Service was reconciled.
func (c *Caches) Done(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.byNS[key.Namespace]
	if n == nil {
		n = c.byNS[All]
	}
	switch {
	case n == nil:
	case !n.listed:
		n.done[key] = struct{}{}
	case len(n.pending) > 0:
		delete(n.pending, key)
		c.checkLocked()
	}
}

// Await waits until the caches of the namespaces to watch now are listed
// and every Service they listed is reconciled, however long that takes, as
// a start must (InitialSync): the catalog then holds every Service its
// scopes can select.
func (c *Caches) Await(ctx context.Context) error {
	select {
	case <-c.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := c.settle(); err != nil {
		return err
	}
	c.mu.Lock()
	ready := c.ready
	c.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Hold is what the snapshot builder calls before it versions changes: it
// brings the caches to the namespaces the catalog's scopes reach now, and
// waits until every namespace that joined is listed and its Services are
// in the catalog, so that a scope change and the Services it newly reaches
// are served in one version, as they are when every namespace is watched.
// A change of the reach meanwhile is followed, and held for, too. It waits
// for a namespace for MaxHold from when it joined at most, and MaxHold in
// all: past that, changes are versioned without waiting.
func (c *Caches) Hold(ctx context.Context) {
	select {
	case <-c.started:
	case <-ctx.Done():
		return
	}
	deadline := time.Now().Add(MaxHold)
	for {
		if err := c.settle(); err != nil {
			c.log.Error(err, "following the namespaces the scopes reach")
		}
		// The namespaces that joined less than MaxHold ago, with when
		// the hold for each ends.
		type joining struct {
			ready <-chan struct{}
			until time.Time
		}
		var wait []joining
		c.mu.Lock()
		applied := c.applied
		for _, n := range c.byNS {
			until := n.joined.Add(MaxHold)
			if deadline.Before(until) {
				until = deadline
			}
			if until.After(time.Now()) {
				wait = append(wait, joining{n.ready, until})
			}
		}
		c.mu.Unlock()
		for _, j := range wait {
			t := time.NewTimer(time.Until(j.until))
			select {
			case <-j.ready:
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				c.log.Info("versioning changes before every namespace the scopes reach is listed; their Services follow as they are", "listing", c.Listing())
			}
			t.Stop()
		}
		if c.reach == nil || c.version() == applied || !time.Now().Before(deadline) {
			return
		}
	}
}

// Listing names the namespaces whose Services are not all in the catalog
// yet, sorted (All as "*").
func (c *Caches) Listing() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for ns, n := range c.byNS {
		if !n.listed || len(n.pending) > 0 {
			out = append(out, cmpAll(ns))
		}
	}
	sort.Strings(out)
	return out
}

// Namespaces are the namespaces watched now, sorted ("*" for every one).
func (c *Caches) Namespaces() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.byNS))
	for ns := range c.byNS {
		out = append(out, cmpAll(ns))
	}
	sort.Strings(out)
	return out
}

func cmpAll(ns string) string {
	if ns == All {
		return "*"
	}
	return ns
}

// Get reads the object from its namespace's cache; an object of a
// namespace not watched, or that stops being watched meanwhile, is
// NotFound. A read waiting for a namespace's cache to sync ends when the
// namespace leaves.
func (c *Caches) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	n := c.cacheOf(key.Namespace)
	if n == nil {
		return apierrors.NewNotFound(resourceOf(obj), key.Name)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(n.ctx, cancel)()
	err := n.cache.Get(ctx, key, obj, opts...)
	if n.ctx.Err() != nil {
		return apierrors.NewNotFound(resourceOf(obj), key.Name)
	}
	return err
}

// List lists one namespace's objects (client.InNamespace), from its cache;
// a namespace not watched has none. Only the cache of every namespace lists
// them all.
func (c *Caches) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	n := c.cacheOf(lo.Namespace)
	if n == nil {
		if lo.Namespace == All {
			return fmt.Errorf("the Service caches list one namespace at a time; watched: %s", strings.Join(c.Namespaces(), ", "))
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(n.ctx, cancel)()
	err := n.cache.List(ctx, list, opts...)
	if n.ctx.Err() != nil {
		return fmt.Errorf("namespace %q is no longer watched", lo.Namespace)
	}
	return err
}

// Watches reports whether the Services of namespace ns are read: a
// reader that must tell a Service that does not exist from one of a
// namespace the caches do not follow yet (route status) asks it first.
func (c *Caches) Watches(ns string) bool { return c.cacheOf(ns) != nil }

// cacheOf is the cache that holds namespace ns, or nil.
func (c *Caches) cacheOf(ns string) *nsCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.byNS[All]; n != nil {
		return n
	}
	return c.byNS[ns]
}

func resourceOf(obj client.Object) schema.GroupResource {
	switch obj.(type) {
	case *corev1.Service:
		return corev1.Resource("services")
	case *discoveryv1.EndpointSlice:
		return discoveryv1.Resource("endpointslices")
	}
	return schema.GroupResource{}
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

// WaitListed waits until the caches of the namespaces to watch have synced
// (listed, not necessarily reconciled), the set having stayed the same
// meanwhile; false when ctx ended first. The benchmark's start phases use
// it: a shard learns its namespaces while its scopes are reconciled.
func (c *Caches) WaitListed(ctx context.Context) bool {
	select {
	case <-c.started:
	case <-ctx.Done():
		return false
	}
	for {
		if err := c.settle(); err != nil {
			return false
		}
		c.mu.Lock()
		applied := c.applied
		caches := make([]cache.Cache, 0, len(c.byNS))
		for _, n := range c.byNS {
			caches = append(caches, n.cache)
		}
		c.mu.Unlock()
		for _, cc := range caches {
			if !cc.WaitForCacheSync(ctx) {
				return false
			}
		}
		if c.reach == nil || c.version() == applied {
			return true
		}
	}
}
