package server_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

var (
	modelSteps     = flag.Int("model.steps", 10_000, "TestModelRandomized: total random steps, split evenly over -model.seeds seeds")
	modelSeed      = flag.Uint64("model.seed", 1, "TestModelRandomized: first seed; 0 picks one from the clock")
	modelSeeds     = flag.Int("model.seeds", 20, "TestModelRandomized: number of seeds (seed, seed+1, ...)")
	modelTimeout   = flag.Duration("model.timeout", 10*time.Second, "TestModelRandomized: how long a proxy may take to catch up after a step")
	modelShrinkFor = flag.Duration("model.shrink", 2*time.Minute, "TestModelRandomized: time budget for shrinking a failing step list")
	modelParallel  = flag.Int("model.parallel", 2, "TestModelRandomized: seeds run at once")
)

// shrinking is set by the first failing seed, which alone is shrunk: one
// regression usually fails many seeds, and shrinking them all would take
// minutes each.
var shrinking atomic.Bool

// maxResponsesPerStep bounds the responses one proxy may receive for one
// step; the worlds are small, so more than this is a push loop.
const maxResponsesPerStep = 200

// TestModelRandomized drives a real ADS server over loopback gRPC with
// random world changes, proxy connects, disconnects, reconnects, NACKs and
// control-plane restarts, and checks after every step that every connected
// proxy holds exactly what an independent translation of its scope says.
// A failing seed is shrunk to a short step list by delta debugging.
func TestModelRandomized(t *testing.T) {
	seeds := max(*modelSeeds, 1)
	perSeed := max(*modelSteps/seeds, 1)
	base := *modelSeed
	if base == 0 {
		base = uint64(time.Now().UnixNano())
	}
	if testing.Short() {
		perSeed = max(perSeed/10, 1)
	}
	sem := make(chan struct{}, max(*modelParallel, 1))
	start := time.Now()
	t.Cleanup(func() {
		t.Logf("%d seeds from %d, %d steps each (%d in total), in %v", seeds, base, perSeed, seeds*perSeed, time.Since(start).Round(time.Millisecond))
	})
	for i := range seeds {
		seed := base + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			runSeed(t, seed, perSeed)
		})
	}
}

func runSeed(t *testing.T, seed uint64, n int) {
	steps, failedAt, counts, err := generateAndRun(seed, n, *modelTimeout)
	if err == nil {
		t.Logf("seed %d: %d steps OK (%s)", seed, n, counts)
		return
	}
	failing := steps[:failedAt+1]
	t.Logf("seed %d failed at step %d: %v", seed, failedAt, err)
	replay := func(cand []step) (int, error) { return replaySteps(cand, min(*modelTimeout, 3*time.Second)) }
	shrunk, shrunkErr := failing, err
	how := "not shrunk: another seed's failure is being shrunk"
	if shrinking.CompareAndSwap(false, true) {
		if idx, rerr := replay(failing); rerr == nil {
			how = "not shrunk: the failure did not reproduce when the steps were replayed (timing-dependent)"
		} else {
			shrunk, shrunkErr = shrink(failing[:idx+1], rerr, replay, *modelShrinkFor)
			how = fmt.Sprintf("shrunk from %d", len(failing))
		}
	}
	var b strings.Builder
	for i := range shrunk {
		fmt.Fprintf(&b, "  %3d  %s\n", i, shrunk[i].String())
	}
	t.Fatalf("seed %d failed at step %d of %d: %v\n\nreproduce: go test ./xds/server/ -run 'TestModelRandomized' -model.seed %d -model.seeds 1 -model.steps %d\n\n%d steps (%s), which fail with: %v\n%s",
		seed, failedAt, n, err, seed, failedAt+1, len(shrunk), how, shrunkErr, b.String())
}

// generateAndRun generates n steps from seed, applying and checking each as
// it goes, and returns the steps it ran; on failure, the index of the failing
// step and the error.
func generateAndRun(seed uint64, n int, timeout time.Duration) (steps []step, failedAt int, counts string, err error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h, err := newHarness(timeout)
	if err != nil {
		return nil, 0, "", err
	}
	defer h.close()
	steps = make([]step, 0, n)
	g := &generator{r: rng}
	for i := range n {
		s := g.next(h)
		steps = append(steps, s)
		if err := h.do(&s); err != nil {
			return steps, i, h.counts.String(), err
		}
	}
	return steps, -1, h.counts.String(), nil
}

// replaySteps runs a recorded step list on a fresh harness and returns the
// index of the first failing step and its error, or nil.
func replaySteps(steps []step, timeout time.Duration) (int, error) {
	h, err := newHarness(timeout)
	if err != nil {
		return 0, err
	}
	defer h.close()
	for i := range steps {
		if err := h.do(&steps[i]); err != nil {
			return i, err
		}
	}
	return -1, nil
}

// shrink is testkit's delta debugging over a failing step list, then
// splits batches: it tries dropping each change of a batch on its own.
func shrink(steps []step, lastErr error, fails func([]step) (int, error), budget time.Duration) ([]step, error) {
	deadline := time.Now().Add(budget)
	steps, lastErr = testkit.Shrink(steps, lastErr, fails, budget)
	// Batches are world changes applied at once; try them one change at a time.
	for i := 0; i < len(steps) && time.Now().Before(deadline); i++ {
		if steps[i].kind != kBatch {
			continue
		}
		for j := range steps[i].batch {
			cand := slices.Clone(steps)
			cand[i].batch = slices.Delete(slices.Clone(cand[i].batch), j, j+1)
			if idx, err := fails(cand); err != nil && idx >= i {
				steps, lastErr = cand[:idx+1], err
				i--
				break
			}
		}
	}
	return steps, lastErr
}

