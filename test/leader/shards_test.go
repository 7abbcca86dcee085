package leader

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// shardAddresses are the addresses count shards' bootstraps name: a
// Service per shard, as the chart makes them.
func shardAddresses(count int) []string {
	out := make([]string, count)
	for i := range out {
		out[i] = fmt.Sprintf("scopeplane-shard-%d.shards.svc:18000", i)
	}
	return out
}

// shardedFleet is the replicas of each shard by shard, on one API server.
type shardedFleet struct {
	t      *testing.T
	f      *fleet
	shards [][]*replica
	keys   []model.Key
	// with changes every replica's options.
	with []func(*controlplane.Options)
}

// startShards starts, for each shard i, the replicas named names[i], all
// campaigning for Leases named after lease.
func (sf *shardedFleet) startShards(names [][]string) {
	sf.t.Helper()
	sf.shards = make([][]*replica, len(names))
	addrs := shardAddresses(len(names))
	for i, shardNames := range names {
		for _, n := range shardNames {
			sf.shards[i] = append(sf.shards[i], startShardReplica(sf.t, sf.f.env, sf.f.ns+"-"+n, sf.f.lease, shard.Shards{Index: i, Addresses: addrs}, sf.with...))
		}
	}
}

func (sf *shardedFleet) stopAll() {
	for _, rs := range sf.shards {
		for _, r := range rs {
			r.stop()
		}
	}
}

// holdOnlyTheirShards reports whether every replica's store holds exactly
// its shard's scopes, built.
func (sf *shardedFleet) holdOnlyTheirShards() (bool, string) {
	for i, rs := range sf.shards {
		for _, r := range rs {
			for _, k := range sf.keys {
				held := r.cp.Store.Get(k) != nil
				if own := shard.Of(k, len(sf.shards)) == i; held != own {
					return false, fmt.Sprintf("replica %s of shard %d holds scope %s: %v; its shard is %d", r.name, i, k, held, shard.Of(k, len(sf.shards)))
				}
			}
		}
	}
	return true, ""
}

// bootstrapsNameTheirShards reports whether every scope's bootstrap
// ConfigMap names its shard's address, and its status was written.
func (sf *shardedFleet) bootstrapsNameTheirShards() (bool, string) {
	addrs := shardAddresses(len(sf.shards))
	for _, k := range sf.keys {
		cm := &corev1.ConfigMap{}
		if err := sf.f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: k.Namespace, Name: bootstrap.ConfigMapName(k.Name)}, cm); err != nil {
			return false, fmt.Sprintf("scope %s's bootstrap ConfigMap: %v", k, err)
		}
		// The Envoy bootstrap names the host and the port apart.
		host := func(addr string) string { return strings.Split(addr, ":")[0] }
		want := addrs[shard.Of(k, len(sf.shards))]
		if !strings.Contains(cm.Data[bootstrap.EnvoyKey], "address: "+host(want)+"\n") {
			return false, fmt.Sprintf("scope %s's Envoy bootstrap does not name its shard's address %s:\n%s", k, want, cm.Data[bootstrap.EnvoyKey])
		}
		for i, a := range addrs {
			if a != want && strings.Contains(cm.Data[bootstrap.EnvoyKey], host(a)) {
				return false, fmt.Sprintf("scope %s's Envoy bootstrap names shard %d's address %s", k, i, a)
			}
		}
		st, err := sf.f.scopeStatus(k.Name)
		if err != nil {
			return false, err.Error()
		}
		if st.ConnectedProxies == nil {
			return false, fmt.Sprintf("scope %s has no status yet", k)
		}
	}
	return true, ""
}

