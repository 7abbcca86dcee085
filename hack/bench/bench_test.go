package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

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
// initial sync, every event, a reconnect of every stream and a restart,
// with every proxy converging and holding exactly the truth after each, and
// each cell's figure for the other protocol agreeing with the other
// protocol's cell; and a short churn (5
// changes in a second) per control plane and protocol, after which every
// proxy holds the truth and every change converged at every proxy. It
// asserts no timing.
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
		if want := 5 + p.EndpointEvents; !r.Churn.On() && len(r.Phases) != want {
			t.Errorf("%s: %d phases, want %d", r.Cell, len(r.Phases), want)
		}
		if r.Churn.On() {
			checkChurn(t, r, p.Churn.Changes())
		}
		for _, ph := range r.Phases {
			if ph.Failed > 0 {
				t.Errorf("%s %s: %d proxies late or wrong: %s", r.Cell, ph.Name, ph.Failed, strings.Join(ph.Errors, "; "))
			}
			if ph.Affected == 0 {
				t.Errorf("%s %s: the event affected no proxy", r.Cell, ph.Name)
			}
			if (ph.Name == "restart" || ph.Name == EvReconnect) && r.Protocol == model.Delta && ph.Resources != 0 {
				t.Errorf("%s: a delta reconnect was sent %d resources, though none changed", r.Cell, ph.Resources)
			}
		}
	}
	// Each cell's figure for the other protocol is that protocol's bytes.
	if rows := pricedRows(results); len(rows) != 3*(5+1) {
		t.Errorf("%d events compared between the protocols, want every event of the three layouts (18)", len(rows))
	}
	for _, d := range Disagreements(results) {
		t.Error(d)
	}
	var report strings.Builder
	Report(&report, results, header)
	for _, row := range []string{"| scopeplane SotW scoped S=60 N=10 | endpoint |", "| scopeplane Delta zoned S=60 N=10 | RSS/proxy |",
		"| baseline Delta unscoped S=60 N=10 | churn 5/s for 1s, window 10ms |", "| sustained churn: control plane ≤ 0.5 core |"} {
		if !strings.Contains(report.String(), row) {
			t.Errorf("the report lacks the row %q:\n%s", row, report.String())
		}
	}
	if t.Failed() {
		t.Log(log.String())
	}
}

// checkChurn checks a churn cell: a sync and the churn, every change
// converged at every proxy (all of the unscoped layout's proxies are
// affected by each), and versions built and sent.
func checkChurn(t *testing.T, r *Result, changes int) {
	t.Helper()
	if len(r.Phases) != 2 || r.Phases[1].Churn == nil {
		t.Errorf("%s: phases %d, want a sync and a churn", r.Cell, len(r.Phases))
		return
	}
	ph := r.Phases[1]
	c := ph.Churn
	if c.Changes != changes || len(c.ChangeLat) != changes || len(ph.Lat) != changes*r.N || ph.Affected != r.N {
		t.Errorf("%s: %d changes, %d converged, %d (change, proxy) pairs over %d affected proxies; want %d, %d, %d, %d",
			r.Cell, c.Changes, len(c.ChangeLat), len(ph.Lat), ph.Affected, changes, changes, changes*r.N, r.N)
	}
	if c.Builds < 1 || ph.Bytes == 0 || ph.Responses == 0 || c.Drained <= 0 {
		t.Errorf("%s: %d versions built, %d bytes and %d responses sent, drained after %s", r.Cell, c.Builds, ph.Bytes, ph.Responses, c.Drained)
	}
	for _, d := range ph.Lat {
		if d <= 0 {
			t.Errorf("%s: a change converged %s after it was made", r.Cell, d)
			break
		}
	}
}

