package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/scopeplane/scopeplane/xds/model"
)

func phaseLine(p *Phase) string {
	s := fmt.Sprintf("%-9s bytes=%s limit=%s cpu=%s load-cpu=%s p50=%s p99=%s max=%s affected=%d failed=%d",
		p.Name, human(p.Bytes), human(p.Limit), ms(p.CPU), ms(p.LoadCPU), ms(p.Percentile(0.5)), ms(p.Percentile(0.99)), ms(p.Converged()), p.Affected, p.Failed)
	if p.Reopened > 0 {
		s += fmt.Sprintf(" reopened=%d", p.Reopened)
	}
	if c := p.Churn; c != nil {
		s += fmt.Sprintf("\n      churn: %d changes in %s, %d versions built, %d responses, all held the last after %s, CP %.2f cores, change p50=%s p99=%s max=%s",
			c.Changes, ms(c.Window), c.Builds, p.Responses, ms(c.Drained), c.perSecond(p.CPU.Seconds()),
			ms(percentile(c.ChangeLat, 0.5)), ms(percentile(c.ChangeLat, 0.99)), ms(percentile(c.ChangeLat, 1)))
	}
	for _, e := range p.Errors {
		s += "\n      " + e
	}
	return s
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	r := a / b
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	default:
		return fmt.Sprintf("%.2f×", r)
	}
}

