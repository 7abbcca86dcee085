package leader

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
	"github.com/scopeplane/scopeplane/internal/testkit"
)

// replicaDropOut is how long the proxies of a replica that died may stay
// in the status counts: the leader merges every replica's published
// feedback, and drops a replica's once it was not renewed for the expiry,
// checking once a second.
const replicaDropOut = replicafeedback.DefaultExpiry + time.Second

// countsRight reports whether both scopes' status count exactly the
// proxies connected across all running replicas (kubectl get ps's Proxies
// column), all of them synced, while the leader counts the reports of the
// other running replicas and of no other: since moving proxies leaves the
// total as it was, a status written before a replica died would otherwise
// look right too.
func (f *fleet) countsRight() (bool, string) {
	leader := f.replica(f.leader())
	if leader == nil {
		return false, "no leader"
	}
	if got, want := leader.cp.Replicas.Replicas(), len(f.running())-1; got != want {
		return false, fmt.Sprintf("the leader %s counts the reports of %d other replicas, %d others run", leader.name, got, want)
	}
	for _, scope := range scopeNames {
		st, err := f.scopeStatus(scope)
		if err != nil {
			return false, err.Error()
		}
		want := f.connected(scope)
		if got := ptr.Deref(st.ConnectedProxies, -1); got != want || st.SyncedProxies != want {
			perReplica := map[string]int{}
			for _, name := range f.running() {
				for _, p := range f.onReplica(name) {
					if p.scope == scope {
						perReplica[name]++
					}
				}
			}
			return false, fmt.Sprintf("scope %s: status.connectedProxies %d, syncedProxies %d; %d connected (per replica %v, leader %q)",
				scope, got, st.SyncedProxies, want, perReplica, f.leader())
		}
	}
	return true, ""
}

// TestStatusCountsEveryReplica checks that status counts the proxies of
// every replica, not only the leader's: with proxies on all three; after a
// follower crashed with proxies connected (they reconnect to the others and
// the dead replica's drop out of the counts); after the leader stopped (the
// new leader's counts are right); and after both came back.
func TestStatusCountsEveryReplica(t *testing.T) {
	var st settleStats
	f := threeReplicas(t, "counts", &st)
	leader := f.awaitLeader()
	for _, name := range abc {
		if len(f.onReplica(name)) == 0 {
			t.Fatalf("no proxy on replica %s: the test needs every replica to serve some", name)
		}
	}
	testkit.Eventually(t, "status counting the proxies of every replica", f.countsRight)

	follower := abc[slices.IndexFunc(abc, func(n string) bool { return n != leader })]
	moved := len(f.onReplica(follower))
	t0 := time.Now()
	f.end(follower, true)
	f.mustSettle(&st)
	reconnected := time.Since(t0)
	testkit.EventuallyWithin(t, replicaDropOut+testkit.Timeout, "status counting the proxies after "+follower+" crashed", f.countsRight)
	t.Logf("follower %s crashed with %d proxies: they held the truth again after %v, the counts were right after %v (polled every 50ms)",
		follower, moved, reconnected.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

	moved = len(f.onReplica(leader))
	t0 = time.Now()
	f.end(leader, false)
	f.mustSettle(&st)
	reconnected = time.Since(t0)
	next := f.awaitLeader()
	testkit.EventuallyWithin(t, replicaDropOut+testkit.Timeout, "the new leader's counts after "+leader+" stopped", f.countsRight)
	t.Logf("leader %s stopped with %d proxies: they held the truth again after %v; %s leads, its counts were right after %v",
		leader, moved, reconnected.Round(time.Millisecond), next, time.Since(t0).Round(time.Millisecond))

	f.start(follower)
	f.start(leader)
	f.mustSettle(&st)
	testkit.Eventually(t, "status counting the proxies with all replicas back", f.countsRight)
}

// TestStatusShowsNACKOnAnyReplica makes a proxy on the leader, then one on
// a follower, reject the endpoints a Service change sends them: each NACK
// shows in its scope's status.recentNACKs, with Degraded=True.
func TestStatusShowsNACKOnAnyReplica(t *testing.T) {
	var st settleStats
	f := threeReplicas(t, "nack", &st)
	leader := f.awaitLeader()
	follower := abc[slices.IndexFunc(abc, func(n string) bool { return n != leader })]
	for round, name := range []string{leader, follower} {
		role := map[bool]string{true: "the leader", false: "a follower"}[name == leader]
		on := f.onReplica(name)
		if len(on) == 0 {
			t.Fatalf("no proxy on %s %s", role, name)
		}
		p := on[0]
		p.rejectEndpoints.Store(true)
		if err := f.upsertService("svc-1", []string{fmt.Sprintf("10.5.%d.1", round)}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, fmt.Sprintf("the NACK of proxy %s on %s %s in status", p.id, role, name), func() (bool, string) {
			status, err := f.scopeStatus(p.scope)
			if err != nil {
				return false, err.Error()
			}
			var nodes []string
			for _, n := range status.RecentNACKs {
				nodes = append(nodes, n.Node)
			}
			c := meta.FindStatusCondition(status.Conditions, xdsv1alpha1.ConditionDegraded)
			if !slices.Contains(nodes, p.id) || c == nil || c.Status != metav1.ConditionTrue || c.Reason != xdsv1alpha1.ReasonProxyNACKed {
				return false, fmt.Sprintf("recentNACKs from %v, Degraded %+v", nodes, c)
			}
			return true, ""
		})
	}
}
