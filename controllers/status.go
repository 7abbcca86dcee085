package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// wrongProtocolMemory is how long a wrong-protocol refusal keeps a scope
// Degraded: proxies that keep knocking keep it there, one that was fixed
// lets it clear.
const wrongProtocolMemory = 2 * time.Minute

// StatusWriter computes every ProxyScope's status from the catalog, the
// served snapshots and the proxies' feedback, and patches it when it
// changed. It runs on the leader only, so replicas never fight over status;
// every replica still serves xDS. Feedback is per replica: the leader
// reports the proxies connected to it.
type StatusWriter struct {
	Client   client.Client
	Catalog  *catalog.Catalog
	Store    *snapshot.Store
	Feedback *feedback.Tracker
	Recorder events.EventRecorder
	// Window coalesces bursts of feedback into one write per scope.
	Window time.Duration
	// Resync rewrites every status this often even without a signal, for
	// inputs that do not signal (a namespace appearing).
	Resync time.Duration
}

// NeedLeaderElection is true: only the leader writes status.
func (w *StatusWriter) NeedLeaderElection() bool { return true }

// Start writes statuses until ctx ends.
func (w *StatusWriter) Start(ctx context.Context) error {
	tick := time.NewTicker(w.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Feedback.Changed():
		case <-w.Store.Changed():
		case <-tick.C:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.Window):
		}
		w.writeAll(ctx)
	}
}

func (w *StatusWriter) writeAll(ctx context.Context) {
	list := &xdsv1alpha1.ProxyScopeList{}
	if err := w.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "listing ProxyScopes for status")
		return
	}
	for i := range list.Items {
		if err := w.write(ctx, &list.Items[i]); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "writing ProxyScope status", "scope", client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
}

