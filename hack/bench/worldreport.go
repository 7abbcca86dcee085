package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

// WorldPreset is a world-scale configuration: every layout at every size,
// with Proxies proxies for each layout.
type WorldPreset struct {
	Sizes   []int
	Proxies map[Layout]int
}

// WorldPresets: world is `make bench-world`, the figures of docs/performance.md's
// world-scale section: 100 team scopes with 1,000 proxies, and 10,000 tenant
// scopes with a proxy each, over 10,000 and 100,000 Services. world-tiny is
// what `go test` runs: the teams layout over 300 Services.
var WorldPresets = map[string]WorldPreset{
	"world":      {Sizes: []int{10000, 100000}, Proxies: map[Layout]int{Teams: 1000, Tenants: worldTenants}},
	"world-tiny": {Sizes: []int{300}, Proxies: map[Layout]int{Teams: 200}},
}

// Cells lists the preset's cells, layout by layout, the sizes of a layout
// and protocol next to each other; with shards above 1, each cell's
// operator is one shard of that many, with its share of the proxies.
func (p WorldPreset) Cells(protocols []model.Protocol, layouts string, shards int) []WorldCell {
	var out []WorldCell
	for _, l := range []Layout{Teams, Tenants} {
		n, ok := p.Proxies[l]
		if !ok || (layouts != "" && !strings.Contains(","+layouts+",", ","+string(l)+",")) {
			continue
		}
		for _, proto := range protocols {
			for _, s := range p.Sizes {
				out = append(out, WorldCell{Protocol: proto, Layout: l, S: s, N: max(1, n/shards), Shards: shards})
			}
		}
	}
	return out
}

// runWorld measures the cells, prints the report and says whether every
// proxy held the truth after every event.
func runWorld(cells []WorldCell, o RunOptions, command, outFile string, stdout, stderr io.Writer) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(stderr, "bench: the world presets run a real API server: export KUBEBUILDER_ASSETS=$(hack/envtest.sh), or run make bench-world")
		return 2
	}
	start, load0 := time.Now(), loadAvg()
	var results []*WorldResult
	for _, c := range cells {
		logf(o, "%s", c)
		results = append(results, runWorldCell(c, o))
	}
	header := fmt.Sprintf("## World-scale results\n\n`%s` — %s, %d cores, %s, load average %s at start and %s at end, %s.",
		command, start.Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.Version(), load0, loadAvg(), time.Since(start).Round(time.Second))
	var buf bytes.Buffer
	WorldReport(&buf, results, header)
	_, _ = stdout.Write(buf.Bytes())
	if outFile != "" {
		if err := os.WriteFile(outFile, buf.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	failed := 0
	for _, r := range results {
		failed += r.Failures()
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "bench: %d proxies were late or wrong, or cells failed (see the correct column)\n", failed)
		return 1
	}
	return 0
}

// Failures counts proxies that were wrong or late, over all phases, and
// statuses that never became current.
func (r *WorldResult) Failures() int {
	n := r.StatusStart.Stale + r.StatusRestart.Stale
	if r.Err != "" {
		n++
	}
	for _, p := range r.Phases {
		n += p.Failed
	}
	return n
}

func (r *WorldResult) phase(name string) []*Phase {
	var out []*Phase
	for _, p := range r.Phases {
		if p.Name == name {
			out = append(out, p)
		}
	}
	return out
}

// eventCPU is the median CPU of a kind of event, and the worst p99.
func (r *WorldResult) eventCPU(name string) (cpu, p99 time.Duration, ok bool) {
	ps := r.phase(name)
	if len(ps) == 0 {
		return 0, 0, false
	}
	var cpus []time.Duration
	for _, p := range ps {
		cpus = append(cpus, p.CPU)
		p99 = max(p99, p.Percentile(0.99))
	}
	slices.Sort(cpus)
	return cpus[len(cpus)/2], p99, true
}

func mib(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }

// heapOrder is the order the heap layers are printed in.
var heapOrder = []string{"informer caches", "catalog", "snapshots", "streams", "feedback and status", "other"}

