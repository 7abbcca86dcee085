package replicafeedback

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Collector holds the other replicas' feedback, read from their ConfigMaps
// (each replica's manifest and parts, see parts.go) through a cache of the
// feedback namespace alone. It runs on every
// replica, so that a new leader starts with it.
type Collector struct {
	self   Replica
	log    logr.Logger
	cache  cache.Cache
	mu     sync.Mutex
	others map[string]*received
	// changed holds the scopes whose merged feedback may have changed.
	changed *keyset.Set
	now     func() time.Time
}

// received is what one replica wrote: its manifest, the parts held, and
// the last whole set of them, which is what counts. Expiry runs on this
// replica's clock, never on the writer's, so clock skew between nodes does
// not drop a live replica or keep a dead one.
type received struct {
	// manifest is the replica's manifest; nil until one is read.
	manifest *manifest
	// parts are the parts read, by number: what each ConfigMap holds
	// now, which may be newer than the manifest.
	parts map[int]readPart
	// view is the last set of parts that matched its manifest, in order;
	// nil before one (or after the report was found damaged).
	view []viewPart
	// seen is when the manifest was last read (or the first part, before
	// any manifest).
	seen time.Time
	// broken is since when the parts held have not matched the manifest
	// (zero while they do).
	broken time.Time
}

type readPart struct {
	digest string
	scopes map[model.Key]feedback.Summary
}

type viewPart struct {
	readPart
	failed string
}

// NewCollector reads the feedback ConfigMaps of self.Namespace, other than
// self's own, with mgr's configuration (with shards, those of self's shard
// only: another shard's replicas serve none of its scopes, and their
// failures are not its scopes'); it adds its cache and expiry to mgr.
func NewCollector(mgr manager.Manager, self Replica, log logr.Logger) (*Collector, error) {
	req, err := labels.NewRequirement(Label, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	selector := labels.NewSelector().Add(*req)
	if self.Shard != "" {
		shard, err := labels.NewRequirement(ShardLabel, selection.Equals, []string{self.Shard})
		if err != nil {
			return nil, err
		}
		selector = selector.Add(*shard)
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: scheme.Scheme, Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{self.Namespace: {}},
		ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: selector}},
	})
	if err != nil {
		return nil, fmt.Errorf("replica feedback cache: %w", err)
	}
	col := &Collector{self: self, log: log, cache: c, others: map[string]*received{}, changed: keyset.New(), now: time.Now}
	inf, err := c.GetInformer(context.Background(), &corev1.ConfigMap{})
	if err != nil {
		return nil, fmt.Errorf("replica feedback informer: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { col.observe(obj) },
		UpdateFunc: func(_, obj any) { col.observe(obj) },
		DeleteFunc: col.forget,
	}); err != nil {
		return nil, err
	}
	if err := mgr.Add(c); err != nil {
		return nil, err
	}
	return col, mgr.Add(col)
}

// Changes holds the scopes whose feedback from other replicas changed; the
// status writer takes them.
func (c *Collector) Changes() *keyset.Set { return c.changed }

// Get returns what the other live replicas report for a scope.
func (c *Collector) Get(key model.Key) []feedback.Summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []feedback.Summary
	for _, r := range c.others {
		if len(r.view) == 0 {
			continue
		}
		if s, ok := r.view[partOf(key, len(r.view))].scopes[key]; ok {
			out = append(out, s)
		}
	}
	return out
}

// Unreported says, per other replica whose feedback of the scope could not
// be written, why: its proxies of the scope are counted as that replica
// last reported them (or not at all), sorted by replica.
func (c *Collector) Unreported(key model.Key) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name, r := range c.others {
		if len(r.view) == 0 {
			continue
		}
		if failed := r.view[partOf(key, len(r.view))].failed; failed != "" {
			out = append(out, fmt.Sprintf("replica %s: %s", name, failed))
		}
	}
	slices.Sort(out)
	return out
}

// Replicas returns how many other replicas' reports are counted now.
func (c *Collector) Replicas() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.others {
		if r.view != nil {
			n++
		}
	}
	return n
}