// oneLeaderPerShard reports whether each shard has exactly one leader
// among its replicas, holding a Lease of its own: shard 0 the unsharded
// one, so that it and an unsharded leader never lead at once.
func (sf *shardedFleet) oneLeaderPerShard() (bool, string) {
	for i, rs := range sf.shards {
		leaders := 0
		for _, r := range rs {
			if r.leads() {
				leaders++
			}
		}
		if leaders != 1 {
			return false, fmt.Sprintf("shard %d has %d leaders among its %d replicas", i, leaders, len(rs))
		}
		lease := &coordinationv1.Lease{}
		name := sf.f.lease // shard 0's is the unsharded Lease
		if i > 0 {
			name = fmt.Sprintf("%s-shard-%d", sf.f.lease, i)
		}
		if err := sf.f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, lease); err != nil {
			return false, fmt.Sprintf("shard %d's Lease %s: %v", i, name, err)
		}
	}
	return true, ""
}

// evented names the objects of f's namespace with an Event of reason (and
// of type eventType, unless empty).
func (f *fleet) evented(reason, eventType string) (map[string]bool, error) {
	var list eventsv1.EventList
	if err := f.env.Client.List(context.Background(), &list, client.InNamespace(f.ns)); err != nil {
		return nil, err
	}
	told := map[string]bool{}
	for _, e := range list.Items {
		if e.Reason == reason && (eventType == "" || e.Type == eventType) {
			told[e.Regarding.Name] = true
		}
	}
	return told, nil
}

// createScopes creates n SotW scopes of f's namespace, scope-0 to
// scope-<n-1>, each selecting the fleet's Services, and returns their keys.
func createScopes(t *testing.T, f *fleet, n int) []model.Key {
	t.Helper()
	var keys []model.Key
	for i := range n {
		k := model.Key{Namespace: f.ns, Name: fmt.Sprintf("scope-%d", i)}
		ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolSotW,
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "fleet"}}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		}}
		if err := f.env.Client.Create(context.Background(), ps); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

// runProxy runs a SotW proxy of scope k on r until the test ends, and
// returns it.
func runProxy(t *testing.T, r *replica, k model.Key) *adsclient.Client {
	t.Helper()
	c := adsclient.New(testkit.WildcardClient(adsclient.SotW, testkit.Node("proxy-"+k.Name, k.String())))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, r.conn) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// TestShardsDivideTheScopes runs two shards on one API server, shard 0 of
