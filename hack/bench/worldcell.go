package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// WorldCell is one world-scale cell: scopeplane's whole operator against a
// real API server holding S Services, the scopes of a layout, and N proxies.
type WorldCell struct {
	Protocol model.Protocol
	Layout   Layout
	S, N     int
	// Shards, above 1, makes the operator one shard of that many
	// (docs/sharding.md): the shard of team-0 (or tenant-0), whose scopes
	// the events change. Its proxies are N, that shard's share of the
	// layout's.
	Shards int
}

func (c WorldCell) String() string {
	s := fmt.Sprintf("operator/%s/%s/S=%d/N=%d", c.Protocol, c.Layout, c.S, c.N)
	if c.Shards > 1 {
		s += fmt.Sprintf("/shard %d of %d", c.shard(), c.Shards)
	}
	return s
}

// worldScopeKey is the key of the layout's scope k.
func worldScopeKey(l Layout, k int) model.Key {
	ps := worldScope(l, k, model.SotW)
	return model.Key{Namespace: ps.Namespace, Name: ps.Name}
}

// shard is the shard the cell's operator is: the one of the scope the
// events change (see moveEndpoint), 0 unsharded.
func (c WorldCell) shard() int {
	if c.Shards <= 1 {
		return 0
	}
	return shard.Of(worldScopeKey(c.Layout, 0), c.Shards)
}

// ColdStart is how long a control-plane process took from its start to
// each step of serving.
type ColdStart struct {
	// Listed, Reconciled and Built are what the process reports: every
	// informer had listed its kind; every object listed then had been
	// reconciled into the catalog; the first snapshots were built.
	Listed, Reconciled, Built time.Duration
	// FirstServed and AllServed are when the first and the last proxy held
	// the truth (for a restart, had its new stream answered).
	FirstServed, AllServed time.Duration
}

// StatusWrites is how the leader brought every scope's status up to date.
type StatusWrites struct {
	// Current is from the process's start until the last scope's status
	// became current (counted all its proxies connected and in sync, at its
	// generation), every status then staying current for statusQuiet; 0
	// when every status stayed current throughout.
	Current time.Duration
	// Writes are the status writes (PATCH, PUT) of ProxyScopes the API
	// server served from the start until then, statusQuiet included;
	// Rate is Writes per second over that time.
	Writes int64
	Rate   float64
	// Stale counts the scopes whose status was not current at the deadline.
	Stale int
}

// WorldResult is one world cell's measurements.
type WorldResult struct {
	WorldCell
	Phases []*Phase
	// Start is the first start, with no status written yet; Restart the
	// start after a kill, with every status and bootstrap ConfigMap there.
	Start, Restart             ColdStart
	StatusStart, StatusRestart StatusWrites
	// RSSAfter is the resident set after the sync and a forced GC; PeakRSS
	// the high-water mark of both processes.
	RSSAfter, PeakRSS int64
	// StartPeaks and RestartPeaks are, per phase of each process's life,
	// the memory at its highest resident set (the "peaks" command).
	StartPeaks, RestartPeaks string
	// Heap is the live heap after the sync by what holds it (heapLayers).
	Heap map[string]int64
	// Scopes is how many scopes the operator serves and writes: all of
	// the layout's, or its shard's.
	Scopes int
	Err    string
}

// worldEndpointEvents is how many endpoint moves a world cell measures:
// their median is the figure, since a collection of the whole heap, which
// at S=100,000 takes a good part of a second, may fall into any one.
const worldEndpointEvents = 5

// worldTimeout bounds each phase of a world cell; a start at S=100,000
// lists two hundred thousand objects first.
const worldTimeout = 10 * time.Minute

func runWorldCell(c WorldCell, o RunOptions) *WorldResult {
	res := &WorldResult{WorldCell: c}
	if err := runWorldCellErr(c, o, res); err != nil {
		res.Err = err.Error()
	}
	return res
}