// stepKind says what a step does.
type stepKind uint8

const (
	kUpsertService stepKind = iota
	kDeleteService
	kUpsertNamespace
	kDeleteNamespace
	kUpsertScope
	kDeleteScope
	// kBatch applies several world changes before one build, so the
	// catalog coalesces them; a burst builds each on its own instead,
	// without waiting for the proxies in between, so that streams fall
	// several revisions behind, mid-push, and catch up across them (a
	// burst changes no scope: how a stream ends would depend on which
	// revisions it saw).
	kBatch
	kConnect
	kDisconnect
	kReconnect
	kNACK
	kRestart
	numKinds
)

var kindNames = [numKinds]string{"UpsertService", "DeleteService", "UpsertNamespace", "DeleteNamespace",
	"UpsertScope", "DeleteScope", "Batch", "Connect", "Disconnect", "Reconnect", "NACK", "Restart"}

// step is one recorded action. Everything it needs is in it, so that a
// subsequence of a step list can be replayed; actions on things that do not
// exist in the subsequence are no-ops.
type step struct {
	kind   stepKind
	note   string
	svc    *model.Service
	key    model.Key
	ns     string
	labels map[string]string
	scope  *model.Scope
	batch  []step
	burst  bool
	proxy  string
	ref    string
	proto  model.Protocol
	// zone is where the proxy of a Connect or Reconnect step runs, as its
	// bootstrap declares it; a Reconnect from another zone is a proxy that
	// moved.
	zone string
}

func (s *step) String() string {
	var b strings.Builder
	b.WriteString(kindNames[s.kind])
	switch s.kind {
	case kUpsertService:
		fmt.Fprintf(&b, " %s", fmtService(s.svc))
	case kDeleteService, kDeleteScope:
		fmt.Fprintf(&b, " %s", s.key)
	case kUpsertNamespace:
		fmt.Fprintf(&b, " %s %s", s.ns, fmtLabels(s.labels))
	case kDeleteNamespace:
		fmt.Fprintf(&b, " %s", s.ns)
	case kUpsertScope:
		fmt.Fprintf(&b, " %s", fmtScope(s.scope))
	case kBatch:
		if s.burst {
			b.WriteString(" burst")
		}
		b.WriteString(" {")
		for i := range s.batch {
			if i > 0 {
				b.WriteString(";")
			}
			b.WriteString(" ")
			b.WriteString(s.batch[i].String())
		}
		b.WriteString(" }")
	case kConnect:
		fmt.Fprintf(&b, " %s %s scope=%q zone=%q", s.proxy, s.proto, s.ref, s.zone)
	case kReconnect:
		fmt.Fprintf(&b, " %s zone=%q", s.proxy, s.zone)
	case kDisconnect, kNACK:
		fmt.Fprintf(&b, " %s", s.proxy)
	}
	if s.note != "" {
		fmt.Fprintf(&b, "  (%s)", s.note)
	}
	return b.String()
}

func fmtLabels(l map[string]string) string {
	if l == nil {
		return "{}"
	}
	return "{" + labels.Set(l).String() + "}"
}

func fmtService(svc *model.Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", svc.Key, fmtLabels(svc.Labels))
	if svc.ExternalName != "" {
		fmt.Fprintf(&b, " externalName=%s", svc.ExternalName)
	}
	b.WriteString(" ports=[")
	for i, p := range svc.Ports {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d/%s", p.Name, p.Port, p.Protocol)
		if p.AppProtocol != "" {
			fmt.Fprintf(&b, "/%s", p.AppProtocol)
		}
		if p.TargetPortName != "" {
			fmt.Fprintf(&b, "->%s", p.TargetPortName)
		} else {
			fmt.Fprintf(&b, "->%d", p.TargetPort)
		}
	}
	b.WriteString("] eps=[")
	for i, e := range svc.Endpoints {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s", e.Address)
		for _, p := range e.Ports {
			fmt.Fprintf(&b, ",%s=%d", p.Name, p.Port)
		}
		switch {
		case e.Ready:
			b.WriteString(",ready")
		case e.Serving:
			b.WriteString(",serving")
		}
		if e.Terminating {
			b.WriteString(",terminating")
		}
		if e.Zone != "" {
			fmt.Fprintf(&b, ",zone=%s", e.Zone)
		}
	}
	b.WriteString("]")
	return b.String()
}

