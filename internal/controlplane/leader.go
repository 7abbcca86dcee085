package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	crleader "sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// LeaseName is the name of the leader election Lease.
const LeaseName = "scopeplane.xds.scopeplane.dev"

// LeaderElection configures who writes to the API among replicas.
type LeaderElection struct {
	// Enabled elects a leader; otherwise this replica always writes.
	Enabled bool
	// Namespace holds the Lease (the pod's namespace when empty); ID names
	// it (LeaseName when empty).
	Namespace, ID string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's
	// timings; zero takes controller-runtime's defaults (15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// elector runs the leader-only work (whatever writes to the API) on the
// replica that holds the Lease, on the manager that every replica runs.
//
// controller-runtime's own leader election ends the manager when the lease
// is lost (its Start returns an error and the process exits): every ADS
// stream of the replica would be reset, although serving needs no lease.
// This runs client-go's elector as a Runnable of a manager without leader
// election instead: a lost lease stops the term's work, and the replica
// campaigns again, still serving.
type elector struct {
	mgr  manager.Manager
	le   LeaderElection
	lock resourcelock.Interface
	// setup registers one term's leader-only controllers and runnables on
	// the manager it is given; they are built anew for every term, since
	// a controller starts once.
	setup   func(manager.Manager) error
	leading atomic.Bool
	log     logr.Logger
}

func newElector(mgr manager.Manager, le LeaderElection, setup func(manager.Manager) error) (*elector, error) {
	e := &elector{mgr: mgr, le: le, setup: setup, log: ctrl.Log.WithName("leader")}
	if e.le.ID == "" {
		e.le.ID = LeaseName
	}
	e.le.LeaseDuration = cmp.Or(e.le.LeaseDuration, 15*time.Second)
	e.le.RenewDeadline = cmp.Or(e.le.RenewDeadline, 10*time.Second)
	e.le.RetryPeriod = cmp.Or(e.le.RetryPeriod, 2*time.Second)
	if !le.Enabled {
		return e, nil
	}
	var err error
	e.lock, err = crleader.NewResourceLock(mgr.GetConfig(), mgr, crleader.Options{
		LeaderElection: true, LeaderElectionID: e.le.ID, LeaderElectionNamespace: e.le.Namespace, RenewDeadline: e.le.RenewDeadline,
	})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	// The timings are checked now, so that bad ones fail the start.
	if _, err := e.leaderElector(leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}}); err != nil {
		return nil, err
	}
	return e, nil
}

// leaderElector is client-go's elector over the Lease, calling callbacks.
func (e *elector) leaderElector(callbacks leaderelection.LeaderCallbacks) (*leaderelection.LeaderElector, error) {
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: e.lock, Name: e.le.ID, ReleaseOnCancel: true,
		LeaseDuration: e.le.LeaseDuration, RenewDeadline: e.le.RenewDeadline, RetryPeriod: e.le.RetryPeriod,
		Callbacks: callbacks,
	})
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	return le, nil
}

// leaseNamespace is the namespace of the Lease this replica campaigns for
// (the pod's, unless configured).
func (e *elector) leaseNamespace() string {
	ns, _, _ := strings.Cut(e.lock.Describe(), "/")
	return ns
}

// Leading reports whether this replica runs the leader-only work now.
func (e *elector) Leading() bool { return e.leading.Load() }

// Start campaigns until ctx ends; without leader election it runs one term
// for as long as ctx lasts.
func (e *elector) Start(ctx context.Context) error {
	if e.lock == nil {
		return e.term(ctx)
	}
	for ctx.Err() == nil {
		if err := e.campaign(ctx); err != nil {
			return err
		}
	}
	return nil
}

// NeedLeaderElection is false: the manager runs no election of its own.
func (*elector) NeedLeaderElection() bool { return false }