// TestLimit checks the limit against hand-built expectations: SotW resends
// the whole set of a changed full-state type, delta only what changed.
func TestLimit(t *testing.T) {
	w := NewWorld(WorldParams{Services: 40, Layout: Unscoped, Protocol: model.SotW})
	before, err := w.Truth(View{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Apply(EvEndpoint); err != nil {
		t.Fatal(err)
	}
	after, err := w.Truth(View{})
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
	next, err := w.Truth(View{})
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

// TestZonedViews checks the zoned world's truths: each zone's proxies see
// their zone's endpoint of every Service, an endpoint event changes one
// zone's view only, and a zone whose endpoints drained falls back to every
// ready endpoint, as kube-proxy does.
func TestZonedViews(t *testing.T) {
	w := NewWorld(WorldParams{Services: 40, Layout: Zoned, Protocol: model.Delta})
	views := w.Views()
	if len(views) != numZones {
		t.Fatalf("%d views, want one per zone (%d)", len(views), numZones)
	}
	const svc0 = "ns-0/svc-0:80"
	truths := func() []*Truth {
		var out []*Truth
		for _, v := range views {
			tr, err := w.Truth(v)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, tr)
		}
		return out
	}
	endpoints := func(tr *Truth) []string {
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(tr[xdstype.Endpoint][svc0].Body, &cla); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range cla.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				out = append(out, l.GetLocality().GetZone()+"/"+e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
		return out
	}
	before := truths()
	for z, tr := range before {
		if got := endpoints(tr); len(got) != 1 || !strings.HasPrefix(got[0], zoneName(z)+"/") {
			t.Errorf("%s sees %v of %s, want its own zone's endpoint", zoneName(z), got, svc0)
		}
	}
	if _, err := w.Apply(EvEndpoint); err != nil {
		t.Fatal(err)
	}
	after := truths()
	for z := range views {
		d := Diff(before[z], after[z])
		if changed := len(d) > 0; changed != (z == 1) {
			t.Errorf("an endpoint of zone-b moved: %s's view changed by %v", zoneName(z), d)
		}
	}
	if _, err := w.Apply(EvDrain); err != nil {
		t.Fatal(err)
	}
	drained := truths()
	if got := endpoints(drained[0]); len(got) != 2 {
		t.Errorf("zone-a has no ready endpoint of %s left, so it sees every ready one; it sees %v", svc0, got)
	}
	if got := endpoints(drained[2]); len(got) != 1 {
		t.Errorf("zone-c still sees %v of %s, want its own endpoint", got, svc0)
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
	for i, v := range a.Views() {
		sc := a.Scopes[v.Scope]
		ta, err := a.Truth(v)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := b.Truth(b.Views()[i])
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

// TestDisagreements checks the comparison the run's exit code follows: each
// cell's figure for the other protocol against the other protocol's cell of
// the same world and events, within agreementTolerance, except a SotW
// reconnect's figure for delta, which is an upper bound.
func TestDisagreements(t *testing.T) {
	// cells builds the scopeplane SotW and Delta cells of one world whose
	// phases sent and priced what the rows say, and a baseline cell that
	// prices nothing.
	type row struct {
		event                                string
		sotwSent, asDelta, deltaSent, asSotW int64
	}
	cells := func(rows ...row) []*Result {
		sotw := &Result{Cell: Cell{Impl: "scopeplane", Protocol: model.SotW, Layout: Scoped, S: 60, N: 10}}
		delta := &Result{Cell: Cell{Impl: "scopeplane", Protocol: model.Delta, Layout: Scoped, S: 60, N: 10}}
		base := &Result{Cell: Cell{Impl: "baseline", Protocol: model.Delta, Layout: Scoped, S: 60, N: 10}}
		for _, r := range rows {
			sotw.Phases = append(sotw.Phases, &Phase{Name: r.event, Bytes: r.sotwSent, Priced: r.asDelta})
			delta.Phases = append(delta.Phases, &Phase{Name: r.event, Bytes: r.deltaSent, Priced: r.asSotW})
			base.Phases = append(base.Phases, &Phase{Name: r.event, Bytes: 1, Priced: -1})
		}
		return []*Result{base, sotw, delta}
	}
	cases := []struct {
		name    string
		results []*Result
		want    []string // substrings of each disagreement, in order
	}{
		{"exact", cells(row{"sync", 1000, 1200, 1200, 1000}, row{"endpoint", 90, 100, 100, 90}, row{"endpoint", 92, 104, 104, 92}), nil},
		{"within 1%", cells(row{"drain", 1000, 1208, 1200, 995}), nil},
		{"delta's figure 2% high", cells(row{"drain", 1000, 1224, 1200, 1000}),
			[]string{"scoped S=60 N=10 drain: the SotW cell priced delta at 1224 bytes, the Delta cell sent 1200 (1.020× off)"}},
		{"SotW's figure 2% low", cells(row{"addremove", 1000, 500, 500, 980}),
			[]string{"scoped S=60 N=10 addremove: the Delta cell priced SotW at 980 bytes, the SotW cell sent 1000 (1.020× off)"}},
		{"a figure of nothing for something sent", cells(row{"endpoint", 90, 0, 100, 90}), []string{"priced delta at 0 bytes, the Delta cell sent 100"}},
		{"repeated events are compared by their mean", cells(row{"endpoint", 90, 100, 100, 90}, row{"endpoint", 90, 140, 100, 90}),
			[]string{"endpoint (mean of 2): the SotW cell priced delta at 120 bytes, the Delta cell sent 100"}},
		{"a SotW reconnect's figure for delta is an upper bound", cells(row{"restart", 1000, 2140, 1000, 1000}), nil},
		{"an upper bound below the bytes", cells(row{"restart", 1000, 990, 1000, 1000}),
			[]string{"restart: the SotW cell priced delta at 990 bytes, below the 1000 the Delta cell sent (it is an upper bound)"}},
		{"a delta reconnect's figure for SotW is exact", cells(row{"restart", 1000, 2140, 1000, 1500}),
			[]string{"restart: the Delta cell priced SotW at 1500 bytes, the SotW cell sent 1000"}},
		{"a failed cell is not compared", func() []*Result {
			r := cells(row{"sync", 1000, 1, 1200, 1})
			r[2].Err = "did not start"
			return r
		}(), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Disagreements(c.results)
			if len(got) != len(c.want) {
				t.Fatalf("disagreements %q, want %d", got, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("disagreement %q, want it to contain %q", got[i], w)
				}
			}
			var report strings.Builder
			Report(&report, c.results, "")
			verdict := "| met |"
			if len(c.want) > 0 {
				verdict = "| **missed** |"
			}
			line := grepLine(report.String(), "| the other protocol's figure is")
			if compared := len(pricedRows(c.results)) > 0; compared != (line != "") || compared && !strings.HasSuffix(line, verdict) {
				t.Errorf("the targets row %q, want it to end in %q", line, verdict)
			}
		})
	}
}

// grepLine returns the first line of s containing sub.
func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// Plot draws each axis the unscoped cells vary along, a line per
// implementation and protocol, and leaves out what a log scale cannot show.
func TestPlot(t *testing.T) {
	var results []*Result
	for _, sz := range [][2]int{{100, 10}, {1000, 10}, {1000, 100}, {10000, 10}} {
		for _, impl := range []string{"scopeplane", "baseline"} {
			for _, proto := range []model.Protocol{model.SotW, model.Delta} {
				r := &Result{Cell: Cell{Impl: impl, Protocol: proto, Layout: Unscoped, S: sz[0], N: sz[1]}, RSSAfter: int64(sz[0]) * 1000}
				for _, cpu := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
					r.Phases = append(r.Phases, &Phase{Name: EvEndpoint, Bytes: int64(sz[0] * sz[1]), CPU: cpu * time.Duration(sz[0]), Lat: []time.Duration{time.Millisecond}})
				}
				results = append(results, r)
			}
		}
	}
	// A scoped cell and a failed one are not drawn.
	results = append(results, &Result{Cell: Cell{Impl: "scopeplane", Protocol: model.SotW, Layout: Scoped, S: 5, N: 7}},
		&Result{Cell: Cell{Impl: "scopeplane", Protocol: model.SotW, Layout: Unscoped, S: 99999, N: 10}, Err: "timed out"})
	dir := t.TempDir()
	files, err := Plot(dir, results)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("wrote %v, want vs-services.svg and vs-proxies.svg", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		svg := string(b)
		for _, want := range []string{"<svg", "bytes sent per proxy", "control-plane CPU", "convergence p99", "memory per proxy", "scopeplane SotW", "baseline Delta"} {
			if !strings.Contains(svg, want) {
				t.Errorf("%s does not show %q", filepath.Base(f), want)
			}
		}
		// Along the Services, N=10 holds three sizes (and the failed
		// cell's S is not one of them); along the proxies, S=1000 two.
		for _, gone := range []string{"99999", "S=5,", "N=7"} {
			if strings.Contains(svg, gone) {
				t.Errorf("%s shows %q, of a cell it must leave out", filepath.Base(f), gone)
			}
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "vs-services.svg")); !strings.Contains(string(b), "N=10") {
		t.Error("vs-services.svg is not drawn at N=10, the N with the most sizes")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "vs-proxies.svg")); !strings.Contains(string(b), "S=1000") {
		t.Error("vs-proxies.svg is not drawn at S=1000")
	}
}

// A panel with nothing to draw says so instead of failing the run.
func TestPlotWithoutEndpointEvents(t *testing.T) {
	var results []*Result
	for _, s := range []int{100, 1000} {
		results = append(results, &Result{Cell: Cell{Impl: "scopeplane", Protocol: model.SotW, Layout: Unscoped, S: s, N: 10}, RSSAfter: 1e6})
	}
	files, err := Plot(t.TempDir(), results)
	if err != nil || len(files) != 1 {
		t.Fatalf("wrote %v: %v", files, err)
	}
	if b, _ := os.ReadFile(files[0]); !strings.Contains(string(b), "(no data)") {
		t.Error("the endpoint panels do not say they have no data")
	}
}

// TestWorldCorrectness runs bench-world's cells on a small world (the teams
// layout over 300 Services, 200 proxies, both protocols): it builds the
// world into a real API server, runs scopeplane's operator against it and
// checks every proxy against the truth after the start, every event written
// to the API server and a restart, and every scope's status counting all
// its proxies in sync after each start; and the same in delta with the
// operator as one shard of four, serving and writing its shard's scopes.
// It asserts no timing.
func TestWorldCorrectness(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns the operator against a real API server")
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // build the world, as a first run does
	p := WorldPresets["world-tiny"]
	var log strings.Builder
	cells := append(p.Cells([]model.Protocol{model.SotW, model.Delta}, "", 1), p.Cells([]model.Protocol{model.Delta}, "", 4)...)
	for _, c := range cells {
		r := runWorldCell(c, RunOptions{Log: &log})
		if r.Err != "" {
			t.Errorf("%s: %s", c, r.Err)
			continue
		}
		var names []string
		for _, ph := range r.Phases {
			names = append(names, ph.Name)
			if ph.Failed > 0 {
				t.Errorf("%s %s: %d proxies late or wrong: %s", c, ph.Name, ph.Failed, strings.Join(ph.Errors, "; "))
			}
			if ph.Affected == 0 {
				t.Errorf("%s %s: no proxy was affected", c, ph.Name)
			}
		}
		if got, want := strings.Join(names, ","), "sync,endpoint,endpoint,endpoint,endpoint,endpoint,addservice,selector,restart"; got != want {
			t.Errorf("%s: phases %s, want %s", c, got, want)
		}
		for what, s := range map[string]StatusWrites{"first start": r.StatusStart, "restart": r.StatusRestart} {
			if s.Stale > 0 || s.Writes == 0 {
				t.Errorf("%s: statuses after the %s: %s", c, what, s)
			}
		}
		if r.Start.Built == 0 || r.Restart.Built == 0 || r.Heap["informer caches"] == 0 || r.Heap["snapshots"] == 0 {
			t.Errorf("%s: start %s, restart %s, heap %v", c, r.Start, r.Restart, r.Heap)
		}
		if !strings.Contains(r.StartPeaks, "serve:rss=") || !strings.Contains(r.StartPeaks, "events:rss=") || !strings.Contains(r.RestartPeaks, "serve:rss=") {
			t.Errorf("%s: highest resident set per phase: first start %q, restart %q", c, r.StartPeaks, r.RestartPeaks)
		}
	}
	if t.Failed() {
		t.Log(log.String())
	}
}

// TestRouteWeightsCorrectness runs the route events at a small size: every
// Service with a canary route, route 0's weights moved twice, in both
// protocols and both control planes, every proxy holding exactly the truth
// after each event and each protocol pricing the other to the byte. The
// truth of a weight change differs in route 0's Service's virtual host
// alone, so that is all a delta proxy may be sent.
func TestRouteWeightsCorrectness(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns control-plane processes")
	}
	w := NewWorld(WorldParams{Services: 60, Layout: Unscoped, Protocol: model.Delta, Routes: 60})
	before, err := w.Truth(View{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Apply(EvRouteWeights); err != nil {
		t.Fatal(err)
	}
	after, err := w.Truth(View{})
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(before, after); len(d) != 1 || d[0].T != xdstype.VirtualHost || d[0].Name != "http-10080/svc-0.ns-0:80" {
		t.Fatalf("moving route 0's weights changed %+v, want svc-0's virtual host alone", d)
	}
	var cells []Cell
	for _, p := range []model.Protocol{model.SotW, model.Delta} {
		for _, impl := range []string{"baseline", "scopeplane"} {
			cells = append(cells, Cell{Impl: impl, Protocol: p, Layout: Unscoped, S: 60, N: 10, Routes: 60})
		}
	}
	var log strings.Builder
	results, _ := run(cells, RunOptions{EndpointEvents: 1, Timeout: time.Minute, Log: &log}, "go test ./hack/bench")
	for _, r := range results {
		if r.Err != "" {
			t.Errorf("%s: %s", r.Cell, r.Err)
		}
		weights := 0
		for _, ph := range r.Phases {
			if ph.Failed > 0 {
				t.Errorf("%s %s: %d proxies late or wrong: %s", r.Cell, ph.Name, ph.Failed, strings.Join(ph.Errors, "; "))
			}
			if ph.Name == EvRouteWeights {
				weights++
			}
		}
		if weights != 2 {
			t.Errorf("%s: %d route weight events, want 2", r.Cell, weights)
		}
	}
	for _, d := range Disagreements(results) {
		t.Error(d)
	}
	if t.Failed() {
		t.Log(log.String())
	}
}
