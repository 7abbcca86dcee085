package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
)

// serveEnv marks a re-executed copy of the harness (or of its test binary)
// as the control-plane process.
const serveEnv = "SCOPEPLANE_BENCH_SERVE"

// Cell is one combination the benchmark measures: after the initial sync,
// the event sequence, or a sustained churn when Churn is set.
type Cell struct {
	Impl     string
	Protocol model.Protocol
	Layout   Layout
	S, N     int
	// Routes is how many Services have a mesh route; with any, the events
	// include EvRouteWeights.
	Routes int
	Churn  Churn
}

func (c Cell) String() string {
	s := fmt.Sprintf("%s/%s/%s/S=%d/N=%d", c.Impl, c.Protocol, c.Layout, c.S, c.N)
	if c.Routes > 0 {
		s += fmt.Sprintf("/routes=%d", c.Routes)
	}
	if c.Churn.On() {
		s += "/" + c.Churn.String()
	}
	return s
}

// Churn is a sustained churn: Rate endpoint changes (EvChurn) per second
// for For, each handed to the control plane when it is due, whether or not
// the earlier ones reached the proxies. Both control planes build changes
// as they arrive, coalescing them for Window (scopeplane with its builder's
// window, as in production; the baseline by rebuilding once for every
// change that arrived during its previous rebuild, after the window).
type Churn struct {
	Rate   int
	For    time.Duration
	Window time.Duration
}

// On reports whether c is a churn at all.
func (c Churn) On() bool { return c.Rate > 0 && c.For > 0 }

// Changes is how many changes the churn makes.
func (c Churn) Changes() int { return int(float64(c.Rate) * c.For.Seconds()) }

func (c Churn) String() string {
	return fmt.Sprintf("churn %d/s for %s, window %s", c.Rate, c.For, c.Window)
}

// churnWindow is the coalescing window of the presets' churn cells:
// scopeplane's default --coalesce-window.
const churnWindow = 10 * time.Millisecond

// Phase is what one event cost and whether every proxy ended up right.
type Phase struct {
	Name string
	// Bytes is the protobuf size of every response the proxies received
	// (gRPC and HTTP/2 framing excluded); Limit the smallest valid stream.
	Bytes, Limit         int64
	Responses, Resources int64
	CPU                  time.Duration
	// LoadCPU is the CPU the proxies' process used meanwhile: the two
	// processes share the machine's cores.
	LoadCPU time.Duration
	// Affected proxies had something to receive; Lat holds the convergence
	// time of each that converged.
	Affected int
	Lat      []time.Duration
	// Failed counts proxies that did not converge or hold a wrong state.
	Failed int
	Errors []string
	// Ready is, for a restart, how long the new process took to serve.
	Ready time.Duration
	// Priced is what the control plane said the other protocol would have
	// sent meanwhile (-1: it does not say).
	Priced int64
	// Reopened counts the streams proxies had to open again meanwhile, as
	// when the server closed a connection whose proxy did not read within
	// its send timeout; their reconnects are in the bytes and in Priced.
	Reopened int
	// Synced is, for a restart whose SotW proxies may be sent nothing,
	// when the control plane first counted every proxy at its scope's
	// version.
	Synced time.Duration
	// Churn is set for a churn; its Lat holds one convergence time per
	// change and proxy the change affects.
	Churn *ChurnStats
}

// ChurnStats is what a sustained churn did beyond what every phase
// measures, and how long its changes took to reach the proxies. The
// phase's CPU, bytes and responses are everything the churn caused, until
// traffic stopped; divided by Window they are its cost per second of churn,
// work the control plane or the proxies deferred past the schedule
// included.
type ChurnStats struct {
	Changes int
	// Window runs from the first change to the end of the schedule.
	Window time.Duration
	// Builds is how many versions the control plane built in the phase.
	Builds int64
	// Drained is when, from the first change, the last proxy held the
	// last version of every churned resource.
	Drained time.Duration
	// ChangeLat holds, for each change that affected a proxy, how long
	// until every proxy it affects had converged on it (see runChurn).
	ChangeLat []time.Duration
}