// campaign waits for the Lease, leads until the lease is lost or ctx ends,
// and returns once the term's work has stopped. The Lease is given up
// (ReleaseOnCancel) only after the work stopped on shutdown, so the next
// leader takes over at once without two writers overlapping.
func (e *elector) campaign(ctx context.Context) error {
	// The election's context ends when this replica gives the Lease up:
	// after the term's work stopped, never with ctx itself.
	elect, release := context.WithCancel(context.WithoutCancel(ctx))
	defer release()
	var (
		mu       sync.Mutex
		stopping bool
		ended    chan struct{} // closed when the term's work returned
		failed   atomic.Bool
	)
	waitWork := func() {
		mu.Lock()
		stopping = true
		ch := ended
		mu.Unlock()
		if ch != nil {
			<-ch
		}
	}
	le, err := e.leaderElector(leaderelection.LeaderCallbacks{
		OnStartedLeading: func(leading context.Context) {
			mu.Lock()
			if stopping {
				mu.Unlock()
				return
			}
			ended = make(chan struct{})
			mu.Unlock()
			defer close(ended)
			work, cancel := context.WithCancel(leading)
			defer cancel()
			defer context.AfterFunc(ctx, cancel)()
			if err := e.term(work); err != nil {
				e.log.Error(err, "the leader-only work failed; giving the Lease up")
				failed.Store(true)
				release()
			}
		},
		OnStoppedLeading: func() {},
	})
	if err != nil {
		return err
	}
	campaignDone := make(chan struct{})
	defer close(campaignDone)
	go func() {
		select {
		case <-ctx.Done():
			waitWork()
			release()
		case <-campaignDone:
		}
	}()
	le.Run(elect)
	waitWork()
	if failed.Load() && ctx.Err() == nil {
		// Let another replica try before this one campaigns again.
		select {
		case <-ctx.Done():
		case <-time.After(e.le.LeaseDuration):
		}
	} else if ctx.Err() == nil {
		e.log.Info("lost the Lease; the leader-only work stopped, campaigning again", "lease", e.lock.Describe())
	}
	return nil
}

// term runs the leader-only work until ctx ends, and returns the first
// error a part of it ended with before then.
func (e *elector) term(ctx context.Context) error {
	tm := &termManager{Manager: e.mgr, cache: &termCache{Cache: e.mgr.GetCache()}}
	// Whatever the setup got far enough to register goes when the term ends.
	defer tm.cache.removeHandlers()
	if err := e.setup(tm); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	e.leading.Store(true)
	defer e.leading.Store(false)
	// A condition gauge a replica no longer updates must not be scraped
	// as if current: only the leader exports it.
	defer metrics.ScopeCondition.Reset()
	errs := make(chan error, len(tm.runnables))
	for _, r := range tm.runnables {
		go func() { errs <- r.Start(ctx) }()
	}
	var first error
	for range tm.runnables {
		if err := <-errs; err != nil && first == nil && !errors.Is(err, context.Canceled) {
			first = err
			cancel()
		}
	}
	return first
}

// termManager is the manager as one term's leader-only work sees it: what
// is added to it is kept for the term to run, not run by the manager; its
// controllers skip the check that names are unique in the process, since
// every term builds them again under the same names; and its cache is
// termCache.
type termManager struct {
	manager.Manager
	cache     *termCache
	runnables []manager.Runnable
}

func (m *termManager) GetCache() cache.Cache { return m.cache }

func (m *termManager) Add(r manager.Runnable) error {
	m.runnables = append(m.runnables, r)
	return nil
}

func (m *termManager) GetControllerOptions() config.Controller {
	o := m.Manager.GetControllerOptions()
	o.SkipNameValidation = ptr.To(true)
	return o
}

// termCache is the manager's cache as one term's controllers see it: the
// event handlers they add to its shared informers are removed when the
// term ends (controller-runtime leaves them registered when a controller
// stops), so that terms do not pile handlers up on the informers.
type termCache struct {
	cache.Cache
	mu       sync.Mutex
	handlers []termHandler
	ended    bool
}

type termHandler struct {
	informer cache.Informer
	reg      toolscache.ResourceEventHandlerRegistration
}

func (c *termCache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	i, err := c.Cache.GetInformer(ctx, obj, opts...)
	if err != nil {
		return nil, err
	}
	return &termInformer{Informer: i, cache: c}, nil
}

func (c *termCache) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	i, err := c.Cache.GetInformerForKind(ctx, gvk, opts...)
	if err != nil {
		return nil, err
	}
	return &termInformer{Informer: i, cache: c}, nil
}

func (c *termCache) keep(i cache.Informer, reg toolscache.ResourceEventHandlerRegistration, err error) (toolscache.ResourceEventHandlerRegistration, error) {
	if err != nil {
		return reg, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := termHandler{i, reg}
	if c.ended {
		// A source that was still starting when the term ended.
		h.remove()
	} else {
		c.handlers = append(c.handlers, h)
	}
	return reg, nil
}

// removeHandlers removes every handler added through c, and those added
// after.
func (c *termCache) removeHandlers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.handlers {
		h.remove()
	}
	c.handlers, c.ended = nil, true
}

func (h termHandler) remove() {
	if err := h.informer.RemoveEventHandler(h.reg); err != nil {
		ctrl.Log.WithName("leader").Error(err, "removing a stopped controller's event handler")
	}
}

// termInformer records the handlers added to a shared informer in a term.
type termInformer struct {
	cache.Informer
	cache *termCache
}

func (i *termInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandler(h)
	return i.cache.keep(i.Informer, reg, err)
}

func (i *termInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, resync time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandlerWithResyncPeriod(h, resync)
	return i.cache.keep(i.Informer, reg, err)
}

func (i *termInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandlerWithOptions(h, o)
	return i.cache.keep(i.Informer, reg, err)
}