func fmtScope(sc *model.Scope) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s gen=%d %s %s", sc.Key, sc.Generation, sc.Protocol, sc.Listener.Mode)
	if sc.Listener.Mode == model.ListenerEnvoy {
		fmt.Fprintf(&b, ":%d", sc.Listener.Port)
	}
	b.WriteString(" select=[")
	for i, s := range sc.Selections {
		if i > 0 {
			b.WriteString(" | ")
		}
		var parts []string
		if s.NamespaceSelector != nil {
			parts = append(parts, fmt.Sprintf("namespaceSelector(%s)", s.NamespaceSelector))
		} else {
			parts = append(parts, "ns="+s.Namespace)
		}
		if s.Names != nil {
			parts = append(parts, fmt.Sprintf("names=%v", slices.Sorted(maps.Keys(s.Names))))
		}
		if s.Selector != nil {
			parts = append(parts, fmt.Sprintf("selector(%s)", s.Selector))
		}
		b.WriteString(strings.Join(parts, " "))
	}
	b.WriteString("]")
	return b.String()
}

// applyToWorld applies a world-change step to w.
func applyToWorld(w *world, s *step) {
	switch s.kind {
	case kUpsertService:
		w.services[s.svc.Key] = s.svc
	case kDeleteService:
		delete(w.services, s.key)
	case kUpsertNamespace:
		w.namespaces[s.ns] = s.labels
	case kDeleteNamespace:
		delete(w.namespaces, s.ns)
	case kUpsertScope:
		w.scopes[s.scope.Key] = s.scope
	case kDeleteScope:
		delete(w.scopes, s.key)
	case kBatch:
		for i := range s.batch {
			applyToWorld(w, &s.batch[i])
		}
	}
}

// stepCounts counts what a run did, for the log.
type stepCounts struct {
	kinds     [numKinds]int
	refused   map[codes.Code]int
	ended     map[codes.Code]int
	nacks     int
	responses int
	// synced counts proxy checks at quiescent points, by protocol.
	synced map[model.Protocol]int
	// graceWaits counts waits for the response a change of a rejected type
	// causes, and graceMissed those that ended without one.
	graceWaits, graceMissed int
	// adopted counts the types SotW proxies reconnected with at the served
	// version (sent nothing), claimedStale those they named another
	// version of (sent the full set).
	adopted, claimedStale int
	// raced counts resources SotW proxies received just after they
	// unsubscribed from them (proxy.scanRaced).
	raced int64
}

func (c *stepCounts) String() string {
	var parts []string
	for k, n := range c.kinds {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", kindNames[k], n))
		}
	}
	return fmt.Sprintf("%s; refused %v; ended by the server %v; NACKs %d; responses %d; proxies checked in sync %v; grace waits %d (%d without a response); SotW reconnects: %d types at the served version, %d at another; resources received as the proxy unsubscribed from them %d",
		strings.Join(parts, " "), c.refused, c.ended, c.nacks, c.responses, c.synced, c.graceWaits, c.graceMissed, c.adopted, c.claimedStale, c.raced)
}

// harness is one run: the world, the control plane serving it, and the proxies.
type harness struct {
	w       *world
	cp      *controlPlane
	proxies map[string]*proxy
	timeout time.Duration
	truths  map[view]truth
	// last is every scope's truth, from every zone, after the previous
	// world change.
	last   map[view]truth
	counts stepCounts
}

func newHarness(timeout time.Duration) (*harness, error) {
	w := newWorld()
	cp, err := startControlPlane(w, loopbackFleet)
	if err != nil {
		return nil, err
	}
	return &harness{w: w, cp: cp, proxies: map[string]*proxy{}, timeout: timeout,
		counts: stepCounts{refused: map[codes.Code]int{}, ended: map[codes.Code]int{}, synced: map[model.Protocol]int{}}}, nil
}

func (h *harness) close() {
	for _, p := range h.proxies {
		_ = p.stop()
	}
	_ = h.cp.close()
}

// worldChange applies a world-change step to the world and to the catalog.
func (h *harness) worldChange(s *step) {
	applyToWorld(h.w, s)
	feed(h.cp.Catalog, s)
}

// feed applies a world-change step to a catalog, as the reconcilers would.
func feed(cat *catalog.Catalog, s *step) {
	switch s.kind {
	case kUpsertService:
		cat.UpsertService(s.svc)
	case kDeleteService:
		cat.DeleteService(s.key)
	case kUpsertNamespace:
		cat.UpsertNamespace(s.ns, s.labels)
	case kDeleteNamespace:
		cat.DeleteNamespace(s.ns)
	case kUpsertScope:
		cat.UpsertScope(s.scope)
	case kDeleteScope:
		cat.DeleteScope(s.key)
	case kBatch:
		for i := range s.batch {
			feed(cat, &s.batch[i])
		}
	}
}

// malformedRefs are scope references the server must refuse as malformed.
var malformedRefs = []string{"gw", "ns-a/gw/extra", "NS-A/gw", "ns-a/", "/gw", "ns-a/Gw_1"}

// expectation is what the model says a proxy's new stream leads to.
func (h *harness) expectation(p *proxy) (proxyState, codes.Code) {
	key, ok := p.key()
	if p.ref == "" || !ok || slices.Contains(malformedRefs, p.ref) {
		return ending, codes.InvalidArgument
	}
	sc := h.w.scopes[key]
	switch {
	case sc == nil:
		return ending, codes.NotFound
	case sc.Protocol != p.proto:
		return ending, codes.FailedPrecondition
	}
	return connected, codes.OK
}

