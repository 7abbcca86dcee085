package leader

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The fleet's two scopes, one per protocol, each selecting every Service
// of the fleet's namespace labelled app=fleet.
const (
	sotwScope  = "sotw"
	deltaScope = "delta"
)

var scopeNames = []string{sotwScope, deltaScope}

// allTypes are the served types in ADS order, as adsclient names them.
var allTypes = xdstype.URLs()

// fleet is replicas of one control plane, in one test process, serving the
// scopes of one namespace to proxies spread over them. A proxy whose stream
// ends picks another live, ready replica, as a proxy behind a Service is
// routed to one of its ready pods.
type fleet struct {
	t     *testing.T
	env   *localapi.Env
	ns    string
	lease string

	mu   sync.Mutex
	live map[string]*replica // by short name ("a")
	// gate, when not nil, keeps proxies whose stream ended from
	// reconnecting until it is closed.
	gate    chan struct{}
	proxies []*proxy
}

// newFleet makes namespace ns with the Services named services (each with
// endpoints at two addresses) and the two scopes, then starts one replica
// per name, all campaigning for a Lease of ns's own.
func newFleet(t *testing.T, env *localapi.Env, ns string, services, replicas []string) *fleet {
	t.Helper()
	f := &fleet{t: t, env: env, ns: ns, lease: "scopeplane-" + ns, live: map[string]*replica{}}
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for i, name := range services {
		if err := f.upsertService(name, []string{fmt.Sprintf("10.1.%d.1", i), fmt.Sprintf("10.1.%d.2", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range scopeNames {
		ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolSotW,
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "fleet"}}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		}}
		if name == deltaScope {
			ps.Spec.Protocol = xdsv1alpha1.ProtocolDelta
		}
		if err := env.Client.Create(ctx, ps); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range replicas {
		f.start(name)
	}
	return f
}

// start starts replica name, unless it is running.
func (f *fleet) start(name string) {
	f.t.Helper()
	f.mu.Lock()
	_, running := f.live[name]
	f.mu.Unlock()
	if running {
		return
	}
	r := startReplica(f.t, f.env, f.ns+"-"+name, f.lease)
	f.mu.Lock()
	f.live[name] = r
	f.mu.Unlock()
}

// end ends replica name, by a crash or a shutdown; false when it was not
// running.
func (f *fleet) end(name string, crash bool) bool {
	f.mu.Lock()
	r := f.live[name]
	delete(f.live, name) // no proxy picks it from now on
	f.mu.Unlock()
	if r == nil {
		return false
	}
	if crash {
		r.kill()
	} else {
		r.stop()
	}
	return true
}

// replica returns the running replica name, or nil.
func (f *fleet) replica(name string) *replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[name]
}

// running returns the running replicas' short names, sorted.
func (f *fleet) running() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.live))
}

// leader returns the short name of the replica that leads, "" when none or
// more than one does.
func (f *fleet) leader() string {
	var out []string
	for _, name := range f.running() {
		if r := f.replica(name); r != nil && r.leads() {
			out = append(out, name)
		}
	}
	if len(out) != 1 {
		return ""
	}
	return out[0]
}

// close stops the proxies and the replicas and deletes the scopes, so that
// the next fleet on the same API server does not build them.
func (f *fleet) close() {
	for _, p := range f.proxies {
		p.stop()
	}
	for _, name := range f.running() {
		f.end(name, false)
	}
	for _, name := range scopeNames {
		_ = f.env.Client.Delete(context.Background(), &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}})
	}
}

// holdReconnects keeps proxies whose stream ends from reconnecting until
// releaseReconnects.
func (f *fleet) holdReconnects() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate == nil {
		f.gate = make(chan struct{})
	}
}

// releaseReconnects lets the held proxies reconnect.
func (f *fleet) releaseReconnects() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate != nil {
		close(f.gate)
		f.gate = nil
	}
}

// waitGate returns once reconnects are allowed; false when ctx ended.
func (f *fleet) waitGate(ctx context.Context) bool {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate == nil {
		return ctx.Err() == nil
	}
	select {
	case <-gate:
		return true
	case <-ctx.Done():
		return false
	}
}

