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
	"slices"
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
	return &Caches{newCache: newCache, log: log, started: make(chan struct{}), byNS: map[string]*nsCache{},
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
// set until ctx ends, which stops every cache.
func (c *Caches) Start(ctx context.Context) error {
	c.ctx = ctx
	close(c.started)
	if err := c.settle(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
			if err := c.settle(); err != nil {
				return err
			}
		}
	}
}

// NeedLeaderElection is false: every replica reads its Services.
func (*Caches) NeedLeaderElection() bool { return false }

// settle starts and stops caches so that they are those of the namespaces
// to watch now, if these may have changed since the last time.
func (c *Caches) settle() error {
	want, version := []string{All}, uint64(0)
	if c.reach != nil {
		c.mu.Lock()
		current := c.settled && c.version() <= c.applied
		c.mu.Unlock()
		if current {
			return nil
		}
		want, version = c.reach()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Versions only grow: of two settles at once, the older set must not
	// replace the newer.
	if c.settled && version <= c.applied {
		return nil
	}
	c.settled, c.applied = true, version
	for ns := range c.byNS {
		if !slices.Contains(want, ns) {
			c.stopLocked(ns)
		}
	}
	for _, ns := range want {
		if c.byNS[ns] == nil {
			if err := c.startLocked(ns); err != nil {
				return err
			}
		}
	}
	c.checkLocked()
	return nil
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
	n := &nsCache{ns: ns, joined: time.Now(), cache: cc, cancel: cancel, regs: map[*subscription][]toolscache.ResourceEventHandlerRegistration{},
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
// (Get answers NotFound), and each subscriber of Services gets their
// deletion, so that the catalog forgets them.
func (c *Caches) stopLocked(ns string) {
	n := c.byNS[ns]
	delete(c.byNS, ns)
	defer n.cancel()
	if !n.listed {
		return // nothing of it was reconciled from a complete list
	}
	l := &corev1.ServiceList{}
	if err := n.cache.List(context.Background(), l); err != nil {
		c.log.Error(err, "listing the Service cache being stopped", "namespace", ns)
		return
	}
	for s := range c.subs {
		if _, ok := s.obj.(*corev1.Service); !ok {
			continue
		}
		for i := range l.Items {
			s.handler.OnDelete(&l.Items[i])
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
// It waits for a namespace for MaxHold from when it joined at most: past
// that, changes are versioned without waiting for it.
func (c *Caches) Hold(ctx context.Context) {
	select {
	case <-c.started:
	case <-ctx.Done():
		return
	}
	if err := c.settle(); err != nil {
		c.log.Error(err, "following the namespaces the scopes reach")
	}
	// The namespaces that joined less than MaxHold ago and are not
	// listed yet, with when the hold for each ends.
	type joining struct {
		ready <-chan struct{}
		until time.Time
	}
	var wait []joining
	now := time.Now()
	c.mu.Lock()
	for _, n := range c.byNS {
		if until := n.joined.Add(MaxHold); until.After(now) {
			wait = append(wait, joining{n.ready, until})
		}
	}
	c.mu.Unlock()
	for _, j := range wait {
		t := time.NewTimer(time.Until(j.until))
		select {
		case <-j.ready:
		case <-ctx.Done():
		case <-t.C:
			c.log.Info("versioning changes before every namespace the scopes reach is listed; their Services follow as they are", "listing", c.Listing())
		}
		t.Stop()
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
// namespace not watched is NotFound.
func (c *Caches) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	n := c.cacheOf(key.Namespace)
	if n == nil {
		return apierrors.NewNotFound(resourceOf(obj), key.Name)
	}
	return n.Get(ctx, key, obj, opts...)
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
	return n.List(ctx, list, opts...)
}

// cacheOf is the cache that holds namespace ns, or nil.
func (c *Caches) cacheOf(ns string) cache.Cache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.byNS[All]; n != nil {
		return n.cache
	}
	if n := c.byNS[ns]; n != nil {
		return n.cache
	}
	return nil
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