func (r *Result) phase(name string) *Phase {
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// merged folds repeated phases of one event into one: bytes, limit and CPU
// averaged per event, convergence times pooled.
func (r *Result) merged() []*Phase {
	var out []*Phase
	idx := map[string]int{}
	count := map[string]int{}
	for _, p := range r.Phases {
		i, ok := idx[p.Name]
		if !ok {
			c := *p
			c.Lat = append([]time.Duration(nil), p.Lat...)
			idx[p.Name] = len(out)
			out = append(out, &c)
			count[p.Name] = 1
			continue
		}
		m := out[i]
		m.Bytes += p.Bytes
		m.Priced += p.Priced
		m.Limit += p.Limit
		m.Responses += p.Responses
		m.Resources += p.Resources
		m.CPU += p.CPU
		m.LoadCPU += p.LoadCPU
		m.Lat = append(m.Lat, p.Lat...)
		m.Failed += p.Failed
		m.Errors = append(m.Errors, p.Errors...)
		count[p.Name]++
	}
	for _, m := range out {
		n := int64(count[m.Name])
		m.Bytes /= n
		m.Priced /= n
		m.Limit /= n
		m.Responses /= n
		m.Resources /= n
		m.CPU /= time.Duration(n)
		m.LoadCPU /= time.Duration(n)
		if n > 1 {
			m.Name = fmt.Sprintf("%s (mean of %d)", m.Name, n)
		}
	}
	return out
}

func cellLabel(c Cell) string {
	return fmt.Sprintf("%s %s %s S=%d N=%d", c.Impl, c.Protocol, c.Layout, c.S, c.N)
}

// pairKey names the cell a scopeplane cell is compared with.
func pairKey(c Cell) string {
	return fmt.Sprintf("%s/%s/%d/%d", c.Protocol, c.Layout, c.S, c.N)
}

// Report writes the markdown tables.
func Report(w io.Writer, results []*Result, header string) {
	fmt.Fprintln(w, header)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Per event")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Bytes are the protobuf size of every response the proxies received (gRPC/HTTP2 framing excluded); ×limit compares them with the smallest valid response stream carrying only the changed resources. CP CPU is the control-plane process's user+system time from the event until traffic stopped; load CPU is the proxies' process's meanwhile (both share the cores). Convergence is event → the proxy ACKed its last changed resource, over the proxies the event affects.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | event | bytes | bytes/proxy | ×limit | CP CPU | load CPU | p50 | p99 | max | affected | correct |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, r := range results {
		if r.Churn.On() {
			continue
		}
		if r.Err != "" {
			fmt.Fprintf(w, "| %s | error | %s ||||||||||\n", cellLabel(r.Cell), strings.ReplaceAll(r.Err, "|", "/"))
			continue
		}
		for _, p := range r.merged() {
			if p.Name == "restart" {
				continue
			}
			lim := "—"
			if p.Limit > 0 {
				lim = ratio(float64(p.Bytes), float64(p.Limit))
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", cellLabel(r.Cell), p.Name,
				human(p.Bytes), human(p.Bytes/int64(r.N)), lim, ms(p.CPU), ms(p.LoadCPU), ms(p.Percentile(0.5)), ms(p.Percentile(0.99)), ms(p.Converged()),
				p.Affected, okText(p.Failed))
		}
	}
	fmt.Fprintln(w)
	churnTable(w, results)
	fmt.Fprintln(w, "### Memory and restart")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "RSS per proxy is (RSS after the initial sync − RSS before any proxy connected) / N, each read from /proc after a forced GC. Peak RSS is the most the control plane was resident at, with no GC forced (/proc's VmHWM, the higher of the process before the restart and the one after it): what a memory limit must hold. Restart: the control-plane process is killed and started again with the same world; times are from the kill; CPU is the new process's whole life until traffic stopped (building the world included); resources are those the proxies received again.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | RSS before | RSS/proxy | peak RSS | restart: serving | restart: all converged | restart bytes | restart resources | restart CPU | correct |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, r := range results {
		p := r.phase("restart")
		if r.Err != "" || p == nil {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %.1f KB | %s | %s | %s | %s | %d | %s | %s |\n", cellLabel(r.Cell), human(r.RSSBefore), r.RSSPerProxy()/1024, human(r.PeakRSS),
			ms(p.Ready), ms(p.Converged()), human(p.Bytes), p.Resources, ms(p.CPU), okText(p.Failed))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### scopeplane vs baseline")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Bytes and p99 as scopeplane/baseline (below 1 is better); CPU and RSS as baseline/scopeplane (how many times lower scopeplane is).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| protocol layout size | event | bytes sp/bl | CPU ×lower | p99 sp/bl |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|")
	base := map[string]*Result{}
	for _, r := range results {
		if r.Impl == "baseline" && r.Err == "" && !r.Churn.On() {
			base[pairKey(r.Cell)] = r
		}
	}
	for _, r := range results {
		b := base[pairKey(r.Cell)]
		if r.Impl != "scopeplane" || r.Err != "" || r.Churn.On() || b == nil {
			continue
		}
		bm := map[string]*Phase{}
		for _, p := range b.merged() {
			bm[p.Name] = p
		}
		for _, p := range r.merged() {
			q := bm[p.Name]
			if q == nil {
				continue
			}
			fmt.Fprintf(w, "| %s %s S=%d N=%d | %s | %s | %s | %s |\n", r.Protocol, r.Layout, r.S, r.N, p.Name,
				ratio(float64(p.Bytes), float64(q.Bytes)), ratio(float64(q.CPU), float64(p.CPU)),
				ratio(float64(p.Percentile(0.99)), float64(q.Percentile(0.99))))
		}
		fmt.Fprintf(w, "| %s %s S=%d N=%d | RSS/proxy | | %s | |\n", r.Protocol, r.Layout, r.S, r.N, ratio(b.RSSPerProxy(), r.RSSPerProxy()))
	}
	fmt.Fprintln(w)
	topology(w, results)
	targets(w, results, base, otherProtocol(w, results))
}

