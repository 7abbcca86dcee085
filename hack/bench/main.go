// Command bench measures scopeplane's control plane against a baseline built
// on stock go-control-plane (SnapshotCache, one snapshot per node) with
// simulated Envoy proxies: real gRPC ADS streams over loopback, driven by
// xds/adsclient, which ACK, apply and are checked against the truth after
// every event.
//
// The driver (this process) runs the proxies; each control plane runs in a
// process of its own, this binary re-executed as `bench serve`, so that its
// CPU and memory are measured alone. The driver tells it to apply events over
// stdin, reads its CPU time (getrusage) and its RSS (/proc/<pid>/status), and
// kills and restarts it for the restart event.
//
//	go run ./hack/bench -preset full    # make bench: the documented figures
//	go run ./hack/bench -preset full -kind churn   # only its sustained churn
//	go run ./hack/bench -preset quick   # make bench-quick: S=500, N=50, every cell
//	go run ./hack/bench serve -impl scopeplane -services 1000 -cpuprofile cp.pprof
//	go run ./hack/bench -preset world   # make bench-world: 100,000 Services in a real API server
//	go run ./hack/bench load-world -services 100000   # only build and cache that world
//
// Timings are reported, never asserted; correctness is: the run exits 1 when
// any proxy did not converge or held something other than the truth, or when
// a cell's figure for the other protocol is not what the other protocol's
// cell sent for the same world and events (within agreementTolerance; a
// SotW reconnect's figure for delta, an upper bound, at least that).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "serve" {
		os.Exit(serveMain(args[1:]))
	}
	if os.Getenv(serveEnv) == "1" {
		os.Exit(serveMain(args))
	}
	if len(args) > 0 && args[0] == "load-world" {
		os.Exit(loadWorldMain(args[1:]))
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	os.Exit(runMain(args, os.Stdout, os.Stderr))
}

// size is one world size and the layouts measured at it.
type size struct {
	S, N    int
	Layouts []Layout
}

// Preset is a named benchmark configuration.
type Preset struct {
	// Sizes are measured through the event sequence.
	Sizes          []size
	EndpointEvents int
	// ChurnSizes are measured under Churn instead.
	ChurnSizes []size
	Churn      Churn
	// Timeout bounds each phase (a churn's from its first change).
	Timeout time.Duration
}

// Presets: full is the documented run, quick checks every cell on a small
// world in under two minutes, tiny is what `go test` runs.
//
// full's S=10,000/N=10,000 size is scoped only: 20 scopes of 50 Services
// (the other 9,950 Services are in no scope), 500 proxies each, so an
// endpoint change reaches 500 proxies (with 200 scopes of 50 it would
// reach 50) while each proxy holds what it holds at every scoped size.
var Presets = map[string]Preset{
	"full": {Sizes: []size{
		{S: 10000, N: 100, Layouts: []Layout{Unscoped, Scoped}},
		{S: 1000, N: 1000, Layouts: []Layout{Unscoped, Scoped, Zoned}},
		{S: 10000, N: 1000, Layouts: []Layout{Scoped}},
		{S: 10000, N: 10000, Layouts: []Layout{Scoped}},
	}, EndpointEvents: 3,
		ChurnSizes: []size{{S: 1000, N: 1000, Layouts: []Layout{Unscoped}}}, Churn: Churn{Rate: 50, For: time.Minute, Window: churnWindow},
		Timeout: 5 * time.Minute},
	"quick": {Sizes: []size{{S: 500, N: 50, Layouts: []Layout{Unscoped, Scoped, Zoned}}}, EndpointEvents: 2,
		ChurnSizes: []size{{S: 500, N: 50, Layouts: []Layout{Unscoped}}}, Churn: Churn{Rate: 50, For: 5 * time.Second, Window: churnWindow},
		Timeout: time.Minute},
	"tiny": {Sizes: []size{{S: 60, N: 10, Layouts: []Layout{Unscoped, Scoped, Zoned}}}, EndpointEvents: 1,
		ChurnSizes: []size{{S: 60, N: 10, Layouts: []Layout{Unscoped}}}, Churn: Churn{Rate: 5, For: time.Second, Window: churnWindow},
		Timeout: 30 * time.Second},
	// sweep varies one dimension at a time, unscoped, for the plots:
	// the Services at N=100, then the proxies at S=1000.
	"sweep": {Sizes: []size{
		{S: 100, N: 100, Layouts: []Layout{Unscoped}},
		{S: 300, N: 100, Layouts: []Layout{Unscoped}},
		{S: 1000, N: 100, Layouts: []Layout{Unscoped}},
		{S: 3000, N: 100, Layouts: []Layout{Unscoped}},
		{S: 1000, N: 10, Layouts: []Layout{Unscoped}},
		{S: 1000, N: 30, Layouts: []Layout{Unscoped}},
		{S: 1000, N: 300, Layouts: []Layout{Unscoped}},
	}, EndpointEvents: 2, Timeout: 5 * time.Minute},
}

