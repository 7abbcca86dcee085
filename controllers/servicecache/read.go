package servicecache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// errNotWatched marks the NotFound of an object of a namespace no cache
// follows.
var errNotWatched = errors.New("its namespace is not watched")

// NotWatched reports whether err is Get's NotFound for a namespace no
// cache follows: the object is not read, which says nothing of what a
// cache of its namespace lists (see Done).
func NotWatched(err error) bool { return errors.Is(err, errNotWatched) }

// Get reads the object from its namespace's cache. An object of a
// namespace not watched is NotFound (and NotWatched). A read of a cache
// that is stopped meanwhile (its namespace left, or its cache was
// replaced) is made again from the namespace's cache now, if it has one.
func (c *Caches) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	for {
		n := c.cacheOf(key.Namespace)
		if n == nil {
			return fmt.Errorf("%w: %w", apierrors.NewNotFound(resourceOf(obj), key.Name), errNotWatched)
		}
		err := n.read(ctx, func(ctx context.Context) error { return n.cache.Get(ctx, key, obj, opts...) })
		if n.ctx.Err() == nil || ctx.Err() != nil {
			return err
		}
	}
}

// List lists one namespace's objects (client.InNamespace) from its cache,
// as Get reads them; a namespace not watched has none. Only the cache of
// every namespace lists them all.
func (c *Caches) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	for {
		n := c.cacheOf(lo.Namespace)
		if n == nil {
			if lo.Namespace == All {
				return fmt.Errorf("the Service caches list one namespace at a time; watched: %s", strings.Join(c.Namespaces(), ", "))
			}
			return nil
		}
		err := n.read(ctx, func(ctx context.Context) error { return n.cache.List(ctx, list, opts...) })
		if n.ctx.Err() == nil || ctx.Err() != nil {
			return err
		}
	}
}

// read runs f on the cache with a context that also ends when the cache
// is stopped: a read waiting for the cache to sync must not outlive it. A
// cache built a moment ago may not have started yet: f is tried again
// then.
func (n *nsCache) read(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(n.ctx, cancel)()
	for {
		err := f(ctx)
		var notStarted *cache.ErrCacheNotStarted
		if !errors.As(err, &notStarted) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Watches reports whether the Services of namespace ns are read: a
// reader that must tell a Service that does not exist from one of a
// namespace the caches do not follow yet (route status) asks it first.
func (c *Caches) Watches(ns string) bool { return c.cacheOf(ns) != nil }

// cacheOf is the cache that holds namespace ns, or nil.
func (c *Caches) cacheOf(ns string) *nsCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cacheOfLocked(ns)
}

func (c *Caches) cacheOfLocked(ns string) *nsCache {
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