// topology writes what topology-aware routing costs: each zoned cell
// against the unscoped cell of the same implementation, protocol and size,
// the same world but for PreferClose and zone hints (a view per zone).
func topology(w io.Writer, results []*Result) {
	plain := map[Cell]*Result{}
	for _, r := range results {
		if r.Layout == Unscoped && r.Err == "" {
			plain[r.Cell] = r
		}
	}
	header := false
	for _, r := range results {
		c := r.Cell
		c.Layout = Unscoped
		u := plain[c]
		if r.Layout != Zoned || r.Err != "" || u == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "### Topology-aware routing")
			fmt.Fprintln(w)
			fmt.Fprintln(w, "The zoned cells against the unscoped ones of the same world, as zoned/unscoped: every Service asks for PreferClose with each endpoint hinted for its zone, and the proxies run in three zones, so each zone's proxies share a view of every assignment.")
			fmt.Fprintln(w)
			fmt.Fprintln(w, "| cell | event | bytes | CP CPU | p99 |")
			fmt.Fprintln(w, "|---|---|--:|--:|--:|")
			header = true
		}
		um := map[string]*Phase{}
		for _, p := range u.merged() {
			um[p.Name] = p
		}
		for _, p := range r.merged() {
			if q := um[p.Name]; q != nil {
				fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", cellLabel(r.Cell), p.Name, ratio(float64(p.Bytes), float64(q.Bytes)),
					ratio(float64(p.CPU), float64(q.CPU)), ratio(float64(p.Percentile(0.99)), float64(q.Percentile(0.99))))
			}
		}
		fmt.Fprintf(w, "| %s | RSS/proxy | | | %s |\n", cellLabel(r.Cell), ratio(r.RSSPerProxy(), u.RSSPerProxy()))
	}
	if header {
		fmt.Fprintln(w)
	}
}

// agreementTolerance is how far a cell's figure for the other protocol may
// be from the bytes the other protocol's cell sent before the run fails.
// The figures are exact to the byte; the margin absorbs only the rounding of
// means over repeated events.
const agreementTolerance = 0.01

// pricedRow sets, for one world and event, each protocol's cell against the
// other's figure for it.
type pricedRow struct {
	Layout            Layout
	S, N              int
	Event             string
	SotWSent, AsDelta int64
	DeltaSent, AsSotW int64
	// UpperBound marks a row whose figure for delta is an upper bound: a
	// reconnecting SotW proxy names one version per type, which may not show
	// what it holds, so delta is priced as a resend of what does not match.
	UpperBound bool
}

// at names the row's world and event.
func (r pricedRow) at() string { return fmt.Sprintf("%s S=%d N=%d %s", r.Layout, r.S, r.N, r.Event) }

// pricedRows pairs every scopeplane SotW cell with the Delta cell of the
// same world and events, event by event. Churn cells are not compared: each
// process coalesces the churn's changes as their timing falls, so the two
// cells push different batches.
func pricedRows(results []*Result) []pricedRow {
	cells := map[string]*Result{}
	for _, r := range results {
		if r.Impl == "scopeplane" && r.Err == "" && !r.Churn.On() {
			cells[pairKey(r.Cell)] = r
		}
	}
	var rows []pricedRow
	for _, r := range results {
		if r.Impl != "scopeplane" || r.Err != "" || r.Protocol != model.SotW || r.Churn.On() {
			continue
		}
		d := cells[pairKey(Cell{Impl: r.Impl, Protocol: model.Delta, Layout: r.Layout, S: r.S, N: r.N})]
		if d == nil {
			continue
		}
		dm := map[string]*Phase{}
		for _, p := range d.merged() {
			dm[p.Name] = p
		}
		for _, p := range r.merged() {
			q := dm[p.Name]
			if q == nil || p.Priced < 0 || q.Priced < 0 {
				continue
			}
			rows = append(rows, pricedRow{Layout: r.Layout, S: r.S, N: r.N, Event: p.Name,
				SotWSent: p.Bytes, AsDelta: p.Priced, DeltaSent: q.Bytes, AsSotW: q.Priced, UpperBound: p.Name == "restart" || p.Name == EvReconnect})
		}
	}
	return rows
}

// off is how far priced is from sent, as a ratio of at least 1 (+Inf when
// one of them is zero and the other is not).
func off(priced, sent int64) float64 {
	switch {
	case priced == sent:
		return 1
	case priced == 0 || sent == 0:
		return math.Inf(1)
	case priced > sent:
		return float64(priced) / float64(sent)
	default:
		return float64(sent) / float64(priced)
	}
}