// Cells lists a preset's cells, baseline next to scopeplane: the event
// cells, then the churn cells.
func (p Preset) Cells(impls []string, protocols []model.Protocol) []Cell {
	var out []Cell
	add := func(sizes []size, churn Churn) {
		for _, sz := range sizes {
			for _, l := range sz.Layouts {
				for _, proto := range protocols {
					for _, impl := range impls {
						out = append(out, Cell{Impl: impl, Protocol: proto, Layout: l, S: sz.S, N: sz.N, Churn: churn})
					}
				}
			}
		}
	}
	add(p.Sizes, Churn{})
	if p.Churn.On() {
		add(p.ChurnSizes, p.Churn)
	}
	return out
}

func runMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", "quick", "full, quick, tiny, sweep (one dimension at a time, for -plots), or world (the operator against a real API server at S=10,000 and S=100,000) and world-tiny")
	impls := fs.String("impl", "baseline,scopeplane", "implementations to measure")
	protocols := fs.String("protocol", "SotW,Delta", "protocols to measure")
	layouts := fs.String("layout", "", "only these layouts (default: the preset's)")
	window := fs.Duration("coalesce-window", churnWindow, "the churn cells' coalescing window (scopeplane's --coalesce-window)")
	kinds := fs.String("kind", "events,churn", "only these kinds of cells: events (sync, the events, a restart), churn (sync, then the preset's sustained churn)")
	only := fs.String("size", "", "measure this size instead of the preset's, as SxN (e.g. 1000x1000); with a world preset, S alone")
	out := fs.String("out", "", "also write the markdown report to this file")
	plots := fs.String("plots", "", "also write SVG charts of the unscoped cells' cost vs Services and vs proxies into this directory")
	profile := fs.String("profile", "", "write into this directory a CPU profile of each control plane per phase (sync, each event), and a heap profile after the initial sync; with a world preset, also heap profiles of each start (the first, the restart) when its informers have listed, its objects are reconciled and its first snapshots built, and at its highest resident set, and a CPU profile of the API server over the first start's first 90 s")
	loadprofile := fs.String("loadprofile", "", "write a CPU profile of this (the proxies') process to this file")
	routes := fs.Int("routes", 0, "give this many Services of each event cell a mesh route (a 90/10 canary to the next Service of its namespace), and add two events that move route 0's weights")
	shards := fs.Int("shards", 1, "with a world preset: run the operator as one shard of this many (the shard of the scope the events change), with its share of the layout's proxies")
	goMemLimit := fs.String("gomemlimit", "", "run each control plane with this GOMEMLIMIT; the Helm chart sets 90% of the container's memory limit (483183820 for its default 512Mi)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *loadprofile != "" {
		f, err := os.Create(*loadprofile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	if *profile != "" {
		if err := os.MkdirAll(*profile, 0o755); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	if wp, ok := WorldPresets[*preset]; ok {
		if *only != "" {
			var n int
			if _, err := fmt.Sscanf(*only, "%d", &n); err != nil || n < worldTeams {
				fmt.Fprintf(stderr, "-size %q: with -preset %s, want a number of Services of at least %d\n", *only, *preset, worldTeams)
				return 2
			}
			wp.Sizes = []int{n}
		}
		var protos []model.Protocol
		for _, s := range strings.Split(*protocols, ",") {
			protos = append(protos, model.Protocol(s))
		}
		if *shards < 1 {
			fmt.Fprintf(stderr, "-shards %d: want at least 1\n", *shards)
			return 2
		}
		return runWorld(wp.Cells(protos, *layouts, *shards), RunOptions{ProfileDir: *profile, GoMemLimit: *goMemLimit, Log: stderr},
			"go run ./hack/bench "+strings.Join(args, " "), *out, stdout, stderr)
	}
	p, ok := Presets[*preset]
	if !ok {
		fmt.Fprintf(stderr, "unknown -preset %q\n", *preset)
		return 2
	}
	if *only != "" {
		var sz size
		if _, err := fmt.Sscanf(*only, "%dx%d", &sz.S, &sz.N); err != nil || sz.S < 22 || sz.N < 1 {
			fmt.Fprintf(stderr, "-size %q: want SxN with S >= 22 and N >= 1\n", *only)
			return 2
		}
		sz.Layouts = []Layout{Unscoped, Scoped, Zoned}
		p.Sizes = []size{sz}
		if len(p.ChurnSizes) > 0 {
			p.ChurnSizes = []size{sz}
		}
	}
	p.Churn.Window = *window
	var protos []model.Protocol
	for _, s := range strings.Split(*protocols, ",") {
		protos = append(protos, model.Protocol(s))
	}
	cells := p.Cells(strings.Split(*impls, ","), protos)
	cells = filterCells(cells, *layouts, *kinds)
	for i := range cells {
		if !cells[i].Churn.On() {
			cells[i].Routes = *routes
		}
	}
	results, header := run(cells, RunOptions{EndpointEvents: p.EndpointEvents, ProfileDir: *profile, Timeout: p.Timeout, GoMemLimit: *goMemLimit, Log: stderr},
		"go run ./hack/bench "+strings.Join(args, " "))
	var buf bytes.Buffer
	Report(&buf, results, header)
	_, _ = stdout.Write(buf.Bytes())
	if *out != "" {
		if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	if *plots != "" {
		files, err := Plot(*plots, results)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		for _, f := range files {
			fmt.Fprintln(stderr, "bench: wrote", f)
		}
	}
	failed := 0
	for _, r := range results {
		failed += r.Failures()
	}
	disagree := Disagreements(results)
	for _, d := range disagree {
		fmt.Fprintf(stderr, "bench: the other protocol's figure is wrong: %s\n", d)
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "bench: %d proxies were late or wrong (see the correct column)\n", failed)
	}
	if failed > 0 || len(disagree) > 0 {
		return 1
	}
	return 0
}

func filterCells(cells []Cell, layouts, kinds string) []Cell {
	var out []Cell
	for _, c := range cells {
		kind := "events"
		if c.Churn.On() {
			kind = "churn"
		}
		if (layouts == "" || strings.Contains(","+layouts+",", ","+string(c.Layout)+",")) && strings.Contains(","+kinds+",", ","+kind+",") {
			out = append(out, c)
		}
	}
	return out
}

// run measures every cell, one after the other.
func run(cells []Cell, o RunOptions, command string) ([]*Result, string) {
	start := time.Now()
	load0 := loadAvg()
	var results []*Result
	for _, c := range cells {
		logf(o, "%s", c)
		results = append(results, runCell(c, o))
	}
	header := fmt.Sprintf("## Results\n\n`%s` — %s, %d cores, %s, load average %s at start and %s at end, %s.",
		command, start.Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.Version(), load0, loadAvg(), time.Since(start).Round(time.Second))
	return results, header
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], "/")
}
