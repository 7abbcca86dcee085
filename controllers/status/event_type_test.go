package status

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
)

// Every (condition, status, reason) a scope's status can hold is emitted,
// on the transition to it, as a Warning exactly when something is wrong:
// abnormal-true conditions (Degraded, Stalled) turning True, Accepted and
// Ready turning False for a lasting reason, and an acceptance that still
// needs a fix. Healthy states and the transient states of every spec edit
// and push (SnapshotNotBuilt, Pending) are Normal.
func TestEventTypeOfEveryTransition(t *testing.T) {
	const (
		normal  = corev1.EventTypeNormal
		warning = corev1.EventTypeWarning
		isTrue  = metav1.ConditionTrue
		isFalse = metav1.ConditionFalse
		unknown = metav1.ConditionUnknown
	)
	for _, tc := range []struct {
		cond   string
		status metav1.ConditionStatus
		reason string
		want   string
	}{
		{xdsv1alpha1.ConditionAccepted, isTrue, xdsv1alpha1.ReasonResolved, normal},
		{xdsv1alpha1.ConditionAccepted, isTrue, xdsv1alpha1.ReasonDeltaForGRPC, warning},
		{xdsv1alpha1.ConditionAccepted, isTrue, xdsv1alpha1.ReasonRefNotPermitted, warning},
		{xdsv1alpha1.ConditionAccepted, isFalse, xdsv1alpha1.ReasonNoMatchingServices, warning},
		{xdsv1alpha1.ConditionAccepted, isFalse, xdsv1alpha1.ReasonNamespaceNotFound, warning},
		{xdsv1alpha1.ConditionAccepted, isFalse, xdsv1alpha1.ReasonInvalidSelector, warning},
		{xdsv1alpha1.ConditionAccepted, isFalse, xdsv1alpha1.ReasonRefNotPermitted, warning},
		{xdsv1alpha1.ConditionAccepted, unknown, xdsv1alpha1.ReasonSnapshotNotBuilt, normal},

		{xdsv1alpha1.ConditionReady, isTrue, xdsv1alpha1.ReasonSynced, normal},
		{xdsv1alpha1.ConditionReady, isTrue, xdsv1alpha1.ReasonNoProxies, normal},
		{xdsv1alpha1.ConditionReady, isFalse, xdsv1alpha1.ReasonPending, normal},
		{xdsv1alpha1.ConditionReady, isFalse, xdsv1alpha1.ReasonSnapshotNotBuilt, normal},
		{xdsv1alpha1.ConditionReady, isFalse, xdsv1alpha1.ReasonNotAccepted, warning},
		{xdsv1alpha1.ConditionReady, isFalse, xdsv1alpha1.ReasonShardAbsent, warning},

		{xdsv1alpha1.ConditionDegraded, isFalse, xdsv1alpha1.ReasonAsExpected, normal},
		{xdsv1alpha1.ConditionDegraded, isTrue, xdsv1alpha1.ReasonProxyNACKed, warning},
		{xdsv1alpha1.ConditionDegraded, isTrue, xdsv1alpha1.ReasonUnservableResource, warning},
		{xdsv1alpha1.ConditionDegraded, isTrue, xdsv1alpha1.ReasonRefNotPermitted, warning},
		{xdsv1alpha1.ConditionDegraded, isTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict, warning},
		{xdsv1alpha1.ConditionDegraded, isTrue, xdsv1alpha1.ReasonWrongProtocol, warning},

		{xdsv1alpha1.ConditionStalled, isFalse, xdsv1alpha1.ReasonAsExpected, normal},
		{xdsv1alpha1.ConditionStalled, isTrue, xdsv1alpha1.ReasonInvalidSelector, warning},
		{xdsv1alpha1.ConditionStalled, isTrue, xdsv1alpha1.ReasonProxyNACKed, warning},
	} {
		name := tc.cond + "=" + string(tc.status) + "/" + tc.reason
		// From no condition, and from a different status (a reason that
		// is not the Synced/Pending cycle, which emits nothing).
		for _, before := range [][]metav1.Condition{
			nil,
			{{Type: tc.cond, Status: unknown, Reason: "Before"}},
			{{Type: tc.cond, Status: isFalse, Reason: "Before"}},
		} {
			if len(before) > 0 && before[0].Status == tc.status {
				before[0].Status = isTrue
			}
			rec := events.NewFakeRecorder(10)
			r := &Reconciler{Recorder: rec}
			ps := &xdsv1alpha1.ProxyScope{}
			ps.Status.Conditions = []metav1.Condition{{Type: tc.cond, Status: tc.status, Reason: tc.reason, Message: "m"}}
			r.recordTransitions(ps, before)
			if len(rec.Events) != 1 {
				t.Errorf("%s: %d Events, want 1", name, len(rec.Events))
				continue
			}
			if got := <-rec.Events; !strings.HasPrefix(got, tc.want+" "+tc.reason+" ") {
				t.Errorf("%s (from %v): Event %q, want a %s", name, before, got, tc.want)
			}
		}
	}
}