// perSecond is n over the window, per second.
func (c *ChurnStats) perSecond(n float64) float64 { return n / c.Window.Seconds() }

// Converged is when the last affected proxy converged.
func (p *Phase) Converged() time.Duration {
	if len(p.Lat) == 0 {
		return p.Synced
	}
	return max(slices.Max(p.Lat), p.Synced)
}

// Percentile returns the q-quantile (0..1) of the convergence times.
func (p *Phase) Percentile(q float64) time.Duration { return percentile(p.Lat, q) }

// percentile returns the q-quantile (0..1) of lat, 0 when it is empty.
func percentile(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Result is one cell's measurements.
type Result struct {
	Cell
	Phases              []*Phase
	RSSBefore, RSSAfter int64
	// PeakRSS is the most the control plane was resident at, garbage and
	// all (no GC forced): the high-water mark of the process that served
	// the sync and the events and of the one started again, whichever is
	// higher. Under a memory limit, it is what must stay below it.
	PeakRSS int64
	Err     string
}

// RSSPerProxy is the control plane's resident memory per connected proxy.
func (r *Result) RSSPerProxy() float64 {
	return float64(r.RSSAfter-r.RSSBefore) / float64(r.N)
}

// Failures counts proxies that were wrong or late, over all phases.
func (r *Result) Failures() int {
	n := 0
	if r.Err != "" {
		n++
	}
	for _, p := range r.Phases {
		n += p.Failed
	}
	return n
}

// RunOptions tune a run.
type RunOptions struct {
	// EndpointEvents is how many single-endpoint events are measured.
	EndpointEvents int
	// ProfileDir, when set, receives a CPU profile of each control plane
	// over its event phases (after the initial sync, before the restart).
	ProfileDir string
	// Timeout bounds each phase.
	Timeout time.Duration
	// GoMemLimit, when set, is the GOMEMLIMIT of every control-plane
	// process, as the Helm chart sets it from the container's memory limit.
	GoMemLimit string
	Log        io.Writer
}

// cpProc is a control-plane process.
type cpProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	addr    string
	started time.Time
	ready   time.Time
}

func spawn(c Cell, addr, replay, goMemLimit string) (*cpProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "-impl", c.Impl, "-services", strconv.Itoa(c.S), "-layout", string(c.Layout),
		"-protocol", string(c.Protocol), "-addr", addr, "-routes", strconv.Itoa(c.Routes)}
	if replay != "" {
		args = append(args, "-replay", replay)
	}
	if c.Churn.On() {
		args = append(args, "-coalesce-window", c.Churn.Window.String())
	}
	return spawnArgs(self, args, goMemLimit)
}

// spawnArgs starts `bench serve` with args and waits for it to serve.
func spawnArgs(self string, args []string, goMemLimit string) (*cpProc, error) {
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	if goMemLimit != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+goMemLimit)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &cpProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16), started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	line, err := p.read(5 * time.Minute)
	if err != nil {
		p.kill()
		return nil, fmt.Errorf("control plane did not start: %w", err)
	}
	a, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		p.kill()
		return nil, fmt.Errorf("control plane said %q", line)
	}
	p.addr, p.ready = a, time.Now()
	return p, nil
}

func (p *cpProc) read(timeout time.Duration) (string, error) {
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", errors.New("control plane exited")
		}
		return l, nil
	case <-time.After(timeout):
		return "", errors.New("control plane did not answer in time")
	}
}

// do sends one command and returns the answer.
func (p *cpProc) do(cmd string) (string, error) {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return "", err
	}
	l, err := p.read(10 * time.Minute)
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(l, "error ") {
		return "", fmt.Errorf("%s: %s", cmd, l)
	}
	return l, nil
}

// priced is what the control plane says the other protocol would have sent
// so far (-1 when it does not say).
func (p *cpProc) priced() (int64, error) {
	l, err := p.do("priced")
	if err != nil {
		return 0, err
	}
	var n int64
	_, err = fmt.Sscanf(l, "priced %d", &n)
	return n, err
}