func (h *harness) connect(p *proxy) {
	var sc *snapshot.Snapshot
	if key, ok := p.key(); ok {
		sc = h.cp.Store.Get(key)
	}
	adopted, stale := p.claims(sc)
	p.adopted = adopted
	p.start(h.cp.conn)
	p.state, p.want = h.expectation(p)
	if p.state == ending {
		h.counts.refused[p.want]++
		p.adopted = nil
		return
	}
	h.counts.adopted += len(adopted)
	h.counts.claimedStale += stale
}

// do applies one step and waits for quiescence, checking every proxy.
func (h *harness) do(s *step) error {
	h.counts.kinds[s.kind]++
	for _, p := range h.proxies {
		p.stepStart = len(p.c.Events())
		p.openedInStep = false
		p.changed = map[string]bool{}
	}
	h.truths = map[view]truth{}
	switch s.kind {
	case kUpsertService, kDeleteService, kUpsertNamespace, kDeleteNamespace, kUpsertScope, kDeleteScope, kBatch:
		if s.burst {
			for i := range s.batch {
				h.worldChange(&s.batch[i])
				h.cp.Sync()
			}
		} else {
			h.worldChange(s)
			h.cp.Sync()
		}
		if err := h.markContentChanges(); err != nil {
			return err
		}
		// A stream whose scope is gone, or now wants the other protocol, ends.
		for _, p := range h.proxies {
			if p.state != connected {
				continue
			}
			key, _ := p.key()
			switch sc := h.w.scopes[key]; {
			case sc == nil:
				p.state, p.want = ending, codes.NotFound
			case sc.Protocol != p.proto:
				p.state, p.want = ending, codes.FailedPrecondition
			}
			if p.state == ending {
				h.counts.ended[p.want]++
			}
		}
	case kConnect:
		if old := h.proxies[s.proxy]; old != nil {
			if err := h.disconnect(old); err != nil {
				return err
			}
		}
		p := newProxy(s.proxy, s.ref, s.proto)
		p.moveTo(s.zone)
		h.proxies[s.proxy] = p
		h.connect(p)
	case kDisconnect:
		if p := h.proxies[s.proxy]; p != nil {
			if err := h.disconnect(p); err != nil {
				return err
			}
		}
	case kReconnect:
		if p := h.proxies[s.proxy]; p != nil {
			if err := h.disconnect(p); err != nil {
				return err
			}
			p.moveTo(s.zone)
			h.connect(p)
		}
	case kNACK:
		if p := h.proxies[s.proxy]; p != nil {
			p.armed.Store(true)
		}
	case kRestart:
		if err := h.restart(); err != nil {
			return err
		}
	}
	return h.quiesce()
}

// disconnect ends a proxy's stream from the proxy's side.
func (h *harness) disconnect(p *proxy) error {
	was := p.state
	if err := p.stop(); err != nil {
		return err
	}
	p.state = idle
	if was == connected && endCode(p.err) != codes.Canceled {
		return fmt.Errorf("proxy %s: its stream ended before it disconnected: %w", p.id, p.err)
	}
	return nil
}

// restart stops the control plane, builds a new one from the world on a new
// listener, and reconnects every proxy that was connected; the proxies keep
// what they hold.
func (h *harness) restart() error {
	var live []*proxy
	for _, id := range slices.Sorted(maps.Keys(h.proxies)) {
		if p := h.proxies[id]; p.state == connected {
			live = append(live, p)
		}
	}
	if err := h.cp.stop(); err != nil {
		return err
	}
	for _, p := range live {
		ok, err := p.waitEnd(h.timeout)
		if !ok {
			return fmt.Errorf("proxy %s: stream still open %v after the control plane stopped", p.id, h.timeout)
		}
		if endCode(err) != codes.Unavailable {
			return fmt.Errorf("proxy %s: want its stream to end with Unavailable when the control plane stopped: %w", p.id, err)
		}
		p.state = idle
	}
	_ = h.cp.conn.Close()
	cp, err := startControlPlane(h.w, loopbackFleet)
	if err != nil {
		return err
	}
	h.cp = cp
	for _, p := range live {
		h.connect(p)
	}
	return nil
}

// markContentChanges records, for every connected proxy, which types of its
// scope the world change just changed: a response after such a change may
// legitimately repeat one the proxy NACKed before (the resource left and
// came back), which the resend check must not count.
func (h *harness) markContentChanges() error {
	now := map[view]truth{}
	for key := range h.w.scopes {
		for _, zone := range zones {
			tr, err := h.truth(key, zone)
			if err != nil {
				return err
			}
			now[view{key, zone}] = tr
		}
	}
	for _, p := range h.proxies {
		key, _ := p.key()
		at := view{key, p.zone}
		if p.state != connected || now[at] == nil {
			continue
		}
		for _, t := range allTypes {
			if !maps.EqualFunc(now[at][t], h.last[at][t], bytesEqual) {
				p.subMarks[t] = append(p.subMarks[t], p.stepStart)
				p.changed[t] = true
			}
		}
	}
	h.last = now
	return nil
}

// view is a scope as proxies of one zone see it.
type view struct {
	key  model.Key
	zone string
}

func (h *harness) truth(key model.Key, zone string) (truth, error) {
	if tr, ok := h.truths[view{key, zone}]; ok {
		return tr, nil
	}
	tr, err := h.w.truthOf(key, zone)
	if err != nil {
		return nil, err
	}
	h.truths[view{key, zone}] = tr
	return tr, nil
}