// two replicas and shard 1 of one, under twelve scopes. Each replica holds
// only its shard's scopes; each shard elects its own leader, which writes
// its scopes' status and bootstrap ConfigMaps, naming the shard's address;
// a proxy that reaches the wrong shard is refused with the right shard's
// address; the status counts a proxy on either replica of its shard. Then
// the replicas restart as three shards: the scopes the new shard takes
// move to it (bootstraps, status, what each replica holds), the others
// stay, and a proxy still dialling its scope's old shard is told the new
// one.
func TestShardsDivideTheScopes(t *testing.T) {
	env := startEnv(t)
	f := newFleet(t, env, "shards", []string{"web", "api"}, nil)
	sf := &shardedFleet{t: t, f: f}
	for _, n := range scopeNames {
		sf.keys = append(sf.keys, model.Key{Namespace: f.ns, Name: n})
	}
	sf.keys = append(sf.keys, createScopes(t, f, 10)...)
	var of [2][]model.Key // the scopes of each shard, of two
	for _, k := range sf.keys {
		of[shard.Of(k, 2)] = append(of[shard.Of(k, 2)], k)
	}
	if len(of[0]) == 0 || len(of[1]) == 0 {
		t.Fatalf("the scopes fall on one shard (%v): the test needs both", of)
	}
	sf.startShards([][]string{{"a", "b"}, {"c"}})
	testkit.Eventually(t, "each replica holding its shard's scopes only", sf.holdOnlyTheirShards)
	testkit.Eventually(t, "one leader per shard", sf.oneLeaderPerShard)
	testkit.Eventually(t, "every scope's bootstrap naming its shard, and its status written", sf.bootstrapsNameTheirShards)

	// A proxy of shard 0's scope on shard 1 is told where to go.
	wrong := runProxy(t, sf.shards[1][0], of[0][0])
	testkit.Eventually(t, "the proxy on the wrong shard refused", func() (bool, string) {
		err := wrong.Err()
		st := status.Convert(err)
		want := fmt.Sprintf("is served by shard 0 of 2, at %s", shardAddresses(2)[0])
		return err != nil && st.Code() == codes.FailedPrecondition && strings.Contains(st.Message(), want), fmt.Sprint(err)
	})
	if n := sf.shards[1][0].cp.Feedback.Get(model.Key{}).Refused[server.RefusedWrongShard]; n == 0 {
		t.Errorf("shard 1 counted no %s refusal", server.RefusedWrongShard)
	}
	// A proxy on each replica of shard 0, and one on shard 1, are counted
	// by their shards' leaders.
	onShard0 := of[0][0]
	for _, r := range sf.shards[0] {
		runProxy(t, r, onShard0)
	}
	onShard1 := of[1][0]
	runProxy(t, sf.shards[1][0], onShard1)
	testkit.Eventually(t, "each shard's leader counting its scopes' proxies on every replica of the shard", func() (bool, string) {
		for k, want := range map[model.Key]int32{onShard0: 2, onShard1: 1} {
			st, err := f.scopeStatus(k.Name)
			if err != nil {
				return false, err.Error()
			}
			if got := ptr.Deref(st.ConnectedProxies, -1); got != want {
				return false, fmt.Sprintf("scope %s: status.connectedProxies %d, want %d", k, got, want)
			}
		}
		return true, ""
	})

	// A third shard joins: every replica restarts with the new count, as
	// the chart's rollout makes them.
	sf.stopAll()
	sf.startShards([][]string{{"a"}, {"c"}, {"d"}})
	var moved []model.Key
	for _, k := range sf.keys {
		before, after := shard.Of(k, 2), shard.Of(k, 3)
		if before != after {
			if after != 2 {
				t.Fatalf("scope %s moved from shard %d to shard %d, not to the new shard", k, before, after)
			}
			moved = append(moved, k)
		}
	}
	if len(moved) == 0 {
		t.Fatal("no scope moved to the third shard: the test needs one")
	}
	testkit.Eventually(t, "each replica of three shards holding its shard's scopes only", sf.holdOnlyTheirShards)
	testkit.Eventually(t, "one leader per shard of three", sf.oneLeaderPerShard)
	testkit.Eventually(t, "every bootstrap naming its shard of three", sf.bootstrapsNameTheirShards)
	// The moved scopes, and only they, carry an Event saying so.
	testkit.Eventually(t, "a ShardMoved Event on each moved scope", func() (bool, string) {
		told, err := f.evented(bootstrapconfig.ShardMovedReason, "")
		if err != nil {
			return false, err.Error()
		}
		for _, k := range sf.keys {
			if isMoved := slices.Contains(moved, k); told[k.Name] != isMoved {
				return false, fmt.Sprintf("scope %s: moved %v, ShardMoved Event %v", k, isMoved, told[k.Name])
			}
		}
		return true, ""
	})
	// A proxy of a moved scope that still dials its old shard.
	old := shard.Of(moved[0], 2)
	stale := runProxy(t, sf.shards[old][0], moved[0])
	testkit.Eventually(t, "the moved scope's proxy on its old shard told the new one", func() (bool, string) {
		err := stale.Err()
		want := fmt.Sprintf("is served by shard 2 of 3, at %s", shardAddresses(3)[2])
		return err != nil && strings.Contains(status.Convert(err).Message(), want), fmt.Sprint(err)
	})
}