// problems says where the row's figures disagree with the other cell's
// bytes: by more than agreementTolerance, or, for an upper bound, by being
// below them.
func (r pricedRow) problems() []string {
	var out []string
	if r.UpperBound {
		if r.AsDelta < r.DeltaSent {
			out = append(out, fmt.Sprintf("%s: the SotW cell priced delta at %d bytes, below the %d the Delta cell sent (it is an upper bound)", r.at(), r.AsDelta, r.DeltaSent))
		}
	} else if f := off(r.AsDelta, r.DeltaSent); f > 1+agreementTolerance {
		out = append(out, fmt.Sprintf("%s: the SotW cell priced delta at %d bytes, the Delta cell sent %d (%.3f× off)", r.at(), r.AsDelta, r.DeltaSent, f))
	}
	if f := off(r.AsSotW, r.SotWSent); f > 1+agreementTolerance {
		out = append(out, fmt.Sprintf("%s: the Delta cell priced SotW at %d bytes, the SotW cell sent %d (%.3f× off)", r.at(), r.AsSotW, r.SotWSent, f))
	}
	return out
}

// Disagreements lists every figure for the other protocol that is not that
// protocol's bytes for the same world and events; the run fails on any.
func Disagreements(results []*Result) []string {
	var out []string
	for _, r := range pricedRows(results) {
		out = append(out, r.problems()...)
	}
	return out
}

// agreement is how far the priced figures were from the other cell's bytes.
type agreement struct {
	compared bool
	// worst is the largest priced/sent or sent/priced ratio of a figure
	// that must be exact.
	worst    float64
	worstAt  string
	problems int
}

// otherProtocol compares what each scopeplane cell said the other protocol
// would have sent with what the other protocol's cell of the same world and
// events sent: they should agree, except where a reconnecting SotW proxy's
// claim cannot show what it holds (docs/choosing-a-protocol.md).
func otherProtocol(w io.Writer, results []*Result) agreement {
	a := agreement{worst: 1}
	fmt.Fprintln(w, "### The other protocol's figure")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "For each scopeplane SotW cell, the bytes it said delta would have sent (status.cost, `scopeplane_xds_other_protocol_bytes_total`) against what the Delta cell of the same world and events sent, and the other way round; priced/sent 1.00× is exact.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| layout size | event | SotW sent | priced as delta | delta sent | priced/sent | priced as SotW | priced/sent |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range pricedRows(results) {
		fmt.Fprintf(w, "| %s S=%d N=%d | %s | %s | %s | %s | %s | %s | %s |\n", r.Layout, r.S, r.N, r.Event,
			human(r.SotWSent), human(r.AsDelta), human(r.DeltaSent), ratio(float64(r.AsDelta), float64(r.DeltaSent)),
			human(r.AsSotW), ratio(float64(r.AsSotW), float64(r.SotWSent)))
		a.compared = true
		a.problems += len(r.problems())
		exact := [][2]int64{{r.AsSotW, r.SotWSent}}
		if !r.UpperBound {
			exact = append(exact, [2]int64{r.AsDelta, r.DeltaSent})
		}
		for _, x := range exact {
			if f := off(x[0], x[1]); f > a.worst {
				a.worst, a.worstAt = f, r.at()
			}
		}
	}
	fmt.Fprintln(w)
	return a
}

