package leader

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// abc are the names of the three replicas of a fleet.
var abc = []string{"a", "b", "c"}

// threeReplicas is a fleet of replicas a, b and c serving Services svc-0,
// svc-1 and svc-2 to three SotW and three delta proxies, one of each
// connected to each replica first, settled.
func threeReplicas(t *testing.T, ns string, st *settleStats) *fleet {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	f := newFleet(t, startEnv(t), ns, []string{"svc-0", "svc-1", "svc-2"}, abc)
	t.Cleanup(f.close)
	f.addProxies(sotwScope, 3, abc, 1)
	f.addProxies(deltaScope, 3, abc, 2)
	f.mustSettle(st)
	return f
}

// awaitLeader waits for exactly one running replica to lead.
func (f *fleet) awaitLeader() string {
	f.t.Helper()
	var l string
	testkit.Eventually(f.t, "one leader", func() (bool, string) {
		l = f.leader()
		return l != "", fmt.Sprintf("running %v, none or several lead", f.running())
	})
	return l
}

// statusAt reports whether both scopes' status show the version replica
// name serves, written by that replica (its user agent is a field manager
// of the status).
func (f *fleet) statusAt(name string) (bool, string) {
	r := f.replica(name)
	if r == nil {
		return false, name + " is not running"
	}
	for _, scope := range scopeNames {
		ps := &xdsv1alpha1.ProxyScope{}
		if err := f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: scope}, ps); err != nil {
			return false, err.Error()
		}
		if want := servedVersion(r, f.ns, scope); want == "" || ps.Status.Version != want {
			return false, fmt.Sprintf("scope %s: status.version %q, %s serves %q", scope, ps.Status.Version, name, want)
		}
		var writers []string
		for _, mf := range ps.ManagedFields {
			if mf.Subresource == "status" {
				writers = append(writers, mf.Manager)
			}
		}
		if !slices.Contains(writers, userAgent(r.name)) {
			return false, fmt.Sprintf("scope %s: status written by %v, not %s", scope, writers, r.name)
		}
	}
	return true, ""
}

// TestLeaderFailover stops the leader of three replicas, then crashes the
// next one, each time changing a Service once the old leader is gone: a
// new leader is elected and writes the change to both scopes' status, and
// the old leader's proxies reconnect to the others and hold the truth.
// After a shutdown the Lease is given up and taken at once; after a crash
// it is taken once it expired. The timeline is logged.
func TestLeaderFailover(t *testing.T) {
	var st settleStats
	f := threeReplicas(t, "failover", &st)
	for round, crash := range []bool{false, true} {
		how := map[bool]string{false: "stopped", true: "crashed"}[crash]
		old := f.awaitLeader()
		testkit.Eventually(t, "status written by the leader "+old, func() (bool, string) { return f.statusAt(old) })
		before, err := f.scopeStatus(sotwScope)
		if err != nil {
			t.Fatal(err)
		}
		moving := f.onReplica(old)

		t0 := time.Now()
		f.end(old, crash)
		ended := time.Since(t0)
		// Changed once the old leader can write no more, so that only a
		// new leader can write it.
		if err := f.upsertService("svc-0", []string{fmt.Sprintf("10.2.%d.1", round), fmt.Sprintf("10.2.%d.2", round), fmt.Sprintf("10.2.%d.3", round)}); err != nil {
			t.Fatal(err)
		}
		var elected, written time.Duration
		var leader string
		testkit.Eventually(t, "a new leader writing the change to status", func() (bool, string) {
			if elected == 0 {
				if leader = f.leader(); leader == "" {
					return false, fmt.Sprintf("no leader among %v", f.running())
				}
				elected = time.Since(t0)
			}
			ok, state := f.statusAt(leader)
			if ok {
				written = time.Since(t0)
			}
			return ok, state
		})
		after, err := f.scopeStatus(sotwScope)
		if err != nil {
			t.Fatal(err)
		}
		if after.Version == before.Version {
			t.Fatalf("status.version %q did not change with the Service", after.Version)
		}
		f.mustSettle(&st)
		for _, p := range moving {
			if r := p.connectedTo(); r == nil || r.name == f.ns+"-"+old {
				t.Errorf("proxy %s of the %s leader: %s", p.id, how, p.describe())
			}
		}
		t.Logf("leader %s %s (%d proxies on it): it ended after %v; %s elected by %v; status showed the change made at %v by %v (polled every 50ms)",
			old, how, len(moving), ended.Round(time.Millisecond), leader, elected.Round(time.Millisecond), ended.Round(time.Millisecond), written.Round(time.Millisecond))
	}
}