func (w *StatusWriter) write(ctx context.Context, ps *xdsv1alpha1.ProxyScope) error {
	next := w.compute(ps, time.Now())
	if equality.Semantic.DeepEqual(ps.Status, next) {
		return nil
	}
	before := ps.DeepCopy()
	ps.Status = next
	if err := w.Client.Status().Patch(ctx, ps, client.MergeFrom(before)); err != nil {
		return err
	}
	for _, c := range next.Conditions {
		old := meta.FindStatusCondition(before.Status.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason {
			continue
		}
		if old != nil && c.Type == xdsv1alpha1.ConditionReady && routine(old.Reason) && routine(c.Reason) {
			continue // every push passes through Pending: not worth an Event
		}
		kind := corev1.EventTypeNormal
		if bad := c.Status == metav1.ConditionTrue; (c.Type == xdsv1alpha1.ConditionDegraded) == bad && c.Status != metav1.ConditionUnknown {
			kind = corev1.EventTypeWarning // Degraded=True, or Accepted/Ready=False
		}
		w.Recorder.Eventf(ps, nil, kind, c.Reason, c.Type+"="+string(c.Status), "%s", c.Message)
	}
	return nil
}

// compute returns the status ps should have now.
func (w *StatusWriter) compute(ps *xdsv1alpha1.ProxyScope, now time.Time) xdsv1alpha1.ProxyScopeStatus {
	key := model.Key{Namespace: ps.Namespace, Name: ps.Name}
	st := *ps.Status.DeepCopy()
	st.BootstrapConfigMap = bootstrap.ConfigMapName(ps.Name)

	var (
		built    bool
		specGen  int64
		version  string
		revTime  time.Time
		clusters int
	)
	if sc := w.Store.Get(key); sc != nil {
		sc.Read(func(v snapshot.View) {
			if spec := v.Spec(); spec != nil {
				built, specGen, version, revTime = true, spec.Generation, v.Version(), v.RevTime()
				clusters = v.Len(xdstype.Cluster)
			}
		})
	}
	stats, inCatalog := w.Catalog.Stats(key)
	_, convErr := convert.Scope(ps)
	current := built && specGen == ps.Generation

	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: ps.Generation})
	}
	switch {
	case convErr != nil:
		set(xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonInvalidSelector, convErr.Error()+"; the scope serves nothing until it is fixed")
	case !inCatalog || !current:
		set(xdsv1alpha1.ConditionAccepted, metav1.ConditionUnknown, xdsv1alpha1.ReasonSnapshotNotBuilt, fmt.Sprintf("generation %d is not processed yet", ps.Generation))
	case len(stats.MissingNamespaces) > 0:
		set(xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonNamespaceNotFound,
			fmt.Sprintf("spec.services names namespaces that do not exist: %s", strings.Join(stats.MissingNamespaces, ", ")))
	case stats.SelectedServices == 0:
		set(xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonNoMatchingServices,
			"the selections match no Service; the scope's proxies receive an empty configuration")
	default:
		set(xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved,
			fmt.Sprintf("%d Services selected: %d clusters, %d endpoints", stats.SelectedServices, clusters, stats.Endpoints))
	}
	if convErr != nil || current {
		st.ObservedGeneration = ps.Generation
	}
	if !current {
		st.Conditions = setReady(st.Conditions, metav1.ConditionFalse, xdsv1alpha1.ReasonSnapshotNotBuilt,
			fmt.Sprintf("the snapshot of generation %d is not built yet", ps.Generation), ps.Generation)
		return st
	}

	fb := w.Feedback.Get(key)
	st.SelectedServices = int32(stats.SelectedServices)
	st.Clusters = int32(clusters)
	st.Endpoints = int32(stats.Endpoints)
	st.Version = version
	if !revTime.IsZero() {
		t := metav1.NewTime(revTime.Truncate(time.Second))
		st.LastPushTime = &t
	}
	connected, synced := 0, 0
	var nacking []*feedback.Proxy
	for _, p := range fb.Proxies {
		connected++
		if p.AtVersion == version {
			synced++
		}
		if len(p.Nacked) > 0 {
			nacking = append(nacking, p)
		}
	}
	st.ConnectedProxies, st.SyncedProxies = int32(connected), int32(synced)
	st.RefusedStreams = 0
	for _, n := range fb.Refused {
		st.RefusedStreams += n
	}
	st.RecentNACKs = nil
	for _, n := range fb.NACKs {
		st.RecentNACKs = append(st.RecentNACKs, xdsv1alpha1.ProxyNACK{
			Node: n.Node, TypeURL: n.TypeURL, Version: n.Version, Detail: n.Detail, Time: metav1.NewTime(n.Time.Truncate(time.Second)),
		})
	}

	msg := fmt.Sprintf("%d of %d proxies at version %s", synced, connected, version)
	switch {
	case connected == 0:
		st.Conditions = setReady(st.Conditions, metav1.ConditionUnknown, xdsv1alpha1.ReasonNoProxies,
			fmt.Sprintf("version %s is built; no proxy is connected to confirm it", version), ps.Generation)
	case synced == connected:
		st.Conditions = setReady(st.Conditions, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced, msg, ps.Generation)
	default:
		st.Conditions = setReady(st.Conditions, metav1.ConditionFalse, xdsv1alpha1.ReasonPending, msg, ps.Generation)
	}

	wrongProto := fb.LastRefused[feedback.RefusedWrongProto]
	switch {
	case len(nacking) > 0:
		set(xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed, nackMessage(fb.NACKs, nacking))
	case !wrongProto.IsZero() && now.Sub(wrongProto) < wrongProtocolMemory:
		want := model.Protocol(ps.Spec.Protocol).APIType()
		set(xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonWrongProtocol,
			fmt.Sprintf("%d streams refused so far: proxies naming this scope use the other protocol; set api_type: %s in their ADS config (spec.protocol is %s)",
				fb.Refused[feedback.RefusedWrongProto], want, ps.Spec.Protocol))
	default:
		set(xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected, "no proxy rejects the configuration")
	}
	return st
}

// routine reports whether a Ready reason is part of every push's cycle.
func routine(reason string) bool {
	return reason == xdsv1alpha1.ReasonSynced || reason == xdsv1alpha1.ReasonPending
}

func setReady(conds []metav1.Condition, status metav1.ConditionStatus, reason, msg string, gen int64) []metav1.Condition {
	meta.SetStatusCondition(&conds, metav1.Condition{Type: xdsv1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
	return conds
}

// nackMessage names the newest rejection of a proxy that is still NACKing.
func nackMessage(nacks []feedback.NACK, nacking []*feedback.Proxy) string {
	nodes := map[string]bool{}
	for _, p := range nacking {
		nodes[p.Node] = true
	}
	for _, n := range nacks { // newest first
		if nodes[n.Node] {
			msg := fmt.Sprintf("proxy %s rejected %s version %s: %s", n.Node, n.TypeURL, n.Version, n.Detail)
			if len(nacking) > 1 {
				msg += fmt.Sprintf(" (%d proxies are rejecting configuration)", len(nacking))
			}
			return msg
		}
	}
	return fmt.Sprintf("%d proxies are rejecting configuration", len(nacking))
}