// pick returns the replica p connects to next: its first replica once it
// is ready (while it runs), then one of the ready ones at random; nil when
// ctx ended.
func (f *fleet) pick(ctx context.Context, p *proxy) *replica {
	for {
		f.mu.Lock()
		var ready []*replica
		for _, name := range slices.Sorted(maps.Keys(f.live)) {
			if r := f.live[name]; r.ready() {
				ready = append(ready, r)
			}
		}
		_, firstRuns := f.live[p.first]
		f.mu.Unlock()
		if !firstRuns {
			p.first = ""
		}
		for _, r := range ready {
			if p.first != "" && r.name == f.ns+"-"+p.first {
				p.first = ""
				return r
			}
		}
		if len(ready) > 0 && p.first == "" {
			return ready[p.rng.IntN(len(ready))]
		}
		// No replica to pick is ready: try again shortly, as a proxy's
		// backoff does.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// addProxies starts n proxies of scope, the i-th connecting first to
// replica first[i % len(first)]; seed drives their later choices.
func (f *fleet) addProxies(scope string, n int, first []string, seed uint64) []*proxy {
	var out []*proxy
	for i := range n {
		protocol := adsclient.SotW
		if scope == deltaScope {
			protocol = adsclient.Delta
		}
		id := fmt.Sprintf("%s-%s-%d", f.ns, scope, i)
		p := &proxy{id: id, scope: scope, delta: protocol == adsclient.Delta, first: first[i%len(first)],
			rng: rand.New(rand.NewPCG(seed, uint64(len(f.proxies)))), done: make(chan struct{})}
		cfg := testkit.WildcardClient(protocol, testkit.Node(id, f.ns+"/"+scope))
		if !p.delta {
			// As Envoy: every cluster and listener, and the endpoints and
			// routes they refer to (see followReferences).
			cfg.Wildcard = map[string]bool{xdstype.Cluster.URL(): true, xdstype.Listener.URL(): true}
			subs := map[string]map[string]struct{}{xdstype.Endpoint.URL(): {}, xdstype.Route.URL(): {}}
			cfg.OnEvent = func(ev adsclient.Event) {
				if ev.Accepted && (ev.TypeURL == xdstype.Cluster.URL() || ev.TypeURL == xdstype.Listener.URL()) {
					followReferences(p.c, subs)
				}
			}
		}
		cfg.Reject = func(typeURL string, _ []*anypb.Any, _ []string) string {
			if typeURL == xdstype.Endpoint.URL() && p.rejectEndpoints.Load() {
				return "endpoints rejected by proxy " + id
			}
			return ""
		}
		p.c = adsclient.New(cfg)
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		go p.run(ctx, f)
		f.proxies = append(f.proxies, p)
		out = append(out, p)
	}
	return out
}

// followReferences makes a SotW client's endpoint and route subscriptions
// (subs) follow what its clusters and listeners refer to, as Envoy's do: a
// SotW response of those types carries only the names asked for, so a
// resource is dropped by no longer asking for it. A failed Send ends the
// stream, and the proxy reconnects.
func followReferences(c *adsclient.Client, subs map[string]map[string]struct{}) {
	for t, have := range subs {
		want, err := testkit.Referenced(c, t)
		if err != nil {
			continue // an undecodable resource was NACKed by Validate
		}
		var add, drop []string
		for n := range want {
			if _, ok := have[n]; !ok {
				add = append(add, n)
				have[n] = struct{}{}
			}
		}
		for n := range have {
			if _, ok := want[n]; !ok {
				drop = append(drop, n)
				delete(have, n)
			}
		}
		if len(drop) > 0 {
			_ = c.Unsubscribe(t, drop...)
		}
		if len(add) > 0 {
			_ = c.Subscribe(t, add...)
		}
	}
}

// proxy is one simulated proxy of the fleet, reconnecting as a proxy does.
type proxy struct {
	id, scope string
	delta     bool
	c         *adsclient.Client
	// first and rng are used by the proxy's own goroutine only.
	first string
	rng   *rand.Rand
	// rejectEndpoints makes the proxy NACK every endpoints response.
	rejectEndpoints atomic.Bool

	mu      sync.Mutex
	on      *replica // the replica of the open stream; nil between streams
	streams []*stream

	cancel context.CancelFunc
	done   chan struct{}
}

// stream is one of a proxy's streams.
type stream struct {
	replica string
	// from is the index, in the proxy's events, of its first response.
	from int
	// held is what the proxy held when the stream began.
	held truth
	open bool
	err  error // how it ended
}

// run is the proxy: a stream to a replica f picks, again and again
// until ctx ends, keeping what it holds across streams.
func (p *proxy) run(ctx context.Context, f *fleet) {
	defer close(p.done)
	for {
		r := f.pick(ctx, p)
		if r == nil {
			return
		}
		s := &stream{replica: r.name, from: len(p.c.Events()), held: holding(p.c), open: true}
		p.mu.Lock()
		p.on = r
		p.streams = append(p.streams, s)
		p.mu.Unlock()
		err := p.c.Run(ctx, r.conn)
		p.mu.Lock()
		p.on, s.open, s.err = nil, false, err
		p.mu.Unlock()
		if !f.waitGate(ctx) {
			return
		}
		// A proxy's reconnect backoff, so that a refused stream does not spin.
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the proxy and waits for its goroutine.
func (p *proxy) stop() {
	p.cancel()
	<-p.done
}

// connectedTo returns the replica of p's open stream, or nil.
func (p *proxy) connectedTo() *replica {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on == nil || !p.c.Running() {
		return nil
	}
	return p.on
}

// streamCount is how many streams p has begun.
func (p *proxy) streamCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.streams)
}

// describe says where p's streams went and how they ended.
func (p *proxy) describe() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for i, s := range p.streams[max(0, len(p.streams)-4):] {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "stream to %s from event %d", s.replica, s.from)
		if !s.open {
			fmt.Fprintf(&b, " ended: %v", s.err)
		}
	}
	return b.String()
}