func runWorldCellErr(c WorldCell, o RunOptions, res *WorldResult) error {
	env, err := openWorld(c.S, o)
	if err != nil {
		return err
	}
	defer func() { _ = env.close() }()
	if err := env.createLayout(c.Layout, c.Protocol); err != nil {
		return fmt.Errorf("creating the scopes: %w (the servers said: %s)", err, env.logTail())
	}
	aw, err := env.read(WorldParams{Services: c.S, Layout: c.Layout, Protocol: c.Protocol})
	if err != nil {
		return fmt.Errorf("reading the world back: %w (the servers said: %s)", err, env.logTail())
	}
	if c.Shards > 1 {
		// The proxies, truths and statuses are of the shard's scopes.
		aw.Scopes = slices.DeleteFunc(aw.Scopes, func(sc *model.Scope) bool { return shard.Of(sc.Key, c.Shards) != c.shard() })
	}
	res.Scopes = len(aw.Scopes)
	truths, err := aw.truths(c.N, nil, nil)
	if err != nil {
		return err
	}
	statuses, err := watchStatuses(env, proxiesOf(aw.World, c.N))
	if err != nil {
		return err
	}
	defer statuses.stop()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// With a profile directory, each start is profiled until its proxies
	// are served.
	args := func(addr, start string) []string {
		a := []string{"serve", "-impl", "operator", "-kubeconfig", env.kubeconfig, "-protocol", string(c.Protocol), "-addr", addr,
			"-shards", fmt.Sprint(max(1, c.Shards)), "-shard", fmt.Sprint(c.shard())}
		if o.ProfileDir != "" {
			prefix := filepath.Join(o.ProfileDir, fileName(c.String())+"."+start)
			a = append(a, "-cpuprofile", prefix+".cpu.pprof", "-heapprofiles", prefix)
		}
		return a
	}
	stopProfile := func(cp *cpProc) error {
		if o.ProfileDir == "" {
			return nil
		}
		_, err := cp.do("profile-stop")
		return err
	}
	writes0, err := env.statusWrites()
	if err != nil {
		return err
	}
	statuses.reset()
	cp, err := spawnArgs(self, args("127.0.0.1:0", "start"), o.GoMemLimit)
	if err != nil {
		return err
	}
	defer func() {
		if cp != nil {
			cp.quit()
		}
	}()
	l, err := newLoad(cp.addr, c.N, c.Protocol, aw.World)
	if err != nil {
		return err
	}
	defer l.close()
	if o.ProfileDir != "" {
		// The API server's side of the first start: the lists, then the
		// status writes that follow the first build.
		path := filepath.Join(o.ProfileDir, fileName(c.String())+".start.apiserver.cpu.pprof")
		go func() {
			if err := env.apiProfile(apiProfileSpan, path); err != nil {
				logf(o, "  %s: the API server's profile: %v", c, err)
			}
		}()
	}

	// The first start: once the operator is ready (its first snapshots
	// built, what /readyz waits for), every proxy connects and must
	// receive its scope.
	if err := waitBuilt(cp, time.Now().Add(worldTimeout)); err != nil {
		return err
	}
	ph := &Phase{Name: "sync"}
	armChanges(l, ph, c.Protocol, nil, truths)
	armed := time.Now()
	if err := measure(cp, l, ph, RunOptions{Timeout: worldTimeout}, func() error { l.start(); return nil }, truths); err != nil {
		return err
	}
	if ph.CPU, err = cp.cpu(); err != nil { // everything since the start
		return err
	}
	ph.Reopened -= c.N
	if err := stopProfile(cp); err != nil {
		return err
	}
	res.Phases = append(res.Phases, ph)
	logf(o, "  %s: %s", c, phaseLine(ph))
	if res.Start, err = coldStart(cp, ph, armed); err != nil {
		return err
	}
	if res.StartPeaks, err = peaks(cp); err != nil {
		return err
	}
	res.StatusStart = statuses.wait(cp.started, env, writes0, worldTimeout)
	logf(o, "  %s: start %s; statuses %s", c, res.Start, res.StatusStart)
	logf(o, "  %s: start's highest RSS per phase: %s", c, res.StartPeaks)
	if _, err := cp.do("phase events"); err != nil {
		return err
	}
	if res.RSSAfter, err = cp.rss(); err != nil {
		return err
	}
	heap := filepath.Join(env.dir, "heap.pprof")
	if _, err := cp.do("heapprofile " + heap); err != nil {
		return err
	}
	if res.Heap, err = heapLayers(heap); err != nil {
		return err
	}
	if o.ProfileDir != "" {
		_ = copyTree(heap, filepath.Join(o.ProfileDir, fileName(c.String())+".heap.pprof"))
	}

	events := []worldEvent{}
	for m := range worldEndpointEvents {
		events = append(events, aw.moveEndpoint(env, m+1))
	}
	events = append(events, aw.addService(env, c.S))
	if c.Layout == Teams {
		events = append(events, aw.moveSelector(env))
	}
	for _, ev := range events {
		ph := &Phase{Name: ev.name}
		if err := ev.model(); err != nil {
			return err
		}
		next, err := aw.truths(c.N, truths, ev.touches)
		if err != nil {
			return err
		}
		armChanges(l, ph, c.Protocol, truths, next)
		truths = next
		if err := measure(cp, l, ph, RunOptions{Timeout: worldTimeout}, ev.write, truths); err != nil {
			return err
		}
		res.Phases = append(res.Phases, ph)
		logf(o, "  %s: %s", c, phaseLine(ph))
	}

	// Restart: kill the operator and start it again on the same API
	// server; every proxy reconnects and must get an answer for each type
	// (a SotW proxy that names the served version gets none: counted in
	// sync instead), and the new leader brings every status up to date.
	ph = &Phase{Name: "restart", Affected: c.N}
	need, _ := typesOf(c.Protocol)
	if c.Protocol == model.SotW {
		need = 0
	}
	for _, p := range l.proxies {
		p.armReopen(need)
	}
	before, opens := l.counts(), l.opens()
	l.tr.done.Store(0)
	if res.PeakRSS, err = cp.peakRSS(); err != nil {
		return err
	}
	if res.StartPeaks, err = peaks(cp); err != nil {
		return err
	}
	if writes0, err = env.statusWrites(); err != nil {
		return err
	}
	statuses.reset()
	cp.kill()
	next, err := spawnArgs(self, args(cp.addr, "restart"), o.GoMemLimit)
	if err != nil {
		cp = nil
		return err
	}
	cp = next
	t0 := cp.started
	l.waitDone(ph.Affected, t0.Add(worldTimeout))
	if c.Protocol == model.SotW {
		if ph.Synced, err = waitSynced(cp, c.N, t0, t0.Add(worldTimeout)); err != nil {
			return err
		}
	}
	l.settle(quiet, maxSettle)
	if err := stopProfile(cp); err != nil {
		return err
	}
	if ph.CPU, err = cp.cpu(); err != nil {
		return err
	}
	peak, err := cp.peakRSS()
	if err != nil {
		return err
	}
	res.PeakRSS = max(res.PeakRSS, peak)
	if res.RestartPeaks, err = peaks(cp); err != nil {
		return err
	}
	logf(o, "  %s: restart's highest RSS per phase: %s", c, res.RestartPeaks)
	ph.Reopened = l.opens() - opens - c.N
	finish(l, ph, t0, before, truths)
	res.Phases = append(res.Phases, ph)
	logf(o, "  %s: %s", c, phaseLine(ph))
	if res.Restart, err = coldStart(cp, ph, t0); err != nil {
		return err
	}
	if ph.Synced > 0 {
		res.Restart.AllServed = max(res.Restart.AllServed, ph.Synced)
	}
	res.StatusRestart = statuses.wait(t0, env, writes0, worldTimeout)
	logf(o, "  %s: restart %s; statuses %s", c, res.Restart, res.StatusRestart)
	return nil
}