// churnTable writes the churn cells' figures, if there are any.
func churnTable(w io.Writer, results []*Result) {
	var rows []string
	for _, r := range results {
		if !r.Churn.On() {
			continue
		}
		p := r.phase(EvChurn)
		if r.Err != "" || p == nil || p.Churn == nil {
			rows = append(rows, fmt.Sprintf("| %s | error | %s ||||||||||||", cellLabel(r.Cell), strings.ReplaceAll(r.Err, "|", "/")))
			continue
		}
		c := p.Churn
		rows = append(rows, fmt.Sprintf("| %s | %s | %.1f | %.1f | %.1f | %.2f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s |", cellLabel(r.Cell), r.Churn,
			c.perSecond(float64(c.Changes)), c.perSecond(float64(c.Builds)), c.perSecond(float64(p.Responses)/float64(r.N)),
			c.perSecond(p.CPU.Seconds()), c.perSecond(p.LoadCPU.Seconds()),
			human(int64(c.perSecond(float64(p.Bytes)))), human(int64(c.perSecond(float64(p.Bytes)/float64(r.N)))), ms(c.Drained),
			ms(percentile(c.ChangeLat, 0.5)), ms(percentile(c.ChangeLat, 0.99)), ms(percentile(c.ChangeLat, 1)),
			ms(p.Percentile(0.99)), okText(r.Failures())))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "### Sustained churn")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Endpoint changes handed to the control plane on a fixed schedule, whether or not the earlier ones reached the proxies; each control plane coalesces them as it builds (scopeplane: its builder's window; the baseline: one rebuild for every change that arrived during the previous one). Rates are per second of the schedule: the changes made, and everything the churn caused until traffic stopped (work deferred past the schedule included) — versions the control plane built, responses each proxy received, CPU (cores), bytes. *Drained*: from the first change until every proxy held the last version of every churned resource. A change has converged at a proxy once the proxy ACKed that version of the resource or a later one (a later change of the same resource supersedes it); *change* p50/p99/max are over the changes, each until every proxy it affects converged; *proxy p99* is over every (change, proxy) pair. Correct: after the churn every proxy holds the truth.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| cell | churn | changes/s | versions/s | responses/proxy/s | CP cores | load cores | bytes/s | bytes/s/proxy | drained | change p50 | change p99 | change max | proxy p99 | correct |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, row := range rows {
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
}

// worstChurn is the largest figure f of scopeplane's churn phases, and where.
func worstChurn(results []*Result, f func(*Phase) float64) (float64, string) {
	worst, at := 0.0, ""
	for _, r := range results {
		if r.Impl != "scopeplane" || r.Err != "" || !r.Churn.On() {
			continue
		}
		if p := r.phase(EvChurn); p != nil && p.Churn != nil {
			if x := f(p); at == "" || x > worst {
				worst, at = x, cellLabel(r.Cell)
			}
		}
	}
	return worst, at
}

func okText(failed int) string {
	if failed == 0 {
		return "yes"
	}
	return fmt.Sprintf("**NO (%d)**", failed)
}

// chartMemoryLimit is the memory limit the Helm chart gives the control
// plane by default (charts/scopeplane/values.yaml).
const chartMemoryLimit = 512 << 20

// targets checks scopeplane's cells against DESIGN.md's performance targets.
func targets(w io.Writer, results []*Result, base map[string]*Result, agree agreement) {
	var (
		worstLimit                      float64
		worstLimitAt                    string
		minEndpointCPU, minSyncCPU      = 1e18, 1e18
		minEndpointAt, minSyncAt        string
		worstP99                        time.Duration
		worstP99At                      string
		worstRSS                        float64
		worstRSSAt                      string
		worstPeak                       int64
		worstPeakAt                     string
		worstRestart                    time.Duration
		worstRestartAt                  string
		deltaRestartRes                 int64
		deltaRestartAt                  string
		haveN1000                       bool
		haveBase, haveSP, haveDeltaCell bool
	)
	for _, r := range results {
		if r.Impl != "scopeplane" || r.Err != "" || r.Churn.On() {
			continue
		}
		haveSP = true
		label := cellLabel(r.Cell)
		for _, p := range r.merged() {
			event := p.Name != "sync" && p.Name != "restart" && p.Name != EvReconnect
			if event && p.Limit > 0 {
				if x := float64(p.Bytes) / float64(p.Limit); x > worstLimit {
					worstLimit, worstLimitAt = x, label+" "+p.Name
				}
			}
			if event && r.N >= 1000 {
				haveN1000 = true
				if d := p.Percentile(0.99); d > worstP99 {
					worstP99, worstP99At = d, label+" "+p.Name
				}
			}
		}
		if x := r.RSSPerProxy(); x > worstRSS {
			worstRSS, worstRSSAt = x, label
		}
		if r.PeakRSS > worstPeak {
			worstPeak, worstPeakAt = r.PeakRSS, label
		}
		if p := r.phase("restart"); p != nil {
			if d := p.Converged(); d > worstRestart {
				worstRestart, worstRestartAt = d, label
			}
			if r.Protocol == model.Delta {
				haveDeltaCell = true
				if p.Resources >= deltaRestartRes {
					deltaRestartRes, deltaRestartAt = p.Resources, label
				}
			}
		}
		b := base[pairKey(r.Cell)]
		if b == nil {
			continue
		}
		haveBase = true
		sm, bm := map[string]*Phase{}, map[string]*Phase{}
		for _, p := range r.merged() {
			sm[strings.Fields(p.Name)[0]] = p
		}
		for _, p := range b.merged() {
			bm[strings.Fields(p.Name)[0]] = p
		}
		if s, q := sm[EvEndpoint], bm[EvEndpoint]; s != nil && q != nil && s.CPU > 0 {
			if x := float64(q.CPU) / float64(s.CPU); x < minEndpointCPU {
				minEndpointCPU, minEndpointAt = x, label
			}
		}
		if s, q := sm["sync"], bm["sync"]; s != nil && q != nil && s.CPU > 0 {
			if x := float64(q.CPU) / float64(s.CPU); x < minSyncCPU {
				minSyncCPU, minSyncAt = x, label
			}
		}
	}
	p99Churn, p99ChurnAt := worstChurn(results, func(p *Phase) float64 { return percentile(p.Churn.ChangeLat, 0.99).Seconds() })
	cpuChurn, cpuChurnAt := worstChurn(results, func(p *Phase) float64 { return p.Churn.perSecond(p.CPU.Seconds()) })
	if !haveSP && p99ChurnAt == "" {
		return
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	fmt.Fprintln(w, "### Targets (scopeplane, worst cell)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured (worst cell) | |")
	fmt.Fprintln(w, "|---|---|---|")
	if haveSP {
		fmt.Fprintf(w, "| bytes per event ≤ 1.2× limit | %.2f× (%s) | %s |\n", worstLimit, worstLimitAt, met(worstLimit <= 1.2))
	}
	if haveBase {
		fmt.Fprintf(w, "| CPU per endpoint event ≥ 50× lower than baseline | %.1f× (%s) | %s |\n", minEndpointCPU, minEndpointAt, met(minEndpointCPU >= 50))
		fmt.Fprintf(w, "| initial-sync CPU ≥ 5× lower than baseline | %.1f× (%s) | %s |\n", minSyncCPU, minSyncAt, met(minSyncCPU >= 5))
	}
	if haveN1000 {
		fmt.Fprintf(w, "| convergence p99 ≤ 250 ms at N=1,000 | %s (%s) | %s |\n", ms(worstP99), worstP99At, met(worstP99 <= 250*time.Millisecond))
	}
	if haveSP {
		fmt.Fprintf(w, "| ≤ 100 KB RSS per connected proxy, whatever the scope | %.1f KB (%s) | %s |\n", worstRSS/1024, worstRSSAt, met(worstRSS <= 100*1024))
		if worstPeak > 0 {
			fmt.Fprintf(w, "| peak RSS ≤ the Helm chart's memory limit (%s) | %s (%s) | %s |\n", human(chartMemoryLimit), human(worstPeak), worstPeakAt, met(worstPeak <= chartMemoryLimit))
		}
		fmt.Fprintf(w, "| restart: all converged ≤ 5 s | %s (%s) | %s |\n", ms(worstRestart), worstRestartAt, met(worstRestart <= 5*time.Second))
	}
	if haveDeltaCell {
		fmt.Fprintf(w, "| restart: delta reconnects send only differences (none changed) | %d resources resent (%s) | %s |\n", deltaRestartRes, deltaRestartAt, met(deltaRestartRes == 0))
	}
	if p99ChurnAt != "" {
		fmt.Fprintf(w, "| sustained churn: each change at every proxy it affects, p99 ≤ 250 ms | %s (%s) | %s |\n", ms(time.Duration(p99Churn*float64(time.Second))), p99ChurnAt, met(p99Churn <= 0.25))
		fmt.Fprintf(w, "| sustained churn: control plane ≤ 0.5 core | %.2f cores (%s) | %s |\n", cpuChurn, cpuChurnAt, met(cpuChurn <= 0.5))
	}
	if agree.compared {
		fmt.Fprintf(w, "| the other protocol's figure is that protocol's bytes within %.0f%% (a SotW reconnect's: at least them) | worst %.3f× (%s) | %s |\n",
			agreementTolerance*100, agree.worst, agree.worstAt, met(agree.problems == 0))
	}
	fmt.Fprintln(w)
}