// truth is what a scope's proxies must hold: type URL → name → the
// resource marshalled deterministically, as the snapshot builder does.
type truth map[string]map[string][]byte

// holding returns what c holds, in the form of a truth.
func holding(c *adsclient.Client) truth {
	out := truth{}
	for _, t := range allTypes {
		out[t] = map[string][]byte{}
		for name, h := range c.State(t) {
			out[t][name] = h.Resource.GetValue()
		}
	}
	return out
}

// truths translates every scope of the namespace from the API objects as
// the API server has them now, independently of any replica: with the
// conversion the reconcilers use, and xds/translate.
func (f *fleet) truths() (map[string]truth, error) {
	ctx := context.Background()
	in := client.InNamespace(f.ns)
	var (
		scopes   xdsv1alpha1.ProxyScopeList
		services corev1.ServiceList
		eps      discoveryv1.EndpointSliceList
		ns       corev1.Namespace
	)
	for _, list := range []client.ObjectList{&scopes, &services, &eps} {
		if err := f.env.Client.List(ctx, list, in); err != nil {
			return nil, err
		}
	}
	if err := f.env.Client.Get(ctx, client.ObjectKey{Name: f.ns}, &ns); err != nil {
		return nil, err
	}
	var models []*model.Service
	for i := range services.Items {
		svc := &services.Items[i]
		var own []*discoveryv1.EndpointSlice
		for j := range eps.Items {
			if eps.Items[j].Labels[discoveryv1.LabelServiceName] == svc.Name {
				own = append(own, &eps.Items[j])
			}
		}
		models = append(models, convert.Service(svc, own))
	}
	out := map[string]truth{}
	mo := proto.MarshalOptions{Deterministic: true}
	for i := range scopes.Items {
		sc, err := convert.Scope(&scopes.Items[i])
		if err != nil {
			return nil, err
		}
		var selected []*model.Service
		for _, svc := range models {
			if sc.Selects(svc, ns.Labels, true) {
				selected = append(selected, svc)
			}
		}
		tr := truth{}
		for _, t := range allTypes {
			tr[t] = map[string][]byte{}
		}
		var merr error
		res := translate.Translate(sc, selected)
		res.Each(func(t xdstype.Type, m proto.Message) {
			b, err := mo.Marshal(m)
			if err != nil {
				merr = err
			}
			tr[t.URL()][t.Info().NameOf(m)] = b
		})
		if merr != nil {
			return nil, merr
		}
		out[sc.Key.Name] = tr
	}
	return out, nil
}

// owed is what of a scope's truth the proxy must hold: all of it for a
// delta proxy, all but the virtual hosts for a SotW one, which gets them
// inline in the route configurations (SotW has no VHDS) and never asks for
// them.
func (p *proxy) owed(tr truth) truth {
	if p.delta {
		return tr
	}
	out := maps.Clone(tr)
	out[xdstype.VirtualHost.URL()] = map[string][]byte{}
	return out
}

