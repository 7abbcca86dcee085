package server_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// moving runs a client's streams one after another, as a proxy does: when
// one ends it reports how, and reconnects at once, or, when gated, only once
// the test hands it the connection to use next.
type moving struct {
	c      *adsclient.Client
	ends   chan error
	resume chan grpc.ClientConnInterface
	cancel context.CancelFunc
	done   chan struct{}
}

func startMoving(c *adsclient.Client, conn grpc.ClientConnInterface, gated bool) *moving {
	ctx, cancel := context.WithCancel(context.Background())
	m := &moving{c: c, ends: make(chan error, 1000), resume: make(chan grpc.ClientConnInterface), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			err := c.Run(ctx, conn)
			if ctx.Err() != nil {
				return
			}
			m.ends <- err
			if !gated {
				// A proxy's reconnect backoff, so that a broken server
				// does not make this loop spin.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			select {
			case conn = <-m.resume:
			case <-ctx.Done():
				return
			}
		}
	}()
	return m
}

// end waits for the current stream to end and returns how it ended.
func (m *moving) end(t *testing.T, who string) error {
	t.Helper()
	select {
	case err := <-m.ends:
		t.Logf("%s: stream ended: %v", who, err)
		return err
	case <-time.After(testkit.Timeout):
		t.Fatalf("%s: the stream did not end within %v", who, testkit.Timeout)
		return nil
	}
}

func (m *moving) stop(t *testing.T) {
	m.cancel()
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		t.Errorf("Run did not return 10s after its context ended")
	}
}

// holdsTruth describes how what c holds differs from the truth of its
// scope as cp serves it, or returns "" when it holds exactly the truth, at
// the versions cp serves: a delta client's resource versions are what it
// claims when it reconnects, a SotW client's the type's version_info (the
// client subscribes to every type by wildcard, so it is the type's
// version). A SotW resource keeps the version of the response that brought
// it: a reconnect at the served version sends no listener or cluster
// again, and the assignments and route configurations at that version.
func holdsTruth(c *adsclient.Client, tr truth, cp *controlPlane, key model.Key, delta bool) string {
	var b strings.Builder
	sc := cp.Store.Get(key)
	if sc == nil {
		return "scope not served"
	}
	for _, t := range allTypes {
		if !delta && snapshotType(t).Info().DeltaOnly {
			continue // a SotW client, like Envoy, never asks for VHDS
		}
		held := c.State(t)
		diffHeld(&b, shortType(t), held, tr[t], nil)
		sc.Read(func(v snapshot.View) {
			if !delta {
				if got, want := c.VersionInfo(t), v.TypeVersion(snapshotType(t)); got != want {
					fmt.Fprintf(&b, "  %s: at version_info %s, served at %s\n", shortType(t), got, want)
				}
				return
			}
			for name, h := range held {
				if r := v.Get(snapshotType(t), name); r != nil && h.Version != r.Version {
					fmt.Fprintf(&b, "  %s %q: held at version %s, served at %s\n", shortType(t), name, h.Version, r.Version)
				}
			}
		})
	}
	return b.String()
}

// sentSince returns, per type, the names the responses after event from
// carried and the removals they announced, and how many responses of each
// type there were.
func sentSince(c *adsclient.Client, from int) (names, removed map[string][]string, responses map[string]int) {
	names, removed, responses = map[string][]string{}, map[string][]string{}, map[string]int{}
	evs := c.Events()
	for _, ev := range evs[min(from, len(evs)):] {
		names[ev.TypeURL] = append(names[ev.TypeURL], ev.Names...)
		removed[ev.TypeURL] = append(removed[ev.TypeURL], ev.Removed...)
		responses[ev.TypeURL]++
	}
	return names, removed, responses
}

// answeredEveryType reports whether the stream that began at event from
// got its first response of every type: a new stream is answered on each
// first request, even when the answer is empty.
func answeredEveryType(c *adsclient.Client, from int) (bool, string) {
	_, _, responses := sentSince(c, from)
	for _, t := range allTypes {
		if responses[t] == 0 {
			return false, fmt.Sprintf("responses per type since #%d: %v", from, responses)
		}
	}
	return true, ""
}

