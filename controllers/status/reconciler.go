// Package status writes each ProxyScope's status. It does not compute
// anything the pipeline already knows: the snapshot store keeps, with each
// scope's served state, the record of what its spec resolved to (package
// catalog's Resolution), and the feedback tracker what the proxies said;
// the conditions are pure functions joining the two (conditions.go).
//
// It runs on the leader only, so replicas never fight over status; every
// replica still serves xDS. The leader counts its own proxies from its
// tracker and the other replicas' from what they publish (package
// replicafeedback).
package status

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/controllers/shardwatch"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Reconciler writes a ProxyScope's status from the store's record of the
// scope and its proxies' feedback, patching only when it changed.
type Reconciler struct {
	Client   client.Client
	Store    *snapshot.Store
	Feedback *feedback.Tracker
	// Replicas is the other replicas' feedback; nil when this replica
	// serves every proxy (no leader election).
	Replicas Replicas
	// Bootstrap says which scopes' bootstrap ConfigMaps cannot be written.
	Bootstrap *bootstrapconfig.Conflicts
	// NoBootstrapConfigMaps says the control plane writes no bootstrap
	// ConfigMaps (--bootstrap-configmaps=false), so the status names none.
	NoBootstrapConfigMaps bool
	// BootstrapNamespaces, when not empty, are the only namespaces whose
	// scopes get a bootstrap ConfigMap; the status of the others names none.
	BootstrapNamespaces []string
	Recorder            events.EventRecorder
	// Window coalesces bursts of changes into one write per scope.
	Window time.Duration
	// Writes, when set, paces the status patches: each waits for a token
	// first, so that a new leader with thousands of scopes to write does
	// not flood the API server, and the rate is one the operator chose
	// (NewWriteLimiter).
	Writes *rate.Limiter
	// Workers is how many scopes are reconciled at once (Workers(rate)
	// when zero): enough that the write limiter, not the API server's
	// round trip, bounds the rate.
	Workers int

	// Shards is this replica's shard: the leader of each shard writes the
	// status of its shard's scopes only, the scopes its store holds.
	Shards shard.Shards

	// Built, when set, is closed once the pipeline's first build is done:
	// no status is written before it, since every scope's would say
	// SnapshotNotBuilt and be written again moments later (a leader's
	// start would write each scope twice).
	Built <-chan struct{}

	// written holds, per scope (by UID), the status this leader last
	// patched, until the cache shows that write (see onServer).
	written sync.Map
	// costWritten holds, per scope (by UID), when this leader last wrote
	// a change of its status.cost (see costPace).
	costWritten sync.Map
	// leading is when this leader began writing statuses (the first
	// reconcile after Built), set once by began.
	leading time.Time
	began   sync.Once
}

// writtenStatus is a status patched, and the resource version it made.
type writtenStatus struct {
	name            types.NamespacedName
	resourceVersion string
	status          *xdsv1alpha1.ProxyScopeStatus
}

// onServer makes ps, read from the cache, carry the status the API server
// holds: the one this leader patched last, while the cache has not caught
// up with that write. Only the shard's leader writes status, so the server
// holds its last write. Compared with the cache's older copy instead, a
// status changed and changed back before the cache caught up (0 proxies
// connected, then every proxy again, while they reconnect to a new
// leader) would look unchanged, and the server keep the one in between.
// The one other writer is shard 0's leader marking the scope ShardAbsent
// (package shardwatch), over a status it read: a mark in the cache is on
// the server, and is what to compare with.
func (r *Reconciler) onServer(ps *xdsv1alpha1.ProxyScope) {
	v, ok := r.written.Load(ps.UID)
	if !ok {
		return
	}
	w := v.(writtenStatus)
	if ps.ResourceVersion == w.resourceVersion || shardwatch.Marked(ps) {
		r.written.Delete(ps.UID) // the cache has caught up, or holds a mark
		return
	}
	w.status.DeepCopyInto(&ps.Status)
}

// Default status write pace: with 10,000 scopes every status is written
// within (10,000 - burst) / rate = 38 s of a leader's start, inside a
// minute with room for the first build and a slow API server, while a
// burst of edits of a few hundred scopes is written at once.
const (
	DefaultWritesPerSecond = 250
	DefaultWritesBurst     = 500
)

// NewWriteLimiter is the status write pace: perSecond patches a second,
// burst at once. It refuses a rate or burst below what lets any write
// through.
func NewWriteLimiter(perSecond float64, burst int) (*rate.Limiter, error) {
	if !(perSecond > 0) || math.IsInf(perSecond, 1) {
		return nil, fmt.Errorf("status writes per second %v: it must be a positive number", perSecond)
	}
	if burst < 1 {
		return nil, fmt.Errorf("status writes burst %d: it must be at least 1", burst)
	}
	return rate.NewLimiter(rate.Limit(perSecond), burst), nil
}