// TestKilledReplicaProxiesReconnectElsewhere crashes a replica with a SotW
// and a delta proxy connected, and holds their reconnects while a Service's
// endpoints change and another Service is deleted. Then they reconnect to
// the others: the delta proxy is sent only what changed and told of the
// removals, the SotW proxy corrects itself from the full state, and no
// proxy holds a resource that no longer exists. A second crash with no
// change in between moves delta proxies with nothing sent at all; the
// replicas then come back and the fleet settles again.
func TestKilledReplicaProxiesReconnectElsewhere(t *testing.T) {
	var st settleStats
	f := threeReplicas(t, "kill", &st)
	leader := f.awaitLeader()
	victim := ""
	for _, name := range abc {
		if name != leader {
			victim = name
			break
		}
	}
	moving := f.onReplica(victim)
	var sotw, delta int
	for _, p := range moving {
		if p.delta {
			delta++
		} else {
			sotw++
		}
	}
	if sotw == 0 || delta == 0 {
		t.Fatalf("replica %s holds %d SotW and %d delta proxies, want both", victim, sotw, delta)
	}
	before, err := f.truths()
	if err != nil {
		t.Fatal(err)
	}

	marks := f.streamMarks()
	f.holdReconnects()
	f.end(victim, true)
	testkit.Eventually(t, "the crashed replica's proxies disconnected", func() (bool, string) {
		for _, p := range moving {
			if p.connectedTo() != nil {
				return false, p.id + ": " + p.describe()
			}
		}
		return true, ""
	})
	if err := f.upsertService("svc-0", []string{"10.3.0.1", "10.3.0.9"}); err != nil {
		t.Fatal(err)
	}
	if err := f.deleteService("svc-2"); err != nil {
		t.Fatal(err)
	}
	var want map[string]truth
	testkit.Eventually(t, "the other replicas serving the change", func() (bool, string) {
		var err error
		if want, err = f.truths(); err != nil {
			return false, err.Error()
		}
		return f.serving(want)
	})
	f.releaseReconnects()
	f.mustSettle(&st)

	moved, err := f.onlyDifferences(marks, want)
	if err != nil {
		t.Fatal(err)
	}
	if moved != delta {
		t.Errorf("%d delta streams began, want %d (one per moved delta proxy)", moved, delta)
	}
	// The moved delta proxy was sent exactly the changed endpoints, and
	// told of the deleted Service's removal.
	tr := want[deltaScope]
	eds := xdstype.Endpoint.URL()
	for _, p := range moving {
		p.mu.Lock()
		s := p.streams[marks[p]]
		p.mu.Unlock()
		if s.replica == f.ns+"-"+victim {
			t.Fatalf("proxy %s reconnected to the crashed replica: %s", p.id, p.describe())
		}
		if !p.delta {
			continue
		}
		names, removed := map[string]bool{}, map[string]bool{}
		for _, ev := range p.c.Events()[s.from:] {
			for _, n := range ev.Names {
				names[ev.TypeURL+" "+n] = true
			}
			for _, n := range ev.Removed {
				removed[ev.TypeURL+" "+n] = true
			}
		}
		wantNames, wantRemoved := map[string]bool{}, map[string]bool{}
		for _, typ := range allTypes {
			for n, b := range tr[typ] {
				if string(before[deltaScope][typ][n]) != string(b) {
					wantNames[typ+" "+n] = true
				}
			}
			for n := range before[deltaScope][typ] {
				if _, ok := tr[typ][n]; !ok {
					wantRemoved[typ+" "+n] = true
				}
			}
		}
		if !maps.Equal(names, wantNames) || !maps.Equal(removed, wantRemoved) {
			t.Errorf("proxy %s after its move: sent %v, removed %v; want sent %v (what changed), removed %v",
				p.id, slices.Sorted(maps.Keys(names)), slices.Sorted(maps.Keys(removed)), slices.Sorted(maps.Keys(wantNames)), slices.Sorted(maps.Keys(wantRemoved)))
		}
		if len(wantNames) == 0 || len(wantRemoved) == 0 || !slices.ContainsFunc(slices.Collect(maps.Keys(wantNames)), func(k string) bool { return strings.HasPrefix(k, eds+" ") }) {
			t.Fatalf("the change is not what the test means: changed %v, removed %v", wantNames, wantRemoved)
		}
	}

	// Nothing changes while a second replica crashes: the moved delta
	// proxies are sent nothing.
	second := ""
	for _, name := range f.running() {
		if len(f.onReplica(name)) > 0 && name != leader {
			second = name
		}
	}
	if second == "" {
		second = leader
	}
	marks = f.streamMarks()
	f.end(second, true)
	f.mustSettle(&st)
	if _, err := f.onlyDifferences(marks, want); err != nil {
		t.Fatal(err)
	}
	f.start(victim)
	f.start(second)
	f.mustSettle(&st)
	t.Logf("crashed %s (%d SotW, %d delta proxies moved), then %s; %d quiescent points, %d proxy states and %d resources compared with the truth, 0 stale",
		victim, sotw, delta, second, st.points, st.proxies, st.resources)
}