// TestShardCountChangeOverlap runs the replicas of two shard counts at once,
// as a rollout from two shards to three does: the new count's replicas,
// started later, write the bootstraps of the scopes that move, and the old
// count's leaders leave them alone instead of writing them back in turn.
// Every bootstrap names its shard of three, and stays so while both run.
func TestShardCountChangeOverlap(t *testing.T) {
	env := startEnv(t)
	f := newFleet(t, env, "overlap", []string{"web"}, nil)
	old := &shardedFleet{t: t, f: f}
	old.keys = createScopes(t, f, 12)
	old.startShards([][]string{{"old-a"}, {"old-b"}})
	testkit.Eventually(t, "every bootstrap naming its shard of two", old.bootstrapsNameTheirShards)

	next := &shardedFleet{t: t, f: f, keys: old.keys}
	next.startShards([][]string{{"new-a"}, {"new-b"}, {"new-c"}})
	testkit.Eventually(t, "every bootstrap naming its shard of three, both counts running", next.bootstrapsNameTheirShards)
	versions := func() map[model.Key]string {
		out := map[model.Key]string{}
		for _, k := range next.keys {
			cm := &corev1.ConfigMap{}
			if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: k.Namespace, Name: bootstrap.ConfigMapName(k.Name)}, cm); err != nil {
				t.Fatal(err)
			}
			out[k] = cm.ResourceVersion
		}
		return out
	}
	before := versions()
	// Both counts' leaders keep running; a fight would rewrite the moved
	// scopes' ConfigMaps many times a second.
	time.Sleep(3 * time.Second)
	if ok, why := next.bootstrapsNameTheirShards(); !ok {
		t.Fatalf("with both counts running: %s", why)
	}
	for k, rv := range versions() {
		if rv != before[k] {
			t.Errorf("scope %s's bootstrap ConfigMap was written again (resourceVersion %s, then %s) while both counts ran", k, before[k], rv)
		}
	}
}