// diff describes how have differs from want ("" when equal), and counts
// the resources have holds that want does not: stale ones.
func diff(have, want truth) (string, int) {
	var b strings.Builder
	stale := 0
	for _, t := range allTypes {
		short := t[strings.LastIndex(t, ".")+1:]
		for _, name := range slices.Sorted(maps.Keys(want[t])) {
			h, ok := have[t][name]
			switch {
			case !ok:
				fmt.Fprintf(&b, " %s %q missing;", short, name)
			case string(h) != string(want[t][name]):
				fmt.Fprintf(&b, " %s %q differs;", short, name)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(have[t])) {
			if _, ok := want[t][name]; !ok {
				fmt.Fprintf(&b, " %s %q no longer exists;", short, name)
				stale++
			}
		}
	}
	return b.String(), stale
}

// served is what replica r serves for scope, as a truth; nil when it has
// not built the scope.
func served(r *replica, ns, scope string) truth {
	sn := r.cp.Store.Get(model.Key{Namespace: ns, Name: scope})
	if sn == nil {
		return nil
	}
	out := truth{}
	sn.Read(func(v snapshot.View) {
		for _, t := range xdstype.All() {
			out[t.URL()] = map[string][]byte{}
			v.All(t, func(res *snapshot.Resource) { out[t.URL()][res.Name] = res.Value() })
		}
	})
	return out
}

// serving reports whether every running replica is ready and serves
// every scope's truth, and says which does not.
func (f *fleet) serving(trs map[string]truth) (bool, string) {
	names := f.running()
	if len(names) == 0 {
		return false, "no replica runs"
	}
	for _, name := range names {
		r := f.replica(name)
		if r == nil {
			return false, "replica " + name + " ended"
		}
		if !r.ready() {
			return false, fmt.Sprintf("replica %s not ready: %v", name, r.cp.Ready(nil))
		}
		for _, scope := range scopeNames {
			tr := trs[scope]
			if tr == nil {
				return false, "scope " + scope + " missing from the API"
			}
			sv := served(r, f.ns, scope)
			if sv == nil {
				return false, fmt.Sprintf("replica %s has not built scope %s", name, scope)
			}
			if d, _ := diff(sv, tr); d != "" {
				return false, fmt.Sprintf("replica %s serves scope %s unlike the API objects:%s", name, scope, d)
			}
		}
	}
	return true, ""
}

// servedVersion is the version of scope on replica r ("" when not built).
func servedVersion(r *replica, ns, scope string) string {
	sn := r.cp.Store.Get(model.Key{Namespace: ns, Name: scope})
	if sn == nil {
		return ""
	}
	var v string
	sn.Read(func(view snapshot.View) { v = view.Version() })
	return v
}

// settleStats counts what quiescence checks compared.
type settleStats struct {
	points    int // quiescent points reached
	proxies   int // proxy states compared with the truth
	resources int // resources compared
	stale     int // resources held that no longer exist, at quiescent points
}

// settled reports whether the fleet is quiescent and right: every running
// replica is ready and serves every scope's truth, and every proxy is
// connected to a running replica and holds exactly its scope's truth. When
// it is not, it says what is not, and how many stale resources the proxies
// hold.
func (f *fleet) settled() (ok bool, state string, stale int) {
	trs, err := f.truths()
	if err != nil {
		return false, err.Error(), 0
	}
	if ok, state := f.serving(trs); !ok {
		return false, state, 0
	}
	live := map[*replica]bool{}
	for _, name := range f.running() {
		live[f.replica(name)] = true
	}
	var problems []string
	for _, p := range f.proxies {
		on := p.connectedTo()
		if on == nil || !live[on] {
			problems = append(problems, fmt.Sprintf("proxy %s not connected (%s)", p.id, p.describe()))
			continue
		}
		d, s := diff(holding(p.c), p.owed(trs[p.scope]))
		stale += s
		if d != "" {
			problems = append(problems, fmt.Sprintf("proxy %s on %s:%s", p.id, on.name, d))
		}
	}
	if len(problems) > 0 {
		return false, strings.Join(problems, "\n"), stale
	}
	return true, "", 0
}

// settle waits up to testkit.Timeout for the fleet to be settled, and adds
// what was compared to st.
func (f *fleet) settle(st *settleStats) error {
	var stale int
	ok, state := testkit.Poll(testkit.Timeout, func() (bool, string) {
		var ok bool
		var state string
		ok, state, stale = f.settled()
		return ok, state
	})
	if !ok {
		st.stale += stale
		return fmt.Errorf("not settled within %v (%d stale resources held):\n%s", testkit.Timeout, stale, state)
	}
	trs, err := f.truths()
	if err != nil {
		return err
	}
	st.points++
	for _, p := range f.proxies {
		st.proxies++
		for _, t := range allTypes {
			st.resources += len(trs[p.scope][t])
		}
	}
	return nil
}

// mustSettle is settle, failing the test when the fleet does not settle.
func (f *fleet) mustSettle(st *settleStats) {
	f.t.Helper()
	if err := f.settle(st); err != nil {
		f.t.Fatal(err)
	}
}

// onlyDifferences checks the streams delta proxies began since marks (a
// proxy's stream count): each may have been sent only what differs between
// what the proxy held when it began and want (the truth it converged to),
// and told of the removal only of what it held and want lacks. A delta
// proxy reconnecting with initial_resource_versions to a replica that serves
// what it holds is sent nothing at all.
func (f *fleet) onlyDifferences(marks map[*proxy]int, want map[string]truth) (moved int, err error) {
	for _, p := range f.proxies {
		if !p.delta {
			continue
		}
		p.mu.Lock()
		streams := slices.Clone(p.streams[marks[p]:])
		p.mu.Unlock()
		evs := p.c.Events()
		for i, s := range streams {
			moved++
			end := len(evs)
			if i+1 < len(streams) {
				end = streams[i+1].from
			}
			tr := want[p.scope]
			for _, ev := range evs[s.from:end] {
				for _, name := range ev.Names {
					if old, ok := s.held[ev.TypeURL][name]; ok && string(old) == string(tr[ev.TypeURL][name]) {
						return moved, fmt.Errorf("proxy %s, stream to %s: sent %s %q, which it held as it is (declared in initial_resource_versions)", p.id, s.replica, ev.TypeURL, name)
					}
				}
				for _, name := range ev.Removed {
					if _, held := s.held[ev.TypeURL][name]; !held {
						return moved, fmt.Errorf("proxy %s, stream to %s: told %s %q was removed, which it did not hold", p.id, s.replica, ev.TypeURL, name)
					}
					if _, exists := tr[ev.TypeURL][name]; exists {
						return moved, fmt.Errorf("proxy %s, stream to %s: told %s %q was removed, which exists", p.id, s.replica, ev.TypeURL, name)
					}
				}
			}
		}
	}
	return moved, nil
}

// streamMarks returns every proxy's stream count.
func (f *fleet) streamMarks() map[*proxy]int {
	out := map[*proxy]int{}
	for _, p := range f.proxies {
		out[p] = p.streamCount()
	}
	return out
}

// upsertService creates or updates Service name (label app=fleet, port
// http 80 → 8080) and its EndpointSlice with a ready endpoint per address.
func (f *fleet) upsertService(name string, addrs []string) error {
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{"app": "fleet"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
	if err := f.env.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: f.ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	existing := &discoveryv1.EndpointSlice{}
	switch err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(slice), existing); {
	case apierrors.IsNotFound(err):
		return f.env.Client.Create(ctx, slice)
	case err != nil:
		return err
	}
	existing.Endpoints = slice.Endpoints
	return f.env.Client.Update(ctx, existing)
}

// deleteService deletes Service name and its EndpointSlice, if they exist.
func (f *fleet) deleteService(name string) error {
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name + "-1"}},
	} {
		if err := f.env.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// scopeStatus reads scope's status.
func (f *fleet) scopeStatus(scope string) (*xdsv1alpha1.ProxyScopeStatus, error) {
	ps := &xdsv1alpha1.ProxyScope{}
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: scope}, ps); err != nil {
		return nil, err
	}
	return &ps.Status, nil
}

// connected counts scope's proxies with an open stream to a running
// replica, across all replicas.
func (f *fleet) connected(scope string) int32 {
	running := map[*replica]bool{}
	for _, name := range f.running() {
		running[f.replica(name)] = true
	}
	var n int32
	for _, p := range f.proxies {
		if r := p.connectedTo(); p.scope == scope && r != nil && running[r] {
			n++
		}
	}
	return n
}

// onReplica returns the proxies with an open stream to replica name.
func (f *fleet) onReplica(name string) []*proxy {
	r := f.replica(name)
	var out []*proxy
	for _, p := range f.proxies {
		if r != nil && p.connectedTo() == r {
			out = append(out, p)
		}
	}
	return out
}

// startEnv starts an API server for one test.
func startEnv(t *testing.T) *localapi.Env {
	t.Helper()
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env
}