// writesPerWorker is the status patches one worker is counted on for per
// second: a 200 ms round trip (computing the status, the patch, the API
// server's answer), what a start of 10,000 scopes and their proxies made
// the test machine's API server take, so that a loaded API server still
// lets the limiter bound the rate. Counted on 50 ms, 13 workers brought
// 10,000 statuses current 153.5 s after the start (68 writes/s); 50
// workers, 117.6 s (90/s), on the same machine and load (bench-world,
// tenants, S=10,000).
const writesPerWorker = 5

// Workers is the number of status workers that sustains perSecond writes
// with a 200 ms round trip each: at least 2, at most 256.
func Workers(perSecond float64) int {
	return int(min(max(math.Ceil(perSecond/writesPerWorker), 2), 256))
}

// Replicas reports what the proxies of the other replicas said.
type Replicas interface {
	// Get returns each other replica's Summary of a scope.
	Get(model.Key) []feedback.Summary
	// Changes holds the scopes whose reports changed.
	Changes() *keyset.Set
	// Unreported says, per other replica that could not write its
	// feedback of a scope, why.
	Unreported(model.Key) []string
}

// Reconcile computes the scope's status and patches it when it changed.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if !r.Shards.Owns(model.Key{Namespace: req.Namespace, Name: req.Name}) {
		return ctrl.Result{}, nil
	}
	if r.Built != nil {
		select {
		case <-r.Built:
		case <-ctx.Done():
			return ctrl.Result{}, nil
		}
	}
	r.began.Do(func() { r.leading = time.Now() })
	ps := &xdsv1alpha1.ProxyScope{}
	if err := r.Client.Get(ctx, req.NamespacedName, ps); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			metrics.ForgetScope(req.String())
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.onServer(ps)
	next, recheck := r.compute(ps)
	if equality.Semantic.DeepEqual(ps.Status, next) {
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	if r.Writes != nil {
		if err := r.Writes.Wait(ctx); err != nil {
			return ctrl.Result{}, fmt.Errorf("waiting to write the status of ProxyScope %s: %w", req, err)
		}
		// The wait can be long (a new leader writing thousands of
		// scopes): what is written is what is true after it.
		if err := r.Client.Get(ctx, req.NamespacedName, ps); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		r.onServer(ps)
		if next, recheck = r.compute(ps); equality.Semantic.DeepEqual(ps.Status, next) {
			return ctrl.Result{RequeueAfter: recheck}, nil
		}
	}
	before := ps.DeepCopy()
	ps.Status = next
	if err := r.Client.Status().Patch(ctx, ps, client.MergeFrom(before)); err != nil {
		// The controller logs the error and retries with backoff
		// (RetryLimiter); a change of the scope meanwhile retries it
		// at once.
		metrics.StatusWriteFailures.WithLabelValues(metrics.Scope(req.String())).Inc()
		return ctrl.Result{}, fmt.Errorf("patching the status of ProxyScope %s: %w", req, err)
	}
	r.written.Store(ps.UID, writtenStatus{name: req.NamespacedName, resourceVersion: ps.ResourceVersion, status: ps.Status.DeepCopy()})
	if !equality.Semantic.DeepEqual(before.Status.Cost, ps.Status.Cost) {
		r.costWritten.Store(ps.UID, costWrite{name: req.NamespacedName, at: time.Now()})
	}
	r.recordTransitions(ps, before.Status.Conditions)
	r.recordAdvice(ps, before.Status.Cost)
	return ctrl.Result{RequeueAfter: recheck}, nil
}

// forget drops what was written for a deleted scope. Entries are by UID,
// which the deleted object no longer gives: the deleted scope's are found
// by name (written holds at most one entry per scope, and mostly only
// writes the cache has not shown yet).
func (r *Reconciler) forget(name types.NamespacedName) {
	r.written.Range(func(uid, v any) bool {
		if w := v.(writtenStatus); w.name == name {
			r.written.Delete(uid)
		}
		return true
	})
	r.costWritten.Range(func(uid, v any) bool {
		if w := v.(costWrite); w.name == name {
			r.costWritten.Delete(uid)
		}
		return true
	})
}

// costWrite is when a scope's status.cost was last written.
type costWrite struct {
	name types.NamespacedName
	at   time.Time
}

// compute is the scope's status now, and when to compute it again; it
// sets the condition metrics.
func (r *Reconciler) compute(ps *xdsv1alpha1.ProxyScope) (xdsv1alpha1.ProxyScopeStatus, time.Duration) {
	next, recheck := compute(&ps.Status, r.inputs(ps))
	for _, c := range next.Conditions {
		v := 0.0
		if c.Status == metav1.ConditionTrue {
			v = 1
		}
		// Degraded and Stalled are healthy False, the others True.
		abnormalTrue := c.Type == xdsv1alpha1.ConditionDegraded || c.Type == xdsv1alpha1.ConditionStalled
		metrics.SetCondition(client.ObjectKeyFromObject(ps).String(), c.Type, v, (c.Status == metav1.ConditionTrue) != abnormalTrue)
	}
	return next, recheck
}