// WorldReport writes the world cells as markdown: memory, start and
// status, the events, and the growth from the smallest size.
func WorldReport(w io.Writer, results []*WorldResult, header string) {
	fmt.Fprintln(w, header)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Memory and start")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| cell | RSS after sync (MiB) | peak RSS | live heap: %s | first start: listed / built / all proxies served | restart: listed / built / all proxies served | correct |\n", strings.Join(heapOrder, " / "))
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range results {
		var heap []string
		for _, l := range heapOrder {
			heap = append(heap, mib(r.Heap[l]))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s |\n", r.WorldCell, mib(r.RSSAfter), mib(r.PeakRSS), strings.Join(heap, " / "),
			ms(r.Start.Listed), ms(r.Start.Built), ms(r.Start.AllServed), ms(r.Restart.Listed), ms(r.Restart.Built), ms(r.Restart.AllServed), okText(r.Failures()))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### The highest resident set per phase of each process's life")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Sampled every 50 ms: the resident set, the heap the last collection found live, the heap's objects (live or not yet swept) and the collector's goal, when the resident set was highest in the phase. list: until the informers had listed; reconcile: until the listed objects were in the catalog; build: until the first snapshots; serve: until the driver's events (the first start: the initial sync of every proxy); events.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | first start | restart |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.WorldCell, r.StartPeaks, r.RestartPeaks)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Status writes")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | scopes | first start: all current after / writes / rate | restart: all current after / writes / rate |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %d | %s / %d / %.0f/s%s | %s / %d / %.0f/s%s |\n", r.WorldCell, r.Scopes,
			ms(r.StatusStart.Current), r.StatusStart.Writes, r.StatusStart.Rate, staleText(r.StatusStart.Stale),
			ms(r.StatusRestart.Current), r.StatusRestart.Writes, r.StatusRestart.Rate, staleText(r.StatusRestart.Stale))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Events (control-plane CPU, median of the kind; convergence p99, worst of the kind)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | endpoint moved | Service added to one scope | selector moves a scope's Services | restart |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range results {
		var cols []string
		for _, ev := range []string{EvEndpoint, "addservice", "selector", "restart"} {
			cpu, p99, ok := r.eventCPU(ev)
			if !ok {
				cols = append(cols, "—")
				continue
			}
			cols = append(cols, fmt.Sprintf("%s CPU, p99 %s", ms(cpu), ms(p99)))
		}
		fmt.Fprintf(w, "| %s | %s |\n", r.WorldCell, strings.Join(cols, " | "))
	}
	for _, r := range results {
		if r.Err != "" {
			fmt.Fprintf(w, "\n%s: %s\n", r.WorldCell, r.Err)
		}
		for _, p := range r.Phases {
			for _, e := range p.Errors {
				fmt.Fprintf(w, "\n%s %s: %s\n", r.WorldCell, p.Name, e)
			}
		}
	}
	growth(w, results)
}

// growth compares each cell with the same layout and protocol at the
// smallest size measured.
func growth(w io.Writer, results []*WorldResult) {
	base := map[string]*WorldResult{}
	key := func(r *WorldResult) string { return string(r.Layout) + "/" + string(r.Protocol) }
	for _, r := range results {
		if b, ok := base[key(r)]; !ok || r.S < b.S {
			base[key(r)] = r
		}
	}
	var rows []string
	for _, r := range results {
		b := base[key(r)]
		if b == r || r.Err != "" || b.Err != "" {
			continue
		}
		cpu, _, _ := r.eventCPU(EvEndpoint)
		bcpu, _, _ := b.eventCPU(EvEndpoint)
		rows = append(rows, fmt.Sprintf("| %s vs S=%d | %s | %s | %s | %s |", r.WorldCell, b.S,
			ratio(float64(r.RSSAfter), float64(b.RSSAfter)), ratio(cpu.Seconds(), bcpu.Seconds()),
			ratio(float64(r.Restart.AllServed-r.Restart.Listed), float64(b.Restart.AllServed-b.Restart.Listed)),
			ratio(r.StatusStart.Current.Seconds(), b.StatusStart.Current.Seconds())))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Growth")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | RSS after sync | endpoint event CPU | restart: listed → all served | statuses current after the first start |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, row := range rows {
		fmt.Fprintln(w, row)
	}
}

func staleText(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d stale)", n)
}
