package main

import (
	"os"
	"strings"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestMain lets the test binary play the control-plane process, as the bench
// binary does: the harness re-executes itself with serveEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		args := os.Args[1:]
		if len(args) > 0 && args[0] == "serve" {
			args = args[1:]
		}
		os.Exit(serveMain(args))
	}
	os.Exit(m.Run())
}

// TestQuickCorrectness runs bench-quick's checks on a smaller world: every
// cell (both control planes, both protocols, both layouts) through the
// initial sync, every event and a restart, with every proxy converging and
// holding exactly the truth after each. It asserts no timing.
func TestQuickCorrectness(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns control-plane processes")
	}
	p := Presets["tiny"]
	var log strings.Builder
	results, header := run(p.Cells([]string{"baseline", "scopeplane"}, []model.Protocol{model.SotW, model.Delta}),
		RunOptions{EndpointEvents: p.EndpointEvents, Timeout: p.Timeout, Log: &log}, "go test ./hack/bench")
	for _, r := range results {
		if r.Err != "" {
			t.Errorf("%s: %s", r.Cell, r.Err)
			continue
		}
		if len(r.Phases) != 4+p.EndpointEvents {
			t.Errorf("%s: %d phases, want %d", r.Cell, len(r.Phases), 4+p.EndpointEvents)
		}
		for _, ph := range r.Phases {
			if ph.Failed > 0 {
				t.Errorf("%s %s: %d proxies late or wrong: %s", r.Cell, ph.Name, ph.Failed, strings.Join(ph.Errors, "; "))
			}
			if ph.Affected == 0 {
				t.Errorf("%s %s: the event affected no proxy", r.Cell, ph.Name)
			}
			if ph.Name == "restart" && r.Protocol == model.Delta && ph.Resources != 0 {
				t.Errorf("%s: a delta reconnect was sent %d resources, though none changed", r.Cell, ph.Resources)
			}
		}
	}
	var report strings.Builder
	Report(&report, results, header)
	if !strings.Contains(report.String(), "| scopeplane SotW scoped S=60 N=10 | endpoint |") {
		t.Errorf("the report lacks a row:\n%s", report.String())
	}
	if t.Failed() {
		t.Log(log.String())
	}
}

// TestLimit checks the limit against hand-built expectations: SotW resends
// the whole set of a changed full-state type, delta only what changed.
func TestLimit(t *testing.T) {
	w := NewWorld(WorldParams{Services: 40, Layout: Unscoped, Protocol: model.SotW})
	before, err := w.Truth(w.Scopes[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Apply(EvEndpoint); err != nil {
		t.Fatal(err)
	}
	after, err := w.Truth(w.Scopes[0])
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(before, after)
	if len(d) != 1 || d[0].T != xdstype.Endpoint || d[0].Name != "ns-0/svc-0:80" {
		t.Fatalf("one endpoint change gave the diff %+v", d)
	}
	sotw, delta := limitBytes(model.SotW, after, d), limitBytes(model.Delta, after, d)
	body := len(after[xdstype.Endpoint]["ns-0/svc-0:80"].Body)
	// Two type URLs (the response's and the Any's), a version and a nonce.
	overhead := 2*len(xdstype.Endpoint.URL()) + len(limitVersion) + len(limitNonce)
	if sotw < body+overhead || sotw > body+overhead+16 || delta <= sotw {
		t.Errorf("limit for one assignment of %d bytes: SotW %d, delta %d", body, sotw, delta)
	}

	if _, err := w.Apply(EvAddRemove); err != nil {
		t.Fatal(err)
	}
	next, err := w.Truth(w.Scopes[0])
	if err != nil {
		t.Fatal(err)
	}
	d = Diff(after, next)
	all := 0
	for _, r := range next[xdstype.Cluster] {
		all += len(r.Body)
	}
	sotw, delta = limitBytes(model.SotW, next, d), limitBytes(model.Delta, next, d)
	if sotw < all {
		t.Errorf("SotW limit %d after a cluster was added is below the full cluster set (%d bytes)", sotw, all)
	}
	// Delta carries one cluster instead of forty.
	if sotw-delta < all/2 {
		t.Errorf("delta limit %d is not far below SotW's %d after a cluster was added (cluster set: %d bytes)", delta, sotw, all)
	}
}

// TestWorldIsDeterministic checks what a restart relies on: two worlds built
// from the same parameters and events are equal.
func TestWorldIsDeterministic(t *testing.T) {
	p := WorldParams{Services: 100, Layout: Scoped, Protocol: model.Delta}
	a, b := NewWorld(p), NewWorld(p)
	for _, ev := range []string{EvEndpoint, EvDrain, EvAddRemove} {
		if _, err := a.Apply(ev); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	for i, sc := range a.Scopes {
		ta, err := a.Truth(sc)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := b.Truth(b.Scopes[i])
		if err != nil {
			t.Fatal(err)
		}
		if d := Diff(ta, tb); len(d) != 0 {
			t.Errorf("scope %s: worlds differ: %v", sc.Key, d)
		}
		if i < numScopes && ta.Size() == 0 {
			t.Errorf("scope %s is empty", sc.Key)
		}
	}
}
