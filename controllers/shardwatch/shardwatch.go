// Package shardwatch lets the scopes of a shard that has no running replica
// say so in their status.
//
// Each shard's leader writes its own scopes' status and no other. When every
// replica of a shard is gone (its Deployment deleted or scaled to zero, its
// pods crash-looping, unschedulable or unable to reach the API server), no
// one writes its scopes' status any more, and what it last wrote (Ready,
// the proxies counted) stands as if current while its proxies get no
// updates. Shard 0's leader watches the other shards' leader election
// Leases, which every live shard renews, and marks the scopes of a shard
// whose Lease nobody renewed for a while Ready=False, reason ShardAbsent.
// The shard's own leader, once back, computes its scopes' status anew and
// writes over it.
package shardwatch

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// DefaultAfter is how long a shard's Lease must have gone unrenewed (past
// the duration its holder promised) before its scopes are marked: longer
// than a rollout leaves a shard without a leader (a stopping leader gives
// its Lease up and a new replica takes it within seconds), so that a
// rollout or a count change marks nothing.
const DefaultAfter = 30 * time.Second

// Watcher marks the scopes of the shards without a leader. It runs on shard
// 0's leader.
type Watcher struct {
	// Client reads ProxyScopes from the manager's cache and patches their
	// status.
	Client client.Client
	// APIReader reads the Leases from the API server.
	APIReader client.Reader
	// Namespace holds the Leases; Lease names shard k's.
	Namespace string
	Lease     func(k int) string
	// Shards is this replica's shards (shard 0 of them).
	Shards shard.Shards
	// After is how long a shard goes without a leader before its scopes
	// are marked (DefaultAfter when zero).
	After time.Duration
	// Writes is the status writes' pace, shared with the status
	// controller.
	Writes *rate.Limiter
	// Recorder records the mark as a Warning Event on each scope, as the
	// status controller records every transition of a condition.
	Recorder events.EventRecorder
	Log      logr.Logger
}

// NeedLeaderElection is true: it writes status, which the leader does.
func (*Watcher) NeedLeaderElection() bool { return true }

// Start watches the Leases and marks scopes until ctx ends.
func (w *Watcher) Start(ctx context.Context) error {
	after := w.After
	if after <= 0 {
		after = DefaultAfter
	}
	// A look at the Leases every fifteenth of the wait, at most every
	// 2 s (client-go's leader renews every 2 s).
	every := min(max(after/15, 100*time.Millisecond), 2*time.Second)
	p := newPresence(time.Now(), w.Shards.Count())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		w.observe(ctx, p)
		for k := 1; k < w.Shards.Count(); k++ {
			if p.absent(k, time.Now(), after) {
				w.mark(ctx, p, k, after, every)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// observe reads every other shard's Lease.
func (w *Watcher) observe(ctx context.Context, p *presence) {
	for k := 1; k < w.Shards.Count(); k++ {
		l := &coordinationv1.Lease{}
		err := w.APIReader.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: w.Lease(k)}, l)
		switch {
		case apierrors.IsNotFound(err):
			l = nil
		case err != nil:
			// Absence is judged on what the Lease says, never on a
			// failed read.
			p.saw(k, nil, time.Now(), true)
			continue
		}
		now := time.Now()
		p.saw(k, l, now, false)
		if p.shards[k].gone && p.shards[k].aliveAt.After(now) {
			p.shards[k].gone = false
			w.Log.Info("a shard has a leader again; its leader writes its scopes' status", "shard", k, "lease", w.Namespace+"/"+w.Lease(k))
		}
	}
	p.observed = time.Now()
}

// mark sets Ready=False, reason ShardAbsent, on every scope of shard k that
// does not say so yet, at the status pace, for as long as k has no leader.
func (w *Watcher) mark(ctx context.Context, p *presence, k int, after, every time.Duration) {
	var list xdsv1alpha1.ProxyScopeList
	if err := w.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		w.Log.Error(err, "listing the scopes of a shard without a leader", "shard", k)
		return
	}
	cond := metav1.Condition{
		Type: xdsv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: xdsv1alpha1.ReasonShardAbsent,
		Message: fmt.Sprintf("shard %d of %d has had no leader since %s (no replica of it renewed Lease %s/%s): "+
			"this scope's proxies get no updates, and the rest of this status is what that shard last wrote; "+
			"see the pods of shard %d (label scopeplane.dev/shard=%d)",
			k, w.Shards.Count(), p.shards[k].aliveAt.UTC().Format(time.RFC3339), w.Namespace, w.Lease(k), k, k),
	}
	marked, failed := 0, 0
	for i := range list.Items {
		ps := &list.Items[i]
		if w.Shards.ShardOf(model.Key{Namespace: ps.Namespace, Name: ps.Name}) != k || says(ps) {
			continue
		}
		if w.Writes != nil {
			if err := w.Writes.Wait(ctx); err != nil {
				return
			}
		}
		// A long batch looks at the Leases again as it goes: the shard's
		// leader may be back.
		if time.Since(p.observed) >= every {
			w.observe(ctx, p)
		}
		if !p.absent(k, time.Now(), after) {
			return
		}
		before := ps.DeepCopy()
		next := before.DeepCopy()
		c := cond
		c.ObservedGeneration = ps.Generation
		meta.SetStatusCondition(&next.Status.Conditions, c)
		// Written only over the status read: a status the shard's leader
		// wrote meanwhile is a conflict, and the scope is looked at again
		// on the next pass.
		if err := w.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				failed++
			}
			continue
		}
		marked++
		w.Recorder.Eventf(next, nil, corev1.EventTypeWarning, c.Reason, c.Type+"="+string(c.Status), "%s", c.Message)
	}
	if marked > 0 || failed > 0 {
		w.Log.Info("marked the scopes of a shard without a leader Ready=False", "shard", k, "lease", w.Namespace+"/"+w.Lease(k),
			"since", p.shards[k].aliveAt.UTC().Format(time.RFC3339), "marked", marked, "failed", failed)
	}
}

// says reports whether ps is marked already.
func says(ps *xdsv1alpha1.ProxyScope) bool {
	c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == xdsv1alpha1.ReasonShardAbsent
}