// quiesce waits until every proxy is where the model says it must be, and
// checks the invariants that hold at all times.
func (h *harness) quiesce() error {
	for _, id := range slices.Sorted(maps.Keys(h.proxies)) {
		p := h.proxies[id]
		switch p.state {
		case ending:
			ok, err := p.waitEnd(h.timeout)
			if !ok {
				return fmt.Errorf("proxy %s (%s, scope %q): its stream should end with %s but is still open after %v",
					p.id, p.proto, p.ref, p.want, h.timeout)
			}
			if got := endCode(err); got != p.want {
				return fmt.Errorf("proxy %s (%s, scope %q): want its stream to end with %s: %w", p.id, p.proto, p.ref, p.want, err)
			}
			p.state = idle
		case connected:
			if err := h.waitSynced(p); err != nil {
				return err
			}
			h.counts.synced[p.proto]++
			if err := p.sentNothingAdopted(); err != nil {
				return err
			}
		}
		evs := p.c.Events()
		h.counts.responses += len(evs) - p.stepStart
		for _, ev := range evs[p.stepStart:] {
			if !ev.Accepted {
				h.counts.nacks++
			}
		}
		if n := len(evs) - p.stepStart; n > maxResponsesPerStep {
			return fmt.Errorf("proxy %s received %d responses for one step", p.id, n)
		}
		h.counts.raced += p.scanRaced()
		st := p.c.Stats()
		unasked := st.Ignored != 0
		for _, t := range allTypes {
			unasked = unasked || st.ByType[t].Unrequested > p.raced[t]
		}
		if unasked {
			var b strings.Builder
			for _, t := range allTypes {
				if c := st.ByType[t]; c.Unrequested != 0 || c.Ignored != 0 {
					fmt.Fprintf(&b, " %s: unrequested %d (%d sent before the server read the unsubscription), ignored %d;", shortType(t), c.Unrequested, p.raced[t], c.Ignored)
				}
			}
			return fmt.Errorf("proxy %s (%s) received resources it did not subscribe to:%s\n%s", p.id, p.proto, b.String(), p.trace())
		}
		if s := p.nackResends(); s != "" {
			return fmt.Errorf("proxy %s: the server resent a NACKed version:\n%s%s", p.id, s, p.trace())
		}
	}
	return nil
}

// sentNothingAdopted checks the free reconnect: a SotW proxy whose stream
// opened during a step that changed nothing of its scope, naming the
// served version of a type, is sent not one byte of that type until it
// changes its subscription (after another type's full set, say), and
// holds the truth all the same (waitSynced checked that, strictly, since a
// new stream starts with nothing a NACK left behind).
func (p *proxy) sentNothingAdopted() error {
	if !p.openedInStep || len(p.changed) > 0 {
		return nil
	}
	resubscribed := func(t string) bool {
		marks := p.subMarks[t]
		return len(marks) > 0 && marks[len(marks)-1] >= p.streamStart
	}
	for _, ev := range p.c.Events()[p.streamStart:] {
		if p.adopted[ev.TypeURL] && !resubscribed(ev.TypeURL) {
			return fmt.Errorf("proxy %s reconnected at the served version of %s and was sent %d bytes of it (version %s):\n%s",
				p.id, shortType(ev.TypeURL), ev.Bytes, ev.Version, p.trace())
		}
	}
	return nil
}