func (c *Collector) observe(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	name := cm.Labels[Label]
	if name == "" || name == c.self.Name {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.others[name]
	if r == nil {
		r = &received{parts: map[int]readPart{}, seen: c.now()}
		c.others[name] = r
	}
	switch {
	case cm.Name == ConfigMapName(name):
		r.seen = c.now()
		m, err := decodeManifest(cm.Data[ManifestKey])
		if err != nil {
			c.damagedLocked(r, cm, err)
			return
		}
		r.manifest = m
	default:
		i, err := strconv.Atoi(cm.Labels[PartLabel])
		if err != nil || i < 0 || i >= maxParts || cm.Name != PartName(name, i) {
			return // not a part of this release's
		}
		scopes, d, err := decodePart(cm.BinaryData[PartKey])
		if err != nil {
			r.parts[i] = readPart{digest: "damaged"}
			c.damagedLocked(r, cm, err)
			return
		}
		r.parts[i] = readPart{digest: d, scopes: scopes}
	}
	c.assembleLocked(r)
}

// damagedLocked drops a replica's counts for a ConfigMap it cannot read:
// counting its old report would show proxies as they were, not as they
// are. What else it holds of the replica stays, for when the damaged
// ConfigMap is written again.
func (c *Collector) damagedLocked(r *received, cm *corev1.ConfigMap, err error) {
	c.log.Error(err, "a replica's feedback ConfigMap cannot be read; its proxies are left out of status", "configmap", client.ObjectKeyFromObject(cm))
	if cm.Name == ConfigMapName(cm.Labels[Label]) {
		r.manifest = nil
	}
	c.markLocked(r.view)
	r.view = nil
}

// assembleLocked makes the parts held the replica's view if they are the
// ones its manifest names, and marks the scopes of the parts that changed.
func (c *Collector) assembleLocked(r *received) {
	if r.manifest == nil {
		return
	}
	view := make([]viewPart, len(r.manifest.Parts))
	for i, m := range r.manifest.Parts {
		view[i].failed = m.Failed
		if m.Digest == "" {
			continue // never written: it holds no scope
		}
		p, ok := r.parts[i]
		if !ok || p.digest != m.Digest {
			// Half written: the last whole set stands.
			if r.broken.IsZero() {
				r.broken = c.now()
			}
			return
		}
		view[i].readPart = p
	}
	r.broken = time.Time{}
	if len(view) != len(r.view) {
		c.markLocked(r.view)
		c.markLocked(view)
	} else {
		for i := range view {
			if view[i].digest != r.view[i].digest || view[i].failed != r.view[i].failed {
				c.markLocked(r.view[i : i+1])
				c.markLocked(view[i : i+1])
			}
		}
	}
	r.view = view
}

func (c *Collector) forget(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	name := cm.Labels[Label]
	if cm.Name == ConfigMapName(name) {
		c.drop(name)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.others[name]; r != nil {
		if i, err := strconv.Atoi(cm.Labels[PartLabel]); err == nil {
			delete(r.parts, i)
			c.assembleLocked(r)
		}
	}
}

func (c *Collector) drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.others[name]; old != nil {
		c.markLocked(old.view)
		delete(c.others, name)
	}
}

func (c *Collector) markLocked(view []viewPart) {
	for i := range view {
		for key := range view[i].scopes {
			c.changed.Add(key)
		}
	}
}

// NeedLeaderElection is false: every replica collects.
func (*Collector) NeedLeaderElection() bool { return false }

// Start drops, once a second, the replicas whose reports were not renewed
// within Expiry.
func (c *Collector) Start(ctx context.Context) error {
	expiry := c.self.Expiry
	if expiry <= 0 {
		expiry = DefaultExpiry
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			c.expire(expiry)
		}
	}
}

// expire drops the counts of the replicas whose manifest was not renewed
// within expiry, and of those whose parts have not matched their manifest
// for as long (a part deleted, or never written after its manifest).
func (c *Collector) expire(expiry time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for name, r := range c.others {
		if now.Sub(r.seen) >= expiry {
			if r.view != nil {
				c.log.Info("a replica's feedback expired: its proxies leave the counts", "replica", name, "lastSeen", r.seen)
			}
			// The parts stay, while their ConfigMaps do: a manifest
			// written again names them, and parts that did not change
			// are not delivered again.
			c.markLocked(r.view)
			r.view, r.manifest = nil, nil
			if len(r.parts) == 0 {
				delete(c.others, name)
			}
			continue
		}
		if !r.broken.IsZero() && now.Sub(r.broken) >= expiry && r.view != nil {
			c.log.Info("a replica's feedback parts have not matched its manifest for the expiry: its proxies leave the counts until they do", "replica", name, "since", r.broken)
			c.markLocked(r.view)
			r.view = nil
		}
	}
}
