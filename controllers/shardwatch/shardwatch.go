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
	"cmp"
	"context"
	"fmt"
	"strconv"
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
	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
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
	// APIReader reads the Leases and the feedback ConfigMaps' metadata
	// from the API server.
	APIReader client.Reader
	// Namespace holds the Leases; Lease names shard k's.
	Namespace string
	Lease     func(k int) string
	// Feedback is the namespace of the replicas' feedback ConfigMaps,
	// whose labels say the shard count each replica runs with.
	Feedback string
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

	// rolling is the other shard count whose replicas run, as last logged.
	rolling string
	// settled is when a pass over shard k's scopes last found none left
	// to mark: the scopes are listed again only after After.
	settled map[int]time.Time
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
	w.settled = map[int]time.Time{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		w.observe(ctx, p)
		// Whether another count runs is asked once a pass, when needed.
		asked, other := false, false
		for k := 1; k < w.Shards.Count(); k++ {
			if !p.absent(k, time.Now(), after) {
				delete(w.settled, k)
				continue
			}
			if time.Since(w.settled[k]) < after {
				continue
			}
			if !asked {
				asked, other = true, w.otherCount(ctx)
			}
			if other {
				continue
			}
			if w.mark(ctx, p, k, after, every) {
				w.settled[k] = time.Now()
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
		name := w.Lease(k)
		l := &coordinationv1.Lease{}
		err := w.APIReader.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: name}, l)
		switch {
		case apierrors.IsNotFound(err):
			l = nil
		case err != nil:
			// Absence is judged on what the Lease says, never on a
			// failed read.
			if !p.shards[k].unread && ctx.Err() == nil {
				w.Log.Error(err, "reading a shard's Lease: its scopes are not judged until it is read", "shard", k, "lease", w.Namespace+"/"+name)
			}
			p.saw(k, nil, time.Now(), true)
			continue
		}
		now := time.Now()
		p.saw(k, l, now, false)
		if p.shards[k].gone && p.shards[k].aliveAt.After(now) {
			p.shards[k].gone = false
			w.Log.Info("a shard has a leader again; its leader writes its scopes' status", "shard", k, "lease", w.Namespace+"/"+name)
		}
	}
	p.observed = time.Now()
}

// otherCount reports whether replicas of another shard count run (their
// feedback ConfigMaps, renewed lately, say so): a change of the count is
// rolling out, and the Leases, named by shard number alone, may be another
// count's, so nothing is marked until it is over. A read that fails counts
// as such a change.
func (w *Watcher) otherCount(ctx context.Context) bool {
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
	other := ""
	err := w.APIReader.List(ctx, &list, client.InNamespace(w.Feedback), client.HasLabels{replicafeedback.Label})
	if err != nil {
		other = "unknown (" + err.Error() + ")"
	}
	own := strconv.Itoa(w.Shards.Count())
	for _, cm := range list.Items {
		renewed, err := time.Parse(time.RFC3339, cm.Annotations[replicafeedback.RenewedAnnotation])
		if err != nil || time.Since(renewed) > 2*replicafeedback.DefaultExpiry {
			continue // a part, or a replica gone without a word
		}
		if n := cmp.Or(cm.Labels[replicafeedback.ShardsLabel], "1"); n != own {
			other = n
			break
		}
	}
	if other != w.rolling {
		if other != "" {
			w.Log.Info("replicas of another shard count run: no scope is marked until only this count's do", "shards", own, "other", other)
		}
		w.rolling = other
	}
	return other != ""
}

// mark sets Ready=False, reason ShardAbsent, on every scope of shard k that
// does not say so yet, at the status pace, for as long as k has no leader.
// It reports whether it went through them all.
func (w *Watcher) mark(ctx context.Context, p *presence, k int, after, every time.Duration) bool {
	var list xdsv1alpha1.ProxyScopeList
	if err := w.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		w.Log.Error(err, "listing the scopes of a shard without a leader", "shard", k)
		return false
	}
	cond := metav1.Condition{
		Type: xdsv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: xdsv1alpha1.ReasonShardAbsent,
		Message: fmt.Sprintf("shard %d of %d has had no leader since %s or earlier (no replica of it renewed Lease %s/%s): "+
			"this scope's proxies get no updates, and the rest of this status is what that shard last wrote; "+
			"see the pods of shard %d (label scopeplane.dev/shard=%d)",
			k, w.Shards.Count(), p.shards[k].aliveAt.UTC().Format(time.RFC3339), w.Namespace, w.Lease(k), k, k),
	}
	marked, failed := 0, 0
	defer func() {
		if marked > 0 || failed > 0 {
			w.Log.Info("marked the scopes of a shard without a leader Ready=False", "shard", k, "lease", w.Namespace+"/"+w.Lease(k),
				"since", p.shards[k].aliveAt.UTC().Format(time.RFC3339), "marked", marked, "failed", failed)
		}
	}()
	for i := range list.Items {
		ps := &list.Items[i]
		if w.Shards.ShardOf(model.Key{Namespace: ps.Namespace, Name: ps.Name}) != k || Marked(ps) {
			continue
		}
		if w.Writes != nil {
			if err := w.Writes.Wait(ctx); err != nil {
				return false
			}
		}
		// A long batch looks at the Leases again as it goes: the shard's
		// leader may be back.
		if time.Since(p.observed) >= every {
			w.observe(ctx, p)
		}
		if !p.absent(k, time.Now(), after) {
			return false
		}
		before := ps.DeepCopy()
		next := before.DeepCopy()
		c := cond
		c.ObservedGeneration = ps.Generation
		meta.SetStatusCondition(&next.Status.Conditions, c)
		// Written only over the status read: a status the shard's leader
		// wrote meanwhile is a conflict, and the scope is looked at again
		// on a later pass.
		if err := w.Client.Status().Patch(ctx, next, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if !apierrors.IsNotFound(err) {
				failed++
			}
			continue
		}
		marked++
		w.Recorder.Eventf(next, nil, corev1.EventTypeWarning, c.Reason, c.Type+"="+string(c.Status), "%s", c.Message)
	}
	return failed == 0
}

// Marked reports whether ps's status carries the mark: the status
// controller of its shard writes over it (see controllers/status).
func Marked(ps *xdsv1alpha1.ProxyScope) bool {
	c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == xdsv1alpha1.ReasonShardAbsent
}