// waitSynced waits until a connected proxy holds its scope's truth (as far
// as a NACK lets it), its SotW subscriptions follow what it holds, and
// nothing is in flight: the server's stream loop took every request the
// proxy sent, the proxy processed every response the server sent, and,
// unless a NACK left something behind, the server counts the proxy as in
// sync at the scope's current version. It repeats until a round sees no new
// response, since a response that arrives during the barriers can change
// what the proxy must subscribe to. Then it checks that the server does not
// count the proxy as in sync while it lacks part of the scope.
func (h *harness) waitSynced(p *proxy) error {
	key, _ := p.key()
	tr, err := h.truth(key, p.zone)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(h.timeout)
	describe := func() string {
		return fmt.Sprintf("proxy %s (%s, scope %s)", p.id, p.proto, key)
	}
	ended := func() error { return fmt.Errorf("%s: stream ended unexpectedly: %w", describe(), p.err) }
	for {
		// Taken before the proxy is seen to match: any response processed
		// from here on, even one that arrives just as the match is seen, makes
		// another round.
		seen := len(p.c.Events())
		// The proxy holds the truth and its subscriptions are stable.
		for {
			if !p.running() {
				return ended()
			}
			if p.sotw() {
				if _, err := p.adjustSubs(); err != nil {
					return fmt.Errorf("%s: %w", describe(), err)
				}
			}
			ok := waitClient(p, deadline, func() bool {
				if p.sotw() && !p.subsStable() {
					return true
				}
				return p.mismatch(tr, h.cp, key, false) == ""
			})
			if !p.running() {
				return ended()
			}
			if !ok {
				return fmt.Errorf("%s: not caught up %v after the step:\n%s%s", describe(), h.timeout, p.mismatch(tr, h.cp, key, false), p.trace())
			}
			if !p.sotw() || p.subsStable() {
				break
			}
		}
		// Nothing in flight either way.
		for {
			sentReqs := p.c.Stats().Requests - p.reqStart
			taken, sent, ok := h.cp.recvs.taken(p.stream)
			received := int64(len(p.c.Events()) - p.streamStart)
			if ok && taken >= sentReqs && received >= sent {
				break
			}
			if !p.running() {
				return ended()
			}
			if time.Now().After(deadline) && !ok {
				return fmt.Errorf("%s: in flight after %v: the proxy's stream %s never reached the server's handler", describe(), h.timeout, p.stream)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: in flight after %v: the server took %d of the %d requests the proxy sent, the proxy processed %d of the %d responses the server sent",
					describe(), h.timeout, taken, sentReqs, received, sent)
			}
			select {
			case <-h.cp.recvs.changed:
			case <-time.After(2 * time.Millisecond):
			}
		}
		// The server's own account: every response answered, none rejected.
		for !p.staleness().any() {
			ok, why := serverSynced(h.cp, key, p.id)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s holds the truth but the server does not count it in sync: %s\n%s", describe(), why, p.trace())
			}
			select {
			case <-h.cp.Feedback.Changes().Changed():
			case <-time.After(20 * time.Millisecond):
			}
		}
		// A type whose latest response was NACKed is checked leniently, so
		// the proxy can match before the server even woke up for this step;
		// when the step changed that type, give the response it causes a
		// moment to arrive. (Not a failure if none comes: nothing may be due,
		// e.g. when the change undid what the proxy rejected.)
		stale := p.staleness()
		for _, t := range allTypes {
			if _, _, thisStep := p.lastAnswer(t); stale.touches(t) && p.changed[t] && !thisStep {
				soon := time.Now().Add(100 * time.Millisecond)
				if deadline.Before(soon) {
					soon = deadline
				}
				h.counts.graceWaits++
				if !waitClient(p, soon, func() bool {
					_, _, thisStep := p.lastAnswer(t)
					return thisStep
				}) {
					h.counts.graceMissed++
				}
			}
		}
		if len(p.c.Events()) == seen {
			break
		}
	}
	if m := p.mismatch(tr, h.cp, key, false); m != "" {
		return fmt.Errorf("%s: held state moved after it was in sync:\n%s%s", describe(), m, p.trace())
	}
	// The scope's status must not count a proxy that lacks part of the
	// scope (it rejected it) as being at the scope's version.
	if m := p.mismatch(tr, h.cp, key, true); m != "" {
		if ok, _ := serverSynced(h.cp, key, p.id); ok {
			return fmt.Errorf("%s: the server counts the proxy in sync at the scope's version, but after a NACK it holds:\n%s%s", describe(), m, p.trace())
		}
	}
	return nil
}