// synced is how many streams the control plane counts at their scope's
// version (-1 when it does not say).
// synced is how many streams bound at or after since the control plane
// counts in sync.
func (p *cpProc) synced(since time.Time) (int, error) {
	l, err := p.do(fmt.Sprintf("synced %d", since.UnixNano()))
	if err != nil {
		return 0, err
	}
	var n int
	_, err = fmt.Sscanf(l, "synced %d", &n)
	return n, err
}

// cpu is the process's user+system CPU time so far.
func (p *cpProc) cpu() (time.Duration, error) {
	l, err := p.do("usage")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(l, "usage "), 10, 64)
	return time.Duration(n), err
}

// rss is the process's resident set after a forced GC, from /proc.
func (p *cpProc) rss() (int64, error) {
	if _, err := p.do("gc"); err != nil {
		return 0, err
	}
	return p.status("VmRSS")
}

// peakRSS is the most the process has been resident at so far.
func (p *cpProc) peakRSS() (int64, error) { return p.status("VmHWM") }

// status reads one size field of the process's /proc status, in bytes.
func (p *cpProc) status(field string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status"))
	if err != nil {
		return 0, err
	}
	return statusField(b, field)
}

func (p *cpProc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

func (p *cpProc) quit() {
	_, _ = io.WriteString(p.stdin, "quit\n")
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// runCell measures one cell: initial sync, the events, a reconnect of every
// stream, a restart.
func runCell(c Cell, o RunOptions) *Result {
	res := &Result{Cell: c}
	if err := runCellErr(c, o, res); err != nil {
		res.Err = err.Error()
	}
	return res
}

func logf(o RunOptions, format string, a ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", a...)
	}
}

func runCellErr(c Cell, o RunOptions, res *Result) error {
	w := NewWorld(WorldParams{Services: c.S, Layout: c.Layout, Protocol: c.Protocol, Routes: c.Routes})
	truths, err := truthsOf(w, c.N)
	if err != nil {
		return err
	}
	cp, err := spawn(c, "127.0.0.1:0", "", o.GoMemLimit)
	if err != nil {
		return err
	}
	defer func() {
		if cp != nil {
			cp.quit()
		}
	}()
	if res.RSSBefore, err = cp.rss(); err != nil {
		return err
	}
	l, err := newLoad(cp.addr, c.N, c.Protocol, w)
	if err != nil {
		return err
	}
	defer l.close()

	// Initial sync: every proxy connects at once and must receive its scope.
	ph := &Phase{Name: "sync"}
	armChanges(l, ph, c.Protocol, nil, truths)
	profBase := ""
	if o.ProfileDir != "" {
		profBase, _ = filepath.Abs(filepath.Join(o.ProfileDir, fileName(c.String())))
	}
	if err := profiled(cp, profBase, "0-sync", func() error {
		return measure(cp, l, ph, o, func() error { l.start(); return nil }, truths)
	}); err != nil {
		return err
	}
	ph.Reopened -= c.N // each proxy's first stream
	res.Phases = append(res.Phases, ph)
	logf(o, "  %s: %s", c, phaseLine(ph))
	if res.RSSAfter, err = cp.rss(); err != nil {
		return err
	}

	if profBase != "" {
		if _, err := cp.do("heapprofile " + profBase + ".heap.pprof"); err != nil {
			return err
		}
	}
	if c.Churn.On() {
		var ph *Phase
		if err := profiled(cp, profBase, "1-"+EvChurn, func() (err error) {
			ph, err = runChurn(cp, l, w, truths, c, o)
			return err
		}); err != nil {
			return err
		}
		res.Phases = append(res.Phases, ph)
		logf(o, "  %s: %s", c, phaseLine(ph))
		return nil
	}
	events := make([]string, 0, o.EndpointEvents+2)
	for range o.EndpointEvents {
		events = append(events, EvEndpoint)
	}
	if c.Routes > 0 {
		events = append(events, EvRouteWeights, EvRouteWeights)
	}
	events = append(events, EvDrain, EvAddRemove)
	for _, ev := range events {
		ph := &Phase{Name: ev}
		if _, err := w.Apply(ev); err != nil {
			return err
		}
		nextTruths, err := truthsOf(w, c.N)
		if err != nil {
			return err
		}
		armChanges(l, ph, c.Protocol, truths, nextTruths)
		truths = nextTruths
		if err := profiled(cp, profBase, fmt.Sprintf("%d-%s", len(res.Phases), ev), func() error {
			return measure(cp, l, ph, o, func() error { _, err := cp.do("event " + ev); return err }, truths)
		}); err != nil {
			return err
		}
		res.Phases = append(res.Phases, ph)
		logf(o, "  %s: %s", c, phaseLine(ph))
	}
	// Reconnect: every proxy's stream breaks and is opened again at once to
	// the same control plane, delta proxies declaring what they hold, SotW
	// ones naming the versions they accepted; each must get an answer for
	// each type (or, for scopeplane's SotW proxies, which are sent nothing
	// of a type whose version they name, have opened its new stream) and
	// still hold the truth.
	// The free ones are counted once the control plane counts each new
	// stream in sync, having answered (and priced) every type.
	ph = &Phase{Name: EvReconnect, Affected: c.N}
	free := c.Impl == "scopeplane" && c.Protocol == model.SotW
	need, _ := typesOf(c.Protocol)
	if free {
		need = 0
	}
	for _, p := range l.proxies {
		p.armReopen(need)
	}
	if err := profiled(cp, profBase, fmt.Sprintf("%d-%s", len(res.Phases), EvReconnect), func() error {
		return measure(cp, l, ph, o, func() (err error) {
			t0 := time.Now()
			l.reconnect()
			if free {
				ph.Synced, err = waitSynced(cp, c.N, t0, t0.Add(o.Timeout))
			}
			return err
		}, truths)
	}); err != nil {
		return err
	}
	ph.Reopened -= c.N // each proxy reconnects once
	res.Phases = append(res.Phases, ph)
	logf(o, "  %s: %s", c, phaseLine(ph))

	// Restart: kill the control plane, start it again with the same world;
	// every proxy reconnects (delta ones declaring what they hold) and must
	// get an answer for each type, and still hold the truth.
	// A SotW proxy of scopeplane that names the served version of a type is
	// sent nothing of it: it has converged once its new stream is open and
	// the control plane counts it in sync, which is asked below.
	ph = &Phase{Name: "restart", Affected: c.N}
	need, _ = typesOf(c.Protocol)
	if free {
		need = 0
	}
	for _, p := range l.proxies {
		p.armReopen(need)
	}
	before, opens := l.counts(), l.opens()
	l.tr.done.Store(0)
	load0 := cpuNanos()
	if res.PeakRSS, err = cp.peakRSS(); err != nil {
		return err
	}
	t0 := time.Now()
	cp.kill()
	next, err := spawn(c, cp.addr, strings.Join(w.Applied, ","), o.GoMemLimit)
	if err != nil {
		cp = nil
		return err
	}
	cp = next
	ph.Ready = cp.ready.Sub(t0)
	l.waitDone(ph.Affected, t0.Add(o.Timeout))
	if free {
		if ph.Synced, err = waitSynced(cp, c.N, t0, t0.Add(o.Timeout)); err != nil {
			return err
		}
	}
	l.settle(quiet, maxSettle)
	if ph.CPU, err = cp.cpu(); err != nil {
		return err
	}
	ph.LoadCPU = time.Duration(cpuNanos() - load0)
	peak, err := cp.peakRSS()
	if err != nil {
		return err
	}
	res.PeakRSS = max(res.PeakRSS, peak)
	if ph.Priced, err = cp.priced(); err != nil { // the new process's, from its start
		return err
	}
	ph.Reopened = l.opens() - opens - c.N // each proxy reconnects once
	finish(l, ph, t0, before, truths)
	res.Phases = append(res.Phases, ph)
	logf(o, "  %s: %s", c, phaseLine(ph))
	return nil
}

// armChanges arms every proxy for what changed between the truths of its
// view (from nothing when prev is nil: a sync), and adds to the phase the
// proxies affected and the least a stream of the protocol could carry to
// them.
func armChanges(l *load, ph *Phase, p model.Protocol, prev, next map[int]*Truth) {
	diffs, limits := map[int][]ResChange{}, map[int]int{}
	for v := range next {
		if d := Diff(prev[v], next[v]); len(d) > 0 {
			diffs[v], limits[v] = d, limitBytes(p, next[v], d)
		}
	}
	for _, px := range l.proxies {
		d := diffs[px.view]
		if len(d) == 0 {
			px.arm(nil, 0, false)
			continue
		}
		pending := make(map[resKey]want, len(d))
		for _, ch := range d {
			pending[resKey{ch.T, ch.Name}] = want{present: ch.Present, digest: ch.Digest}
		}
		px.arm(pending, 0, true)
		ph.Affected++
		ph.Limit += int64(limits[px.view])
	}
}

// profiled runs one phase under a CPU profile of the control plane, written
// to <profBase>.<name>.cpu.pprof, when profBase is set.
func profiled(cp *cpProc, profBase, name string, run func() error) error {
	if profBase == "" {
		return run()
	}
	if _, err := cp.do("profile " + profBase + "." + name + ".cpu.pprof"); err != nil {
		return err
	}
	if err := run(); err != nil {
		return err
	}
	_, err := cp.do("profile-stop")
	return err
}

// waitSynced polls the control plane until it counts n streams in sync,
// and returns when that was, from t0; past the deadline it is an error.
func waitSynced(cp *cpProc, n int, t0, deadline time.Time) (time.Duration, error) {
	for {
		got, err := cp.synced(t0)
		if err != nil {
			return 0, err
		}
		if got >= n {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the control plane counts %d of %d proxies in sync on their new streams", got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// truthsOf returns the truth of each view that n proxies hold, by view.
func truthsOf(w *World, n int) (map[int]*Truth, error) {
	out := map[int]*Truth{}
	for i, v := range w.Views() {
		if i >= n {
			break
		}
		tr, err := w.Truth(v)
		if err != nil {
			return nil, err
		}
		out[i] = tr
	}
	return out, nil
}

const (
	quiet     = 300 * time.Millisecond
	maxSettle = 30 * time.Second
)

// measure runs one phase: trigger, wait until the armed proxies converged,
// wait for the traffic to stop, then read the costs and verify every proxy.
func measure(cp *cpProc, l *load, ph *Phase, o RunOptions, trigger func() error, truths map[int]*Truth) error {
	before, opens := l.counts(), l.opens()
	l.tr.done.Store(0)
	cpu0, err := cp.cpu()
	if err != nil {
		return err
	}
	priced0, err := cp.priced()
	if err != nil {
		return err
	}
	load0 := cpuNanos()
	t0 := time.Now()
	if err := trigger(); err != nil {
		return err
	}
	l.waitDone(ph.Affected, t0.Add(o.Timeout))
	l.settle(quiet, maxSettle)
	cpu1, err := cp.cpu()
	if err != nil {
		return err
	}
	ph.CPU = cpu1 - cpu0
	ph.LoadCPU = time.Duration(cpuNanos() - load0)
	if ph.Priced, err = cp.priced(); err == nil && ph.Priced >= 0 {
		ph.Priced -= priced0
	}
	ph.Reopened = l.opens() - opens
	finish(l, ph, t0, before, truths)
	return err
}

// finish reads a phase's traffic and convergence times, and checks every
// proxy against the truth of its view.
func finish(l *load, ph *Phase, t0 time.Time, before adsclient.Counts, truths map[int]*Truth) {
	after := l.counts()
	ph.Bytes = after.Bytes - before.Bytes
	ph.Responses = after.Responses - before.Responses
	ph.Resources = after.Resources - before.Resources
	fail := func(err error) {
		ph.Failed++
		if len(ph.Errors) < 5 {
			ph.Errors = append(ph.Errors, err.Error())
		}
	}
	for _, p := range l.proxies {
		done, at, left, counted := p.result()
		switch {
		case !counted:
		case done:
			ph.Lat = append(ph.Lat, at.Sub(t0))
		default:
			fail(fmt.Errorf("proxy-%d did not converge: %d resources still pending", p.idx, left))
			continue
		}
		if err := p.verify(truths[p.view]); err != nil {
			fail(err)
		}
	}
}