// TestAShardWithoutALeaderIsShownOnItsScopes runs two shards of one replica
// each. When shard 1's replica crashes, leaving its Lease to expire, shard
// 0's leader marks shard 1's scopes Ready=False, ShardAbsent, naming the
// shard and its Lease, and leaves its own alone; once a replica of shard 1
// is back, its leader writes its scopes' status anew.
func TestAShardWithoutALeaderIsShownOnItsScopes(t *testing.T) {
	env := startEnv(t)
	f := newFleet(t, env, "absent", []string{"web"}, nil)
	sf := &shardedFleet{t: t, f: f, with: []func(*controlplane.Options){func(o *controlplane.Options) { o.ShardAbsentAfter = time.Second }}}
	sf.keys = createScopes(t, f, 8)
	var of [2][]model.Key
	for _, k := range sf.keys {
		of[shard.Of(k, 2)] = append(of[shard.Of(k, 2)], k)
	}
	if len(of[0]) == 0 || len(of[1]) == 0 {
		t.Fatalf("the scopes fall on one shard (%v): the test needs both", of)
	}
	ready := func(k model.Key) (*metav1.Condition, error) {
		st, err := f.scopeStatus(k.Name)
		if err != nil {
			return nil, err
		}
		return meta.FindStatusCondition(st.Conditions, xdsv1alpha1.ConditionReady), nil
	}
	// none reports whether no scope says its shard is absent.
	none := func() (bool, string) {
		for _, k := range sf.keys {
			c, err := ready(k)
			if err != nil {
				return false, err.Error()
			}
			if c == nil || c.Reason == xdsv1alpha1.ReasonShardAbsent {
				return false, fmt.Sprintf("scope %s (shard %d): Ready %+v", k, shard.Of(k, 2), c)
			}
		}
		return true, ""
	}
	sf.startShards([][]string{{"a"}, {"b"}})
	testkit.Eventually(t, "every scope's bootstrap naming its shard, and its status written", sf.bootstrapsNameTheirShards)
	testkit.Eventually(t, "every scope Ready as its own shard's leader wrote it", none)

	sf.shards[1][0].kill()
	lease := fmt.Sprintf("default/%s-shard-1", f.lease)
	testkit.Eventually(t, "shard 1's scopes marked ShardAbsent by shard 0's leader, shard 0's not", func() (bool, string) {
		for _, k := range sf.keys {
			c, err := ready(k)
			if err != nil {
				return false, err.Error()
			}
			if shard.Of(k, 2) == 0 {
				if c == nil || c.Reason == xdsv1alpha1.ReasonShardAbsent {
					return false, fmt.Sprintf("scope %s of shard 0, whose leader runs: Ready %+v", k, c)
				}
				continue
			}
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != xdsv1alpha1.ReasonShardAbsent ||
				!strings.Contains(c.Message, "shard 1 of 2 has had no leader since") || !strings.Contains(c.Message, lease) {
				return false, fmt.Sprintf("scope %s of shard 1: Ready %+v", k, c)
			}
		}
		return true, ""
	})

	testkit.Eventually(t, "a Warning Event ShardAbsent on each of shard 1's scopes", func() (bool, string) {
		told, err := f.evented(xdsv1alpha1.ReasonShardAbsent, corev1.EventTypeWarning)
		if err != nil {
			return false, err.Error()
		}
		for _, k := range sf.keys {
			if told[k.Name] != (shard.Of(k, 2) == 1) {
				return false, fmt.Sprintf("scope %s of shard %d: a ShardAbsent Event %v", k, shard.Of(k, 2), told[k.Name])
			}
		}
		return true, ""
	})

	sf.shards[1] = []*replica{startShardReplica(t, env, f.ns+"-b2", f.lease, shard.Shards{Index: 1, Addresses: shardAddresses(2)}, sf.with...)}
	testkit.Eventually(t, "shard 1's new leader writing its scopes' status over the mark", none)

	// A mark that lands after the shard's leader wrote (shard 0's leader
	// judged on a Lease read just before the leader came back) is written
	// over too: the leader reacts to it, and compares with it.
	k1 := of[1][0]
	ps := &xdsv1alpha1.ProxyScope{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: k1.Namespace, Name: k1.Name}, ps); err != nil {
		t.Fatal(err)
	}
	before := ps.DeepCopy()
	meta.SetStatusCondition(&ps.Status.Conditions, metav1.Condition{Type: xdsv1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: xdsv1alpha1.ReasonShardAbsent, Message: "marked late", ObservedGeneration: ps.Generation})
	if err := env.Client.Status().Patch(context.Background(), ps, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "shard 1's leader writing over a mark that came after its write", none)

	// While replicas of another shard count run (a change of the count
	// rolling out, whose Leases share names with this count's), nothing
	// is marked; once they are gone, the absent shard's scopes are.
	other := startShardReplica(t, env, f.ns+"-x", f.lease, shard.Shards{Index: 2, Addresses: shardAddresses(3)}, sf.with...)
	testkit.Eventually(t, "the other count's replica publishing its feedback", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: replicafeedback.ConfigMapName(other.name)}, cm); err != nil {
			return false, err.Error()
		}
		return cm.Labels[replicafeedback.ShardsLabel] == "3", fmt.Sprintf("labels %v", cm.Labels)
	})
	sf.shards[1][0].kill()
	// Past the Lease's expiry (2 s) and the wait (1 s) twice over.
	time.Sleep(2 * (leaseDuration + time.Second))
	for _, k := range of[1] {
		if c, err := ready(k); err != nil || c == nil || c.Reason == xdsv1alpha1.ReasonShardAbsent {
			t.Fatalf("scope %s marked while a replica of another shard count runs: Ready %+v (%v)", k, c, err)
		}
	}
	other.stop()
	testkit.Eventually(t, "shard 1's scopes marked once only this count's replicas run", func() (bool, string) {
		for _, k := range of[1] {
			c, err := ready(k)
			if err != nil {
				return false, err.Error()
			}
			if c == nil || c.Reason != xdsv1alpha1.ReasonShardAbsent {
				return false, fmt.Sprintf("scope %s of shard 1: Ready %+v", k, c)
			}
		}
		return true, ""
	})
}