// inputs reads what the pipeline serves for the scope and what its proxies said.
func (r *Reconciler) inputs(ps *xdsv1alpha1.ProxyScope) *Inputs {
	key := model.Key{Namespace: ps.Namespace, Name: ps.Name}
	in := &Inputs{Namespace: ps.Namespace, Name: ps.Name, Generation: ps.Generation, Protocol: convert.Protocol(ps.Spec.Protocol),
		Mode: model.ListenerMode(ps.Spec.Listener.Mode), Now: time.Now()}
	if sc := r.Store.Get(key); sc != nil {
		sc.Read(func(v snapshot.View) {
			in.Built, in.Resolution, in.Version, in.RevTime = true, v.Resolution(), v.Version(), v.RevTime()
			if spec := v.Spec(); spec != nil {
				in.Transition = spec.Transition
			}
		})
	}
	in.Feedback = r.Feedback.Summary(key)
	in.CostWritten, in.Leading = r.leading, r.leading
	if v, ok := r.costWritten.Load(ps.UID); ok {
		in.CostWritten = v.(costWrite).at
	}
	if r.Replicas != nil {
		in.Feedback = feedback.Merge(append(r.Replicas.Get(key), in.Feedback)...)
		in.Unreported = r.Replicas.Unreported(key)
	}
	in.BootstrapConflict = r.Bootstrap.Get(key)
	in.NoBootstrapConfigMap = r.NoBootstrapConfigMaps ||
		len(r.BootstrapNamespaces) > 0 && !slices.Contains(r.BootstrapNamespaces, key.Namespace)
	if sc := r.Store.Get(key); sc != nil && in.Feedback.Cost.Pushes > 0 && !in.Feedback.Usage.All {
		sc.Read(func(v snapshot.View) { in.Footprint = footprint(v) })
	}
	return in
}

// footprint sums, per Service, the resources it holds in the snapshot.
func footprint(v snapshot.View) map[model.Key]Footprint {
	out := map[model.Key]Footprint{}
	for _, t := range xdstype.All() {
		v.All(t, func(r *snapshot.Resource) {
			if svc, ok := r.Service(); ok {
				f := out[svc]
				f.Resources++
				f.Bytes += r.Size
				out[svc] = f
			}
		})
	}
	return out
}

