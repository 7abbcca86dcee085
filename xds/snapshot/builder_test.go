package snapshot

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestNothingIsBuiltBeforeTheCatalogIsWhole fills the catalog while the
// builder runs and the initial sync is not over, as a start does: nothing
// may be built until it is (nothing is served before), and then the whole
// scope is built once.
func TestNothingIsBuiltBeforeTheCatalogIsWhole(t *testing.T) {
	cat, store := catalog.New(), NewStore()
	b := NewBuilder(cat, store, 0)
	synced := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.Run(ctx, synced) }()
	cat.UpsertScope(&model.Scope{Key: key, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}}})
	for i := range 20 {
		cat.UpsertService(testkit.Service("shop", fmt.Sprint("svc", i), "10.0.0.1"))
	}
	// A builder that takes the catalog's changes as they come has built
	// the scope long before this ends; one that waits never does.
	if built, _ := testkit.Poll(time.Second, func() (bool, string) { return store.Get(key) != nil, "" }); built {
		t.Fatal("the builder built the scope before the catalog held the whole cluster")
	}
	close(synced)
	<-b.Built()
	rev, clusters := 0, 0
	store.Get(key).Read(func(v View) { rev, clusters = int(v.Rev()), v.Len(xdstype.Cluster) })
	if rev != 1 || clusters != 20 {
		t.Errorf("after the sync the scope is at revision %d with %d clusters, want revision 1 with 20", rev, clusters)
	}
}

func TestNextWaitWidensUnderChurnOnly(t *testing.T) {
	const base = 10 * time.Millisecond
	// Changes every 20 ms, each within the widest window of the build
	// before: the wait doubles up to ten times base and stays there.
	wait := nextWait(0, base, time.Hour)
	var got []time.Duration
	for range 6 {
		got = append(got, wait)
		wait = nextWait(wait, base, 20*time.Millisecond)
	}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits under churn %v, want %v ms", got, want)
		}
	}
	// A quiet spell as long as the widest window: back to base.
	if w := nextWait(100*time.Millisecond, base, 100*time.Millisecond); w != base {
		t.Errorf("after a quiet spell the wait is %v, want %v", w, base)
	}
	// No window: never wait.
	if w := nextWait(0, 0, 0); w != 0 {
		t.Errorf("with no window the wait is %v", w)
	}
}

// TestScopesAppliedInParallelAsOneByOne checks that a batch whose scopes
// are applied in parallel (as a start's first build is) stores what
// applying them one by one stores, though the scopes share the Services'
// messages (and those messages share their read-only parts): every
// resource at the same version with the same bytes, every scope at the
// same version. Run with -race, it also checks that marshalling shared
// messages at once is safe.
func TestScopesAppliedInParallelAsOneByOne(t *testing.T) {
	world := func() []catalog.Update {
		cat := catalog.New()
		for i := range 8 {
			mode := model.ListenerEnvoy
			if i%2 == 1 {
				mode = model.ListenerProxylessGRPC
			}
			cat.UpsertScope(&model.Scope{Key: model.Key{Namespace: "shop", Name: fmt.Sprint("scope", i)}, Protocol: model.Delta, Listener: model.Listener{Mode: mode, Port: 8080},
				Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}}})
		}
		for i := range 200 {
			cat.UpsertService(testkit.Service("shop", fmt.Sprint("svc", i), "10.0.0.1", fmt.Sprintf("10.0.1.%d", i%250)))
		}
		return cat.Take()
	}
	parallel, oneByOne := NewStore(), NewStore()
	NewBuilder(nil, parallel, 0).Apply(world())
	b := NewBuilder(nil, oneByOne, 0)
	for _, u := range world() {
		b.Apply([]catalog.Update{u})
	}
	held := func(st *Store, k model.Key) map[string]string {
		out := map[string]string{}
		st.Get(k).Read(func(v View) {
			out["scope"] = v.Version()
			for t := range xdstype.Count {
				v.All(t, func(r *Resource) { out[t.String()+" "+r.Name] = r.Version + " " + string(r.Value()) })
			}
		})
		return out
	}
	keys := parallel.Keys()
	if len(keys) != 8 || len(oneByOne.Keys()) != 8 {
		t.Fatalf("%d and %d scopes stored, want 8", len(keys), len(oneByOne.Keys()))
	}
	for _, k := range keys {
		p, o := held(parallel, k), held(oneByOne, k)
		if len(p) < 400 || !maps.Equal(p, o) {
			t.Errorf("%s: applied in parallel, %d entries; one by one, %d; equal: %v", k, len(p), len(o), maps.Equal(p, o))
		}
	}
}

// TestApplyLetsGoOfEachUpdate applies a start's batch, every scope of a
// catalog at once: each scope is built, and each update is left with its
// key alone, so that what the batch named (maps of every resource of every
// scope) is not held until the last scope is built, on top of the
// snapshots already made.
func TestApplyLetsGoOfEachUpdate(t *testing.T) {
	cat, store := catalog.New(), NewStore()
	for k := range 3 {
		cat.UpsertScope(testkit.WorldTeam(k))
		for i := range 5 {
			svc := testkit.Service(fmt.Sprint("ns-", k), fmt.Sprint("svc-", i), "10.0.0.1")
			svc.Labels = map[string]string{"team": fmt.Sprint("team-", k)}
			cat.UpsertService(svc)
		}
	}
	updates := cat.Take()
	if len(updates) != 3 {
		t.Fatalf("the catalog's first batch has %d updates, want 3", len(updates))
	}
	keys := make([]model.Key, len(updates))
	for i := range updates {
		keys[i] = updates[i].Key
	}
	NewBuilder(cat, store, 0).ApplyWhole(updates)
	for i, k := range keys {
		sc := store.Get(k)
		if sc == nil {
			t.Fatalf("scope %s was not built", k)
		}
		clusters := 0
		sc.Read(func(v View) { clusters = v.Len(xdstype.Cluster) })
		if clusters != 5 {
			t.Errorf("scope %s serves %d clusters, want 5", k, clusters)
		}
		if u := updates[i]; !reflect.DeepEqual(u, catalog.Update{Key: k}) {
			t.Errorf("update %d still holds more than its key after it was applied: %+v", i, u)
		}
	}
}