// waitClient waits until cond holds, re-evaluating it on every client event
// and at least every 50ms; false when the deadline passed.
func waitClient(p *proxy, deadline time.Time, cond func() bool) bool {
	for {
		if !p.running() {
			return cond()
		}
		rem := time.Until(deadline)
		if rem <= 0 {
			return cond()
		}
		ctx, cancel := contextWithTimeout(min(rem, 50*time.Millisecond))
		err := p.c.WaitFor(ctx, func(*adsclient.Client) bool { return cond() })
		cancel()
		if err == nil {
			return true
		}
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// The small universe the generator draws from: few names, so that steps
// collide (the same Service changes, two namespaces hold same-named
// Services, scopes select overlapping sets).
var (
	nsNames   = []string{"ns-a", "ns-b", "ns-c"}
	svcNames  = []string{"svc-0", "svc-1", "svc-2", "svc-3"}
	scopeKeys = []model.Key{{Namespace: "ns-a", Name: "gw"}, {Namespace: "ns-b", Name: "mesh"}, {Namespace: "ns-a", Name: "edge"}}
	proxyIDs  = []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	zones     = []string{"", "zone-1", "zone-2"}
	portPool  = []model.ServicePort{
		{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPort: 8080},
		{Name: "web", Port: 8080, Protocol: model.ProtocolTCP, TargetPortName: "web"},
		{Name: "grpc", Port: 9090, Protocol: model.ProtocolTCP, AppProtocol: "grpc", TargetPort: 9090},
		{Name: "h2", Port: 8080, AppProtocol: "kubernetes.io/h2c", TargetPort: 8081}, // same number as web
		{Name: "dns", Port: 53, Protocol: model.ProtocolUDP, TargetPort: 53},
		{Name: "metrics", Port: 9102, TargetPort: 9102},
	}
	svcSelectors = []string{"app=a", "app in (a,b),tier!=db", "!tier", "tier=web"}
	nsSelectors  = []string{"env=prod", "team in (x)", "env!=dev", "env", ""}
)

// generator draws random steps that fit the current world.
type generator struct {
	r   *rand.Rand
	gen int64 // scope generations
}

func (g *generator) pick(n int) int { return g.r.IntN(n) }

func (g *generator) chance(percent int) bool { return g.r.IntN(100) < percent }

func pickOf[T any](g *generator, s []T) T { return s[g.pick(len(s))] }

func (g *generator) labels(pool map[string][]string) map[string]string {
	out := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(pool)) {
		if g.chance(60) {
			out[k] = pickOf(g, pool[k])
		}
	}
	return out
}

func (g *generator) endpoints(ports []model.ServicePort) []model.Endpoint {
	n := g.pick(5)
	hinted := g.chance(30)
	out := make([]model.Endpoint, 0, n)
	for range n {
		ep := model.Endpoint{Family: model.IPv4, Address: fmt.Sprintf("10.0.0.%d", 1+g.pick(6)), Zone: pickOf(g, zones), Node: fmt.Sprintf("node-%d", g.pick(3))}
		if hinted && ep.Zone != "" {
			// As the EndpointSlice controller hints: mostly for its own
			// zone, sometimes for another one too.
			ep.ForZones = []string{ep.Zone}
			if g.chance(20) {
				ep.ForZones = slices.Sorted(maps.Keys(map[string]bool{ep.Zone: true, pickOf(g, zones[1:]): true}))
			}
		}
		if g.chance(12) {
			ep.Family, ep.Address = model.IPv6, fmt.Sprintf("fd00::%x", 1+g.pick(6))
		}
		switch g.pick(4) {
		case 0, 1:
			ep.Ready, ep.Serving = true, true
		case 2:
			ep.Serving, ep.Terminating = true, true
		default:
			ep.Terminating = true
		}
		for _, p := range ports {
			if g.chance(85) {
				ep.Ports = append(ep.Ports, model.EndpointPort{Name: p.Name, Port: 8000 + int32(g.pick(3)), Protocol: p.Protocol})
			}
		}
		out = append(out, ep)
	}
	return out
}

func (g *generator) service(key model.Key) *model.Service {
	svc := &model.Service{Key: key, Labels: g.labels(map[string][]string{"app": {"a", "b"}, "tier": {"web", "db"}})}
	if g.chance(8) {
		svc.ExternalName = key.Name + ".example.com"
	}
	n := 1 + g.pick(3)
	if g.chance(5) {
		n = 0
	}
	for _, i := range g.r.Perm(len(portPool))[:n] {
		svc.Ports = append(svc.Ports, portPool[i])
	}
	if svc.ExternalName == "" {
		svc.Endpoints = g.endpoints(svc.Ports)
	}
	if g.chance(15) {
		svc.TrafficDistribution = "PreferClose"
	}
	return svc
}

func mustSelector(s string) labels.Selector {
	sel, err := labels.Parse(s)
	if err != nil {
		panic(err)
	}
	return sel
}

func (g *generator) selection(own string) model.Selection {
	names := func() map[string]struct{} {
		out := map[string]struct{}{}
		for range 1 + g.pick(2) {
			out[pickOf(g, svcNames)] = struct{}{}
		}
		return out
	}
	switch g.pick(7) {
	case 0, 1:
		return model.Selection{Namespace: own}
	case 2:
		return model.Selection{Namespace: pickOf(g, nsNames), Names: names()}
	case 3:
		return model.Selection{Namespace: pickOf(g, nsNames), Selector: mustSelector(pickOf(g, svcSelectors))}
	case 4:
		return model.Selection{NamespaceSelector: mustSelector(pickOf(g, nsSelectors))}
	case 5:
		return model.Selection{NamespaceSelector: mustSelector(pickOf(g, nsSelectors)), Selector: mustSelector(pickOf(g, svcSelectors))}
	default:
		return model.Selection{Namespace: own, Names: map[string]struct{}{}} // selects nothing
	}
}

func (g *generator) listener() model.Listener {
	if g.chance(40) {
		return model.Listener{Mode: model.ListenerProxylessGRPC}
	}
	if g.chance(5) {
		return model.Listener{Mode: model.ListenerEnvoy} // port 0: no listener at all
	}
	return model.Listener{Mode: model.ListenerEnvoy, Port: pickOf(g, []int32{8080, 10000})}
}

func (g *generator) protocol() model.Protocol {
	if g.chance(50) {
		return model.Delta
	}
	return model.SotW
}

func (g *generator) scope(key model.Key) *model.Scope {
	g.gen++
	sc := &model.Scope{Key: key, Generation: g.gen, Protocol: g.protocol(), Listener: g.listener(), ZonePriority: g.chance(30)}
	for range 1 + g.pick(2) {
		sc.Selections = append(sc.Selections, g.selection(key.Namespace))
	}
	return sc
}

// changeScope returns a new spec of an existing scope.
func (g *generator) changeScope(old *model.Scope) (*model.Scope, string) {
	g.gen++
	sc := *old
	sc.Generation = g.gen
	switch g.pick(6) {
	case 5:
		sc.ZonePriority = !sc.ZonePriority
		return &sc, "zone priority switch"
	case 0:
		if sc.Protocol == model.SotW {
			sc.Protocol = model.Delta
		} else {
			sc.Protocol = model.SotW
		}
		return &sc, "protocol switch"
	case 1:
		sc.Listener = g.listener()
		return &sc, "listener change"
	case 2:
		return &sc, "generation only"
	default:
		sc.Selections = nil
		for range 1 + g.pick(2) {
			sc.Selections = append(sc.Selections, g.selection(sc.Key.Namespace))
		}
		return &sc, "selection change"
	}
}

func sortedKeys[V any](m map[model.Key]V) []model.Key {
	return slices.SortedFunc(maps.Keys(m), model.Key.Compare)
}

// worldStep draws a change to w (which it does not modify).
func (g *generator) worldStep(w *world) step {
	for {
		switch x := g.pick(100); {
		case x < 30:
			key := model.Key{Namespace: pickOf(g, nsNames), Name: pickOf(g, svcNames)}
			return step{kind: kUpsertService, svc: g.service(key)}
		case x < 55:
			if len(w.services) == 0 {
				continue
			}
			old := w.services[pickOf(g, sortedKeys(w.services))]
			svc := *old
			if len(old.Endpoints) > 0 && g.chance(50) {
				// flip one endpoint's conditions, as a pod going (un)ready does
				svc.Endpoints = slices.Clone(old.Endpoints)
				ep := &svc.Endpoints[g.pick(len(svc.Endpoints))]
				ep.Ready = !ep.Ready
				ep.Serving = ep.Ready || g.chance(50)
				ep.Terminating = !ep.Ready && g.chance(50)
				return step{kind: kUpsertService, svc: &svc, note: "endpoint condition"}
			}
			svc.Endpoints = g.endpoints(old.Ports)
			if old.ExternalName != "" {
				svc.Endpoints = nil
			}
			return step{kind: kUpsertService, svc: &svc, note: "endpoints"}
		case x < 65:
			if len(w.services) == 0 {
				continue
			}
			return step{kind: kDeleteService, key: pickOf(g, sortedKeys(w.services))}
		case x < 75:
			return step{kind: kUpsertNamespace, ns: pickOf(g, nsNames), labels: g.labels(map[string][]string{"env": {"prod", "dev"}, "team": {"x", "y"}})}
		case x < 79:
			return step{kind: kDeleteNamespace, ns: pickOf(g, nsNames)}
		case x < 94:
			key := pickOf(g, scopeKeys)
			if old := w.scopes[key]; old != nil && g.chance(70) {
				sc, note := g.changeScope(old)
				return step{kind: kUpsertScope, scope: sc, note: note}
			}
			return step{kind: kUpsertScope, scope: g.scope(key)}
		case x < 96:
			key := pickOf(g, scopeKeys)
			if len(w.scopes) > 0 {
				key = pickOf(g, sortedKeys(w.scopes))
			}
			return step{kind: kDeleteScope, key: key}
		default:
			key := model.Key{Namespace: pickOf(g, nsNames), Name: pickOf(g, svcNames)}
			return step{kind: kUpsertService, svc: g.service(key)}
		}
	}
}

// next draws the next step for the harness's current state.
func (g *generator) next(h *harness) step {
	var running, all []*proxy
	for _, id := range slices.Sorted(maps.Keys(h.proxies)) {
		p := h.proxies[id]
		all = append(all, p)
		if p.state == connected {
			running = append(running, p)
		}
	}
	// Get going: a world with scopes and connected proxies.
	if len(h.w.scopes) == 0 && g.chance(50) {
		return step{kind: kUpsertScope, scope: g.scope(pickOf(g, scopeKeys))}
	}
	if len(running) < 4 && len(h.w.scopes) > 0 && g.chance(25) {
		return g.connect(h)
	}
	for {
		switch x := g.pick(100); {
		case x < 62:
			return g.worldStep(h.w)
		case x < 66:
			w := h.w.clone()
			s := step{kind: kBatch, burst: g.chance(50)}
			for range 2 + g.pick(3) {
				sub := g.worldStep(w)
				if s.burst && (sub.kind == kUpsertScope || sub.kind == kDeleteScope) {
					// How a stream ends would depend on the revisions it saw.
					continue
				}
				applyToWorld(w, &sub)
				s.batch = append(s.batch, sub)
			}
			return s
		case x < 76:
			return g.connect(h)
		case x < 79:
			if len(running) == 0 {
				continue
			}
			return step{kind: kDisconnect, proxy: pickOf(g, running).id}
		case x < 89:
			if len(all) == 0 {
				continue
			}
			p := pickOf(g, all)
			// Prefer a proxy a NACK left behind: a reconnect is how it recovers.
			for _, q := range all {
				if q.staleness().any() && g.chance(50) {
					p = q
					break
				}
			}
			s := step{kind: kReconnect, proxy: p.id, zone: p.zone}
			if g.chance(30) {
				s.zone, s.note = pickOf(g, zones), "moves"
			}
			return s
		case x < 94:
			if len(running) == 0 {
				continue
			}
			return step{kind: kNACK, proxy: pickOf(g, running).id}
		case x < 95:
			return step{kind: kRestart}
		default:
			return g.worldStep(h.w)
		}
	}
}

func (g *generator) connect(h *harness) step {
	id := pickOf(g, proxyIDs)
	for range 3 {
		if p := h.proxies[id]; p == nil || p.state != connected {
			break
		}
		id = pickOf(g, proxyIDs)
	}
	s := step{kind: kConnect, proxy: id, proto: g.protocol(), zone: pickOf(g, zones)}
	switch x := g.pick(100); {
	case x < 4:
		s.ref = ""
	case x < 8:
		s.ref = pickOf(g, malformedRefs)
	case x < 12:
		s.ref = "ns-c/ghost"
	default:
		key := pickOf(g, scopeKeys)
		if len(h.w.scopes) > 0 && g.chance(80) {
			key = pickOf(g, sortedKeys(h.w.scopes))
		}
		s.ref = key.String()
		if sc := h.w.scopes[key]; sc != nil && g.chance(85) {
			s.proto = sc.Protocol
		}
	}
	return s
}
