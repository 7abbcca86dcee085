package servicecache

import (
	"context"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// MaxHold bounds how long Hold keeps the builder waiting for a namespace
// that joined to be listed: a namespace the API server does not list (an
// outage, a missing permission) must not hold every other change.
const MaxHold = 10 * time.Second

// Done records that the Service was reconciled, from the cache of its
// namespace (a read that was NotWatched is no such reconcile).
func (c *Caches) Done(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.cacheOfLocked(key.Namespace)
	switch {
	case n == nil:
	case !n.listed:
		n.done[key] = struct{}{}
	case len(n.pending) > 0:
		delete(n.pending, key)
		if len(n.pending) == 0 {
			c.checkLocked()
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

// Await waits until the caches of the namespaces to watch now are listed
// and every Service they listed is reconciled, however long that takes, as
// a start must (InitialSync): the catalog then holds every Service its
// scopes can select. A cache that cannot be built is tried again every
// second: it returns an error only when ctx ends.
func (c *Caches) Await(ctx context.Context) error {
	select {
	case <-c.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		err := c.settle()
		if err == nil {
			break
		}
		c.log.Error(err, "following the namespaces the scopes reach; trying again in a second")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
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
		err := c.settle()
		if err != nil {
			c.log.Error(err, "following the namespaces the scopes reach")
		}
		// The namespaces that joined less than MaxHold ago, with when
		// the hold for each ends.
		type joining struct {
			n     *nsCache
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
				wait = append(wait, joining{n, until})
			}
		}
		c.mu.Unlock()
		for _, j := range wait {
			t := time.NewTimer(time.Until(j.until))
			select {
			case <-j.n.ready:
			case <-j.n.ctx.Done(): // it left, or was replaced, meanwhile
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				c.log.Info("versioning changes before every namespace the scopes reach is listed; their Services follow as they are", "listing", c.Listing())
			}
			t.Stop()
		}
		// A failed settle is not tried again here: Start does, and each
		// try recomputes the reach.
		if err != nil || c.reach == nil || c.version() == applied || !time.Now().Before(deadline) {
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
			out = append(out, nameOf(ns))
		}
	}
	sort.Strings(out)
	return out
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
		_ = c.settle() // Start tries again; this loop looks again
		c.mu.Lock()
		applied := c.applied
		caches := make([]*nsCache, 0, len(c.byNS))
		for _, n := range c.byNS {
			caches = append(caches, n)
		}
		c.mu.Unlock()
		kept := true
		for _, n := range caches {
			wctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(n.ctx, cancel)
			n.cache.WaitForCacheSync(wctx)
			stop()
			cancel()
			if ctx.Err() != nil {
				return false
			}
			kept = kept && n.ctx.Err() == nil
		}
		if kept && (c.reach == nil || c.version() == applied) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}