// recordTransitions emits an Event for every condition that changed status
// or reason, except the Synced/Pending cycle every push goes through.
func (r *Reconciler) recordTransitions(ps *xdsv1alpha1.ProxyScope, before []metav1.Condition) {
	for _, c := range ps.Status.Conditions {
		old := meta.FindStatusCondition(before, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		if old != nil && c.Type == xdsv1alpha1.ConditionReady && routine(old.Reason) && routine(c.Reason) {
			continue
		}
		r.Recorder.Eventf(ps, nil, eventType(c.Type, c.Status, c.Reason), c.Reason, c.Type+"="+string(c.Status), "%s", note(c.Message))
	}
}

// eventType is the type of the Event for a condition's transition to
// status with reason. Warning means something is wrong and someone may have
// to act, which is what alerting on Warning Events assumes: an
// abnormal-true condition (Degraded, Stalled) turning True, a
// normal-true one (Accepted, Ready) turning False for a lasting reason, or
// a scope accepted with a reason that still needs a fix (DeltaForGRPC,
// RefNotPermitted). Everything else is Normal: conditions becoming
// healthy, and the transient states every spec edit and push goes
// through (SnapshotNotBuilt, Pending) on the way to being served.
func eventType(condType string, status metav1.ConditionStatus, reason string) string {
	switch reason {
	case xdsv1alpha1.ReasonSnapshotNotBuilt, xdsv1alpha1.ReasonPending:
		return corev1.EventTypeNormal
	case xdsv1alpha1.ReasonDeltaForGRPC, xdsv1alpha1.ReasonRefNotPermitted:
		return corev1.EventTypeWarning
	}
	abnormalTrue := condType == xdsv1alpha1.ConditionDegraded || condType == xdsv1alpha1.ConditionStalled
	switch {
	case status == metav1.ConditionUnknown:
		return corev1.EventTypeNormal
	case (status == metav1.ConditionTrue) == abnormalTrue:
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// recordAdvice emits an Event when the cost advice becomes decisive or
// changes direction (Keep, Switch); NotEnoughData only says the window is
// young or quiet.
func (r *Reconciler) recordAdvice(ps *xdsv1alpha1.ProxyScope, before *xdsv1alpha1.ProtocolCost) {
	now := ps.Status.Cost
	if now == nil || now.Recommendation == xdsv1alpha1.RecommendationNotEnoughData ||
		(before != nil && before.Recommendation == now.Recommendation) {
		return
	}
	r.Recorder.Eventf(ps, nil, corev1.EventTypeNormal, "ProtocolAdvice"+string(now.Recommendation), "Advise", "%s", note(now.Advice))
}

// maxNote is the API server's limit on an Event's note, in bytes
// (events.k8s.io/v1); it refuses a longer Event outright.
const maxNote = 1024

// note is a condition message as an Event can carry it: messages hold what
// proxies sent (a NACK's node id and error detail), so they are cut to
// maxNote bytes of valid UTF-8; the full message stays on the condition.
func note(msg string) string { return feedback.Cut(msg, math.MaxInt, maxNote) }

// routine reports whether a Ready reason is part of every push's cycle.
func routine(reason string) bool {
	return reason == xdsv1alpha1.ReasonSynced || reason == xdsv1alpha1.ReasonPending
}

// RetryLimiter paces the retries of a status write that failed (a
// scope's, or a route's): doubling from 100 ms up to 30 s, where
// controller-runtime's default goes on to 16 minutes, so a status follows
// within 30 s once the API server accepts its write again; the bucket
// bounds the overall rate.
func RetryLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](100*time.Millisecond, 30*time.Second),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// workers is Workers, or the number the write limiter's rate calls for,
// or one without a limiter.
func (r *Reconciler) workers() int {
	switch {
	case r.Workers > 0:
		return r.Workers
	case r.Writes != nil:
		return Workers(float64(r.Writes.Limit()))
	}
	return 1
}

// SetupWithManager runs the reconciler on the leader for every ProxyScope
// whose spec changed, and for every scope the store or the feedback says
// changed: the workqueue dedups them and retries failed patches with backoff.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	changes := make(chan event.TypedGenericEvent[*xdsv1alpha1.ProxyScope])
	f := &feeder{served: r.Store.Changes(), proxies: r.Feedback.Changes(), replicas: keyset.New(), bootstrap: r.Bootstrap.Changes(), window: r.Window, out: changes}
	if r.Replicas != nil {
		f.replicas = r.Replicas.Changes()
	}
	if err := mgr.Add(f); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("status").
		WithOptions(controller.Options{RateLimiter: RetryLimiter(), MaxConcurrentReconciles: r.workers()}).
		For(&xdsv1alpha1.ProxyScope{}, builder.WithPredicates(
			// A spec change, or a ShardAbsent mark another shard's leader
			// wrote over this one's status while it seemed gone.
			predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.NewPredicateFuncs(func(o client.Object) bool {
				ps, ok := o.(*xdsv1alpha1.ProxyScope)
				return ok && shardwatch.Marked(ps)
			})),
			predicate.NewPredicateFuncs(func(o client.Object) bool {
				return r.Shards.Owns(model.Key{Namespace: o.GetNamespace(), Name: o.GetName()})
			}))).
		WatchesRawSource(source.Channel(changes, &handler.TypedEnqueueRequestForObject[*xdsv1alpha1.ProxyScope]{})).
		Complete(r)
}

// feeder turns the pipeline's changed-scope sets into events for the status
// controller, at most once per window per burst.
type feeder struct {
	// served, proxies, replicas and bootstrap are the scopes whose served
	// state, proxies' feedback (here, or on other replicas) or bootstrap
	// ConfigMap conflict changed.
	served, proxies, replicas, bootstrap *keyset.Set
	window                               time.Duration
	out                                  chan<- event.TypedGenericEvent[*xdsv1alpha1.ProxyScope]
}

var _ manager.LeaderElectionRunnable = (*feeder)(nil)

// NeedLeaderElection is true: it feeds the leader-only status controller.
func (f *feeder) NeedLeaderElection() bool { return true }

// Start feeds changes until ctx ends.
func (f *feeder) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.served.Changed():
		case <-f.proxies.Changed():
		case <-f.bootstrap.Changed():
		case <-f.replicas.Changed():
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.window):
		}
		seen := map[model.Key]struct{}{}
		for _, s := range []*keyset.Set{f.served, f.proxies, f.replicas, f.bootstrap} {
			for _, k := range s.Take() {
				if _, dup := seen[k]; dup || k == (model.Key{}) {
					continue // the zero key counts refusals that name no scope
				}
				seen[k] = struct{}{}
				ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
				select {
				case f.out <- event.TypedGenericEvent[*xdsv1alpha1.ProxyScope]{Object: ps}:
				case <-ctx.Done():
					return nil
				}
			}
		}
	}
}