// peaks is the process's highest resident set per phase of its life so
// far, as the operator's "peaks" command answers it.
func peaks(cp *cpProc) (string, error) {
	l, err := cp.do("peaks")
	if err != nil {
		return "", err
	}
	p, ok := strings.CutPrefix(l, "peaks")
	if !ok {
		return "", fmt.Errorf("peaks: %q", l)
	}
	return strings.TrimSpace(p), nil
}

// waitBuilt waits until the process has built its first snapshots.
func waitBuilt(cp *cpProc, deadline time.Time) error {
	for {
		cs, err := coldStart(cp, &Phase{}, cp.started)
		if err != nil || cs.Built > 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the operator built no snapshot: %s", cs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// proxiesOf counts, per scope of w, how many of n proxies hold it: proxy i
// holds view i modulo the views, one view per scope here.
func proxiesOf(w *World, n int) map[model.Key]int32 {
	views := w.Views()
	out := make(map[model.Key]int32, len(views))
	for _, sc := range w.Scopes {
		out[sc.Key] = 0
	}
	for i := range n {
		out[w.Scopes[views[i%len(views)].Scope].Key]++
	}
	return out
}

// coldStart reads the process's start phases and, from the phase, when
// its first and last proxy converged (t0: when the phase's clock started).
func coldStart(cp *cpProc, ph *Phase, t0 time.Time) (ColdStart, error) {
	var cs ColdStart
	l, err := cp.do("phases")
	if err != nil {
		return cs, err
	}
	if _, err := fmt.Sscanf(l, "phases %d %d %d", &cs.Listed, &cs.Reconciled, &cs.Built); err != nil {
		return cs, fmt.Errorf("phases: %q: %w", l, err)
	}
	if len(ph.Lat) > 0 {
		off := t0.Sub(cp.started)
		cs.FirstServed, cs.AllServed = off+percentile(ph.Lat, 0), off+ph.Converged()
	}
	return cs, nil
}

func (cs ColdStart) String() string {
	return fmt.Sprintf("listed=%s reconciled=%s built=%s first-served=%s all-served=%s",
		ms(cs.Listed), ms(cs.Reconciled), ms(cs.Built), ms(cs.FirstServed), ms(cs.AllServed))
}

func (s StatusWrites) String() string {
	return fmt.Sprintf("current=%s writes=%d rate=%.0f/s stale=%d", ms(s.Current), s.Writes, s.Rate, s.Stale)
}

// worldEvent is one change of a world cell: model updates the model (and
// so the truth) to what write then makes the API server hold; touches
// names the scopes whose truth it can change.
type worldEvent struct {
	name         string
	model, write func() error
	touches      func(*model.Scope) bool
}

// selecting is touches for a change of the Service k: the scopes that
// select it (its labels do not change).
func (a *apiWorld) selecting(k model.Key) func(*model.Scope) bool {
	return func(sc *model.Scope) bool { return sc.Selects(a.Services[k], nil, false) }
}

// moveEndpoint moves the first endpoint of svc-0 (in team-0 and tenant-0)
// to a new address, as when its pod is replaced: the m-th move.
func (a *apiWorld) moveEndpoint(env *worldEnv, m int) worldEvent {
	k := model.Key{Namespace: worldNamespace(0), Name: "svc-0"}
	var next *discoveryv1.EndpointSlice
	return worldEvent{name: EvEndpoint, touches: a.selecting(k),
		model: func() error {
			next = a.slices[k].DeepCopy()
			next.Endpoints[0] = worldEndpoint(0, 0, m)
			a.setService(a.services[k], next)
			return nil
		},
		write: func() error {
			obj := next.DeepCopy()
			if err := env.fast.Update(context.Background(), obj); err != nil {
				return err
			}
			a.slices[k] = obj
			return nil
		},
	}
}

// addService creates Service i, of team-0 and tenant-0, with its slice.
func (a *apiWorld) addService(env *worldEnv, i int) worldEvent {
	svc, slice := worldService(i)
	return worldEvent{name: "addservice", touches: a.selecting(model.Key{Namespace: svc.Namespace, Name: svc.Name}),
		model: func() error { a.setService(svc, slice); return nil },
		write: func() error {
			ctx := context.Background()
			if err := env.fast.Create(ctx, svc.DeepCopy()); err != nil {
				return err
			}
			return env.fast.Create(ctx, slice.DeepCopy())
		},
	}
}

// moveSelector points team-0's scope at team-1's Services (in ns-1, which
// grants it): every Service of the scope leaves it and as many come in.
func (a *apiWorld) moveSelector(env *worldEnv) worldEvent {
	k := model.Key{Namespace: worldNamespace(0), Name: "team-0"}
	var next *xdsv1alpha1.ProxyScope
	return worldEvent{name: "selector", touches: func(sc *model.Scope) bool { return sc.Key == k },
		model: func() error {
			next = a.scopes[k].DeepCopy()
			next.Spec.Services = []xdsv1alpha1.ServiceSelection{{
				Namespace: xdsv1alpha1.DNSLabel(worldNamespace(1)),
				Selector:  &metav1.LabelSelector{MatchLabels: map[string]string{"team": "team-1"}},
			}}
			next.Generation++
			return a.setScope(next)
		},
		// The status changes under the driver: only the spec is patched.
		write: func() error {
			ctx := context.Background()
			cur := &xdsv1alpha1.ProxyScope{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(next), cur); err != nil {
				return err
			}
			edited := cur.DeepCopy()
			edited.Spec = next.Spec
			if err := env.Client.Patch(ctx, edited, client.MergeFrom(cur)); err != nil {
				return err
			}
			a.scopes[k] = edited
			return nil
		},
	}
}

// createLayout creates a layout's scopes, all of one protocol, and in the
// teams layout the ReferenceGrant that lets team-0's scope select team-1's
// Services (the selector event).
func (e *worldEnv) createLayout(l Layout, p model.Protocol) error {
	if l == Teams {
		grant := &gatewayv1beta1.ReferenceGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: worldNamespace(1), Name: "team-0-scopes"},
			Spec: gatewayv1beta1.ReferenceGrantSpec{
				From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1beta1.Group(xdsv1alpha1.GroupVersion.Group), Kind: "ProxyScope", Namespace: gatewayv1beta1.Namespace(worldNamespace(0))}},
				To:   []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: "Service"}},
			},
		}
		if err := e.Client.Create(context.Background(), grant); err != nil {
			return err
		}
	}
	return e.createScopes(l, p)
}

// fileName makes a cell's name a file name.
// apiProfileSpan is how long the API server is profiled from the first
// start: at 10,000 scopes, the lists, the build and most status writes.
const apiProfileSpan = 90 * time.Second

func fileName(s string) string {
	return strings.NewReplacer("/", "-", "=", "", " ", "_", ",", "").Replace(s)
}

// logTail is the end of what etcd and kube-apiserver printed.
func (e *worldEnv) logTail() string {
	b, err := os.ReadFile(e.logs.Name())
	if err != nil {
		return err.Error()
	}
	return tail(b, 2000)
}