// changedNames returns, per type, the names whose content differs between
// two truths or that only after has; and those only before has.
func changedNames(before, after truth) (changed, gone map[string][]string) {
	changed, gone = map[string][]string{}, map[string][]string{}
	for _, t := range allTypes {
		for _, name := range slices.Sorted(maps.Keys(after[t])) {
			if old, ok := before[t][name]; !ok || !bytes.Equal(old, after[t][name]) {
				changed[t] = append(changed[t], name)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(before[t])) {
			if _, ok := after[t][name]; !ok {
				gone[t] = append(gone[t], name)
			}
		}
	}
	return changed, gone
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestMaxConnectionAgeMovesProxies ages connections out after about two
// seconds: a delta and a SotW client, each on its own connection, are moved
// off it (GOAWAY, then the connection closed after the grace) and
// reconnect. The delta client declares what it holds and is sent nothing it
// holds at the served version: no resource at all when nothing changed, only
// the changed endpoints when a Service changed while it was away. The SotW
// client ends holding exactly the truth.
func TestMaxConnectionAgeMovesProxies(t *testing.T) {
	w := newWorld()
	w.namespaces["default"] = map[string]string{}
	for _, svc := range []*model.Service{
		testkit.Service("default", "a", "10.0.0.1", "10.0.0.2"),
		testkit.Service("default", "b", "10.0.0.3"),
		testkit.Service("default", "c", "10.0.0.4", "10.0.0.5"),
	} {
		w.services[svc.Key] = svc
	}
	deltaKey := model.Key{Namespace: "default", Name: "delta"}
	sotwKey := model.Key{Namespace: "default", Name: "sotw"}
	for key, p := range map[model.Key]model.Protocol{deltaKey: model.Delta, sotwKey: model.SotW} {
		w.scopes[key] = &model.Scope{
			Key: key, Generation: 1, Protocol: p,
			Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
			Selections: []model.Selection{{Namespace: "default", Selector: labels.Everything()}},
		}
	}
	cp, err := startControlPlane(w, server.Options{MaxConnectionAge: 2 * time.Second, MaxConnectionAgeGrace: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cp.stop(); err != nil {
			t.Error(err)
		}
	}()
	addr := cp.conn.Target()
	tr := func(key model.Key) truth {
		t.Helper()
		out, err := w.truthOf(key, "")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	delta := adsclient.New(testkit.WildcardClient(adsclient.Delta, testkit.Node("delta-proxy", deltaKey.String())))
	sotw := adsclient.New(testkit.WildcardClient(adsclient.SotW, testkit.Node("sotw-proxy", sotwKey.String())))
	dm := startMoving(delta, dial(t, addr), true)
	defer dm.stop(t)
	sm := startMoving(sotw, dial(t, addr), false)
	defer sm.stop(t)

	deltaTruth := tr(deltaKey)
	testkit.Eventually(t, "the delta client holds its scope", func() (bool, string) {
		d := holdsTruth(delta, deltaTruth, cp, deltaKey, true)
		return d == "", d
	})
	testkit.Eventually(t, "the SotW client holds its scope", func() (bool, string) {
		d := holdsTruth(sotw, tr(sotwKey), cp, sotwKey, false)
		return d == "", d
	})

	// Moved with nothing changed: the new stream is told nothing.
	if err := dm.end(t, "delta"); endCode(err) != codes.Unavailable {
		t.Fatalf("the aged-out delta stream ended with %v, want Unavailable (the connection closed after GOAWAY and the grace)", err)
	}
	from := len(delta.Events())
	dm.resume <- dial(t, addr)
	testkit.Eventually(t, "the reconnected delta stream answered for every type", func() (bool, string) {
		return answeredEveryType(delta, from)
	})
	names, removed, responses := sentSince(delta, from)
	for _, typ := range allTypes {
		if len(names[typ]) > 0 || len(removed[typ]) > 0 || responses[typ] != 1 {
			t.Errorf("after a reconnect with nothing changed, %s: %d responses carrying %v, removing %v; want one empty response",
				shortType(typ), responses[typ], names[typ], removed[typ])
		}
	}

	// Moved while a Service's endpoints change: only they are sent.
	if err := dm.end(t, "delta"); endCode(err) != codes.Unavailable {
		t.Fatalf("the aged-out delta stream ended with %v, want Unavailable", err)
	}
	a := *w.services[model.Key{Namespace: "default", Name: "a"}]
	a.Endpoints = slices.Clone(a.Endpoints)
	a.Endpoints[1].Address = "10.0.0.9"
	w.services[a.Key] = &a
	cp.Catalog.UpsertService(&a)
	cp.Sync()
	newTruth := tr(deltaKey)
	changed, gone := changedNames(deltaTruth, newTruth)
	if len(changed) == 0 || len(gone) > 0 {
		t.Fatalf("the endpoint change changed %v and removed %v of the truth; the test needs a change and no removal", changed, gone)
	}
	from = len(delta.Events())
	dm.resume <- dial(t, addr)
	testkit.Eventually(t, "the reconnected delta stream answered for every type", func() (bool, string) {
		return answeredEveryType(delta, from)
	})
	names, removed, _ = sentSince(delta, from)
	for _, typ := range allTypes {
		slices.Sort(names[typ])
		if !slices.Equal(names[typ], changed[typ]) || len(removed[typ]) > 0 {
			t.Errorf("after a reconnect across an endpoint change, %s: sent %v, removed %v; want only the changed %v",
				shortType(typ), names[typ], removed[typ], changed[typ])
		}
	}
	testkit.Eventually(t, "the delta client holds the changed scope", func() (bool, string) {
		d := holdsTruth(delta, newTruth, cp, deltaKey, true)
		return d == "", d
	})

	// The SotW client was moved too (at least twice by now), and converges.
	for i := range 2 {
		if err := sm.end(t, "sotw"); endCode(err) != codes.Unavailable {
			t.Fatalf("aged-out SotW stream %d ended with %v, want Unavailable", i+1, err)
		}
	}
	testkit.Eventually(t, "the SotW client holds exactly the truth after its moves", func() (bool, string) {
		d := holdsTruth(sotw, tr(sotwKey), cp, sotwKey, false)
		return d == "", d
	})
}

// scopeFingerprint is everything a proxy can tell about a served scope:
// its version, each type's version and each resource's name, version and
// content.
func scopeFingerprint(sc *snapshot.Snapshot) string {
	var b strings.Builder
	sc.Read(func(v snapshot.View) {
		fmt.Fprintf(&b, "scope version %s, spec %t\n", v.Version(), v.Spec() != nil)
		for _, u := range allTypes {
			t := snapshotType(u)
			fmt.Fprintf(&b, "%s at %s:\n", shortType(u), v.TypeVersion(t))
			var lines []string
			v.All(t, func(r *snapshot.Resource) {
				lines = append(lines, fmt.Sprintf("  %s %s %x\n", r.Name, r.Version, r.Value()))
			})
			slices.Sort(lines)
			b.WriteString(strings.Join(lines, ""))
		}
	})
	return b.String()
}

// TestReplicasServeIdenticalVersions checks what lets a proxy move between
// replicas: versions are content hashes, so two replicas that saw the same
// objects serve identical versions. Replica 1 lives through a random history
// of changes, versioning after each; replica 2 starts from the end state,
// fed in another order (scopes first, then Services and namespaces in
// reverse order) and versioned once. Every scope must be identical on both,
// and a delta proxy that moves from replica 1 (stopped) to replica 2,
// declaring what it holds, is sent nothing: no resource, no removal. A SotW
// proxy moved the same way holds exactly the truth.
func TestReplicasServeIdenticalVersions(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { replicasAgree(t, seed, 100) })
	}
}

func replicasAgree(t *testing.T, seed uint64, steps int) {
	g := &generator{r: rand.New(rand.NewPCG(seed, 0))}
	// Two scopes the random steps do not touch, selecting every namespace,
	// so that the proxies moved hold much of the history's outcome.
	deltaKey := model.Key{Namespace: "ns-c", Name: "moved-delta"}
	sotwKey := model.Key{Namespace: "ns-c", Name: "moved-sotw"}
	w1 := newWorld()
	cp1, err := startControlPlane(w1, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cp1Stopped := false
	defer func() {
		if !cp1Stopped {
			_ = cp1.stop()
		}
		_ = cp1.conn.Close()
	}()
	apply := func(s step) {
		applyToWorld(w1, &s)
		feed(cp1.Catalog, &s)
		cp1.Sync()
	}
	for key, p := range map[model.Key]model.Protocol{deltaKey: model.Delta, sotwKey: model.SotW} {
		apply(step{kind: kUpsertScope, scope: &model.Scope{
			Key: key, Generation: 1, Protocol: p, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10000},
			Selections: []model.Selection{{NamespaceSelector: labels.Everything()}},
		}})
	}
	for done := 0; done < steps; {
		s := g.worldStep(w1)
		if s.kind == kDeleteScope && (s.key == deltaKey || s.key == sotwKey) {
			continue
		}
		apply(s)
		done++
	}

	cp2, err := startReplicaReordered(w1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp2.close() }()

	keys1, keys2 := cp1.Store.Keys(), cp2.Store.Keys()
	slices.SortFunc(keys1, model.Key.Compare)
	slices.SortFunc(keys2, model.Key.Compare)
	if !slices.Equal(keys1, keys2) {
		t.Fatalf("replica 1 serves scopes %v, replica 2 %v", keys1, keys2)
	}
	for _, key := range keys1 {
		f1, f2 := scopeFingerprint(cp1.Store.Get(key)), scopeFingerprint(cp2.Store.Get(key))
		if f1 != f2 {
			t.Errorf("scope %s differs between the replicas:\nreplica 1 (through the history):\n%s\nreplica 2 (from the end state):\n%s", key, f1, f2)
		}
	}

	delta := adsclient.New(testkit.WildcardClient(adsclient.Delta, testkit.Node("delta-proxy", deltaKey.String())))
	sotw := adsclient.New(testkit.WildcardClient(adsclient.SotW, testkit.Node("sotw-proxy", sotwKey.String())))
	dm := startMoving(delta, cp1.conn, true)
	defer dm.stop(t)
	sm := startMoving(sotw, cp1.conn, true)
	defer sm.stop(t)
	deltaTruth, err := w1.truthOf(deltaKey, "")
	if err != nil {
		t.Fatal(err)
	}
	sotwTruth, err := w1.truthOf(sotwKey, "")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the delta client holds its scope from replica 1", func() (bool, string) {
		d := holdsTruth(delta, deltaTruth, cp1, deltaKey, true)
		return d == "", d
	})
	testkit.Eventually(t, "the SotW client holds its scope from replica 1", func() (bool, string) {
		d := holdsTruth(sotw, sotwTruth, cp1, sotwKey, false)
		return d == "", d
	})
	held := 0
	for _, typ := range allTypes {
		held += len(delta.State(typ))
	}
	if held == 0 {
		t.Fatalf("seed %d: the delta client holds nothing, so its move would show nothing", seed)
	}
	t.Logf("%d scopes identical on both replicas; the moving delta client holds %d resources", len(keys1), held)

	// Replica 1 goes away (a rollout, a scale-down): its streams are
	// drained with Unavailable, and the proxies reconnect to replica 2.
	cp1Stopped = true
	if err := cp1.stop(); err != nil {
		t.Fatal(err)
	}
	for who, m := range map[string]*moving{"delta": dm, "sotw": sm} {
		if err := m.end(t, who); endCode(err) != codes.Unavailable {
			t.Fatalf("%s: the stream on the stopped replica ended with %v, want Unavailable", who, err)
		}
	}
	from := len(delta.Events())
	dm.resume <- cp2.conn
	sm.resume <- cp2.conn
	testkit.Eventually(t, "replica 2 answered the moved delta stream for every type", func() (bool, string) {
		return answeredEveryType(delta, from)
	})
	names, removed, responses := sentSince(delta, from)
	for _, typ := range allTypes {
		if len(names[typ]) > 0 || len(removed[typ]) > 0 || responses[typ] != 1 {
			t.Errorf("moved to replica 2 holding %d resources, %s: %d responses carrying %v, removing %v; want one empty response",
				held, shortType(typ), responses[typ], names[typ], removed[typ])
		}
	}
	if d := holdsTruth(delta, deltaTruth, cp2, deltaKey, true); d != "" {
		t.Errorf("the delta client on replica 2:\n%s", d)
	}
	testkit.Eventually(t, "the moved SotW client holds exactly the truth", func() (bool, string) {
		d := holdsTruth(sotw, sotwTruth, cp2, sotwKey, false)
		return d == "", d
	})
}

// startReplicaReordered serves w from a fresh control plane fed in an order
// other than startControlPlane's and a history's: scopes first, then
// Services and namespaces in reverse order, versioned once.
func startReplicaReordered(w *world) (*controlPlane, error) {
	return startFedControlPlane(func(cat *catalog.Catalog) {
		for _, key := range sortedKeys(w.scopes) {
			cat.UpsertScope(w.scopes[key])
		}
		svcs := sortedKeys(w.services)
		slices.Reverse(svcs)
		for _, key := range svcs {
			cat.UpsertService(w.services[key])
		}
		nss := slices.Sorted(maps.Keys(w.namespaces))
		slices.Reverse(nss)
		for _, ns := range nss {
			cat.UpsertNamespace(ns, w.namespaces[ns])
		}
	}, server.Options{})
}
