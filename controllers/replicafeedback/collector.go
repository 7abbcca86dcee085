package replicafeedback

import (
	"context"
	"fmt"
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
// through a cache of the feedback namespace alone. It runs on every
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

// received is one replica's last report and when it was seen: expiry runs
// on this replica's clock, never on the writer's, so clock skew between
// nodes does not drop a live replica or keep a dead one.
type received struct {
	scopes map[model.Key]feedback.Summary
	seen   time.Time
}

// NewCollector reads the feedback ConfigMaps of self.Namespace, other than
// self's own, with mgr's configuration; it adds its cache and expiry to
// mgr.
func NewCollector(mgr manager.Manager, self Replica, log logr.Logger) (*Collector, error) {
	req, err := labels.NewRequirement(Label, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: scheme.Scheme, Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{self.Namespace: {}},
		ByObject:          map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: labels.NewSelector().Add(*req)}},
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
		if s, ok := r.scopes[key]; ok {
			out = append(out, s)
		}
	}
	return out
}

// Replicas returns how many other replicas' reports are counted now.
func (c *Collector) Replicas() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.others)
}

func (c *Collector) observe(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	name := cm.Labels[Label]
	if name == "" || name == c.self.Name || cm.Name != ConfigMapName(name) {
		return
	}
	scopes, err := decode(cm.Data[DataKey])
	if err != nil {
		// Its old report is dropped too: counting it would show proxies
		// as they were, not as they are.
		c.log.Error(err, "a replica's feedback ConfigMap cannot be read; its proxies are left out of status", "configmap", client.ObjectKeyFromObject(cm))
		c.drop(name)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.others[name]; old != nil {
		c.markLocked(old.scopes)
	}
	c.others[name] = &received{scopes: scopes, seen: c.now()}
	c.markLocked(scopes)
}

func (c *Collector) forget(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		c.drop(cm.Labels[Label])
	}
}

func (c *Collector) drop(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.others[name]; old != nil {
		c.markLocked(old.scopes)
		delete(c.others, name)
	}
}

func (c *Collector) markLocked(scopes map[model.Key]feedback.Summary) {
	for key := range scopes {
		c.changed.Add(key)
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

func (c *Collector) expire(expiry time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for name, r := range c.others {
		if now.Sub(r.seen) >= expiry {
			c.log.Info("a replica's feedback expired: its proxies leave the counts", "replica", name, "lastSeen", r.seen)
			c.markLocked(r.scopes)
			delete(c.others, name)
		}
	}
}
