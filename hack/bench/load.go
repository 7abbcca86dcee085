package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// proxiesPerConn is how many proxies share one gRPC connection: each proxy
// has its own ADS stream, and a thousand proxies need ten sockets, not a
// thousand.
const proxiesPerConn = 100

// tracker is shared by every proxy of a load.
type tracker struct {
	done      atomic.Int64 // armed proxies that converged in this phase
	lastEvent atomic.Int64 // unix nanos of the last processed response
}

type resKey struct {
	t    xdstype.Type
	name string
}

type want struct {
	present bool
	digest  uint64
}

type seenRes struct {
	name   string
	digest uint64
}

// heldAt is one version of a resource a proxy ACKed, and when.
type heldAt struct {
	digest uint64
	at     time.Time
}

// proxy is one simulated Envoy: an adsclient.Client on its own ADS stream,
// subscribing as Envoy does (SotW: wildcard CDS and LDS, EDS and RDS by the
// names the clusters and listeners reference; Delta: wildcard for all five,
// VHDS included),
// plus the bookkeeping that timestamps its convergence.
type proxy struct {
	idx int
	// view is the index of the view (World.Views) the proxy must hold.
	view  int
	proto adsclient.Protocol
	c     *adsclient.Client
	tr    *tracker

	mu sync.Mutex
	// edsNext and rdsNext are the names the response being judged references.
	edsNext, rdsNext []string
	// eds and rds are the current by-name subscriptions (SotW).
	eds, rds map[string]struct{}
	// stash holds the pending resources the response being judged carries.
	stash []seenRes
	// pending is what must still arrive (or go) for the phase to be done.
	pending map[resKey]want
	absent  [xdstype.Count]int
	// history holds, during a churn, every version of each resource the
	// churn changes that the proxy ACKed, in order (nil otherwise).
	history map[resKey][]heldAt
	// need holds the types that must still get a response on the current
	// stream (after a restart).
	need uint8
	// reopen is set while the proxy must open a new stream to be done
	// (after a restart); opensAtArm is how many it had opened by then.
	reopen     bool
	opensAtArm int
	counted    bool
	done       bool
	doneAt     time.Time
	nacks      int
	opens      int
}

func newProxy(idx, view int, key model.Key, loc model.Location, p adsclient.Protocol, tr *tracker) *proxy {
	px := &proxy{idx: idx, view: view, proto: p, tr: tr, eds: map[string]struct{}{}, rds: map[string]struct{}{}}
	protocol := model.SotW
	if p == adsclient.Delta {
		protocol = model.Delta
	}
	_, types := typesOf(protocol)
	cfg := adsclient.Config{
		Protocol: p,
		Node: &corev3.Node{
			Id:      fmt.Sprintf("proxy-%d", idx),
			Cluster: "bench",
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				model.ScopeMetadataKey: structpb.NewStringValue(key.String()),
			}},
		},
		Types:   types,
		Reject:  px.judge,
		OnEvent: px.onEvent,
	}
	if loc.Zone != "" {
		cfg.Node.Locality = &corev3.Locality{Zone: loc.Zone}
	}
	if p == adsclient.SotW {
		cfg.Wildcard = map[string]bool{xdstype.Cluster.URL(): true, xdstype.Listener.URL(): true}
	} else {
		// VHDS: Envoy subscribes to a route configuration's virtual hosts
		// with a wildcard.
		cfg.Wildcard = map[string]bool{xdstype.Cluster.URL(): true, xdstype.Endpoint.URL(): true, xdstype.Listener.URL(): true,
			xdstype.Route.URL(): true, xdstype.VirtualHost.URL(): true}
	}
	px.c = adsclient.New(cfg)
	return px
}

// judge sees every response before it is applied (it never rejects): it
// notes the digests of the resources the phase waits for and, in SotW, the
// names the clusters and listeners reference.
func (p *proxy) judge(typeURL string, resources []*anypb.Any, _ []string) string {
	t, ok := xdstype.ByURL(typeURL)
	if !ok {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stash = p.stash[:0]
	if len(p.pending) > 0 || p.history != nil {
		for _, a := range resources {
			name := stringField(a.GetValue(), 1)
			k := resKey{t, name}
			_, pending := p.pending[k]
			if _, watched := p.history[k]; pending || watched {
				p.stash = append(p.stash, seenRes{name, digest(a.GetValue())})
			}
		}
	}
	if p.proto == adsclient.SotW {
		switch t {
		case xdstype.Cluster:
			p.edsNext = p.edsNext[:0]
			for _, a := range resources {
				if n := edsServiceName(a.GetValue()); n != "" {
					p.edsNext = append(p.edsNext, n)
				}
			}
		case xdstype.Listener:
			p.rdsNext = p.rdsNext[:0]
			for _, a := range resources {
				p.rdsNext = append(p.rdsNext, routeNames(a)...)
			}
		}
	}
	return ""
}

// onEvent runs after each response was applied and answered.
func (p *proxy) onEvent(ev adsclient.Event) {
	now := time.Now()
	p.tr.lastEvent.Store(now.UnixNano())
	t, ok := xdstype.ByURL(ev.TypeURL)
	if !ok {
		return
	}
	p.mu.Lock()
	if !ev.Accepted {
		p.nacks++
		p.mu.Unlock()
		return
	}
	for _, s := range p.stash {
		k := resKey{t, s.name}
		if h, ok := p.history[k]; ok && (len(h) == 0 || h[len(h)-1].digest != s.digest) {
			p.history[k] = append(h, heldAt{s.digest, now})
		}
		if w, ok := p.pending[k]; ok && w.present && w.digest == s.digest {
			delete(p.pending, k)
		}
	}
	if len(p.pending) > 0 {
		for _, n := range ev.Removed {
			p.satisfyAbsent(resKey{t, n})
		}
		if p.proto == adsclient.SotW && t.FullState() && p.absent[t] > 0 {
			in := make(map[string]struct{}, len(ev.Names))
			for _, n := range ev.Names {
				in[n] = struct{}{}
			}
			for k := range p.pending {
				if _, ok := in[k.name]; k.t == t && !ok {
					p.satisfyAbsent(k)
				}
			}
		}
	}
	p.stash = p.stash[:0]
	p.need &^= 1 << t
	var subE, unsubE, subR, unsubR []string
	if p.proto == adsclient.SotW {
		switch t {
		case xdstype.Cluster:
			subE, unsubE = p.resubscribe(p.eds, p.edsNext, xdstype.Endpoint)
		case xdstype.Listener:
			subR, unsubR = p.resubscribe(p.rds, p.rdsNext, xdstype.Route)
		}
	}
	p.checkDoneLocked(now)
	p.mu.Unlock()
	// Subscribing first and unsubscribing second costs both servers at most
	// one response: the first request names a resource that is gone.
	if len(subE) > 0 {
		_ = p.c.Subscribe(xdstype.Endpoint.URL(), subE...)
	}
	if len(unsubE) > 0 {
		_ = p.c.Unsubscribe(xdstype.Endpoint.URL(), unsubE...)
	}
	if len(subR) > 0 {
		_ = p.c.Subscribe(xdstype.Route.URL(), subR...)
	}
	if len(unsubR) > 0 {
		_ = p.c.Unsubscribe(xdstype.Route.URL(), unsubR...)
	}
}

func (p *proxy) satisfyAbsent(k resKey) {
	if w, ok := p.pending[k]; ok && !w.present {
		delete(p.pending, k)
		p.absent[k.t]--
	}
}

// resubscribe makes cur equal to next and returns the names added and
// removed; a removed name no longer held satisfies its pending removal.
func (p *proxy) resubscribe(cur map[string]struct{}, next []string, t xdstype.Type) (added, removed []string) {
	nextSet := make(map[string]struct{}, len(next))
	for _, n := range next {
		nextSet[n] = struct{}{}
		if _, ok := cur[n]; !ok {
			added = append(added, n)
			cur[n] = struct{}{}
		}
	}
	for n := range cur {
		if _, ok := nextSet[n]; !ok {
			removed = append(removed, n)
			delete(cur, n)
			p.satisfyAbsent(resKey{t, n})
		}
	}
	return added, removed
}

func (p *proxy) checkDoneLocked(now time.Time) {
	if p.done || len(p.pending) > 0 || p.need != 0 || (p.reopen && p.opens == p.opensAtArm) {
		return
	}
	p.done, p.doneAt = true, now
	if p.counted {
		p.tr.done.Add(1)
	}
}

// arm starts a phase: pending must arrive (or go), need lists the types that
// must get a response on a new stream; counted proxies are waited for.
func (p *proxy) arm(pending map[resKey]want, need uint8, counted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armLocked(pending, need, counted)
}

func (p *proxy) armLocked(pending map[resKey]want, need uint8, counted bool) {
	p.pending, p.need, p.counted, p.reopen = pending, need, counted, false
	p.absent = [xdstype.Count]int{}
	for k, w := range pending {
		if !w.present {
			p.absent[k.t]++
		}
	}
	p.done, p.doneAt = false, time.Time{}
	p.checkDoneLocked(time.Now())
}

// watch starts a churn: from now on the proxy records each version of keys
// it ACKs; the phase waits for nothing yet.
func (p *proxy) watch(keys []resKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armLocked(nil, 0, false)
	p.history = make(map[resKey][]heldAt, len(keys))
	for _, k := range keys {
		p.history[k] = nil
	}
}

// armLast ends a churn's changes: the proxy is done once it ACKed final,
// the last version of each resource the churn changed, unless the last
// version it ACKed already is.
func (p *proxy) armLast(final map[resKey]want) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pending := make(map[resKey]want, len(final))
	for k, w := range final {
		if l := p.history[k]; len(l) == 0 || l[len(l)-1].digest != w.digest {
			pending[k] = w
		}
	}
	p.armLocked(pending, 0, true)
}

// takeHistory returns what the proxy recorded since watch, and stops
// recording.
func (p *proxy) takeHistory() map[resKey][]heldAt {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.history
	p.history = nil
	return h
}

// armReopen starts a restart: the proxy is done once it opened a new
// stream and got a response of each type in need on it.
func (p *proxy) armReopen(need uint8) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending, p.need, p.counted, p.reopen, p.opensAtArm = nil, need, true, true, p.opens
	p.absent = [xdstype.Count]int{}
	p.done, p.doneAt = false, time.Time{}
}

func (p *proxy) result() (done bool, at time.Time, left int, counted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.doneAt, len(p.pending), p.counted
}

func (p *proxy) opened() {
	p.mu.Lock()
	p.opens++
	p.checkDoneLocked(time.Now())
	p.mu.Unlock()
}

// opens is how many streams the load's proxies have opened.
func (l *load) opens() int {
	n := 0
	for _, p := range l.proxies {
		p.mu.Lock()
		n += p.opens
		p.mu.Unlock()
	}
	return n
}

// verify checks that the proxy holds exactly the truth of its scope, byte
// for byte, and rejected nothing.
func (p *proxy) verify(tr *Truth) error {
	for t := range xdstype.Count {
		held := p.c.State(t.URL())
		for name, w := range tr[t] {
			h, ok := held[name]
			switch {
			case !ok || h.Resource == nil:
				return fmt.Errorf("proxy-%d: %s %q missing", p.idx, t.String(), name)
			case !bytes.Equal(h.Resource.GetValue(), w.Body) && !sameMessage(t, h.Resource.GetValue(), w.Body):
				return fmt.Errorf("proxy-%d: %s %q differs from the truth", p.idx, t.String(), name)
			}
		}
		if len(held) != len(tr[t]) {
			for name := range held {
				if _, ok := tr[t][name]; !ok {
					return fmt.Errorf("proxy-%d: holds %s %q, which is gone (%d held, %d in the truth)", p.idx, t.String(), name, len(held), len(tr[t]))
				}
			}
		}
	}
	p.mu.Lock()
	nacks := p.nacks
	p.mu.Unlock()
	if st := p.c.Stats(); st.NACKs > 0 || nacks > 0 {
		return fmt.Errorf("proxy-%d: NACKed %d responses", p.idx, st.NACKs)
	}
	return nil
}

// sameMessage compares two encodings by content, for a server whose
// encoding differs from the truth's but means the same.
func sameMessage(t xdstype.Type, a, b []byte) bool {
	ma, err := (&anypb.Any{TypeUrl: t.URL(), Value: a}).UnmarshalNew()
	if err != nil {
		return false
	}
	mb, err := (&anypb.Any{TypeUrl: t.URL(), Value: b}).UnmarshalNew()
	if err != nil {
		return false
	}
	return proto.Equal(ma, mb)
}

// stringField reads string field num of an encoded message without decoding
// the rest: every resource type's name is field 1.
func stringField(b []byte, num protowire.Number) string {
	out := ""
	scanFields(b, func(n protowire.Number, typ protowire.Type, v []byte, _ uint64) {
		if n == num && typ == protowire.BytesType {
			out = string(v)
		}
	})
	return out
}

// edsServiceName returns the EDS service name an encoded Cluster subscribes
// to (its eds_cluster_config.service_name, else its name), or "" when the
// cluster is not an EDS cluster — what Envoy asks EDS for after CDS.
func edsServiceName(b []byte) string {
	var name, service string
	eds := false
	scanFields(b, func(n protowire.Number, typ protowire.Type, v []byte, x uint64) {
		switch {
		case n == 1 && typ == protowire.BytesType:
			name = string(v)
		case n == 2 && typ == protowire.VarintType:
			eds = x == 3 // Cluster_EDS
		case n == 3 && typ == protowire.BytesType:
			service = stringField(v, 2)
		}
	})
	switch {
	case !eds:
		return ""
	case service != "":
		return service
	default:
		return name
	}
}

// routeNames returns the route configurations a Listener's connection
// managers fetch over RDS.
func routeNames(a *anypb.Any) []string {
	var l listenerv3.Listener
	if err := proto.Unmarshal(a.GetValue(), &l); err != nil {
		return nil
	}
	var out []string
	add := func(tc *anypb.Any) {
		var hcm hcmv3.HttpConnectionManager
		if tc == nil || !tc.MessageIs(&hcm) || tc.UnmarshalTo(&hcm) != nil {
			return
		}
		if n := hcm.GetRds().GetRouteConfigName(); n != "" {
			out = append(out, n)
		}
	}
	add(l.GetApiListener().GetApiListener())
	chains := append(l.GetFilterChains(), l.GetDefaultFilterChain())
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			add(f.GetTypedConfig())
		}
	}
	return out
}

func scanFields(b []byte, fn func(n protowire.Number, typ protowire.Type, v []byte, x uint64)) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return
		}
		b = b[l:]
		switch typ {
		case protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return
			}
			fn(n, typ, v, 0)
			b = b[l:]
		case protowire.VarintType:
			x, l := protowire.ConsumeVarint(b)
			if l < 0 {
				return
			}
			fn(n, typ, nil, x)
			b = b[l:]
		default:
			l := protowire.ConsumeFieldValue(n, typ, b)
			if l < 0 {
				return
			}
			b = b[l:]
		}
	}
}

// proxyConn is a proxy's view of a shared connection: streams wait for the
// connection to be ready (so a proxy reconnects as soon as the control plane
// is back) and every stream opened is counted.
type proxyConn struct {
	cc *grpc.ClientConn
	p  *proxy
}

func (c *proxyConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.cc.Invoke(ctx, method, args, reply, opts...)
}

func (c *proxyConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.cc.NewStream(ctx, desc, method, append(opts, grpc.WaitForReady(true))...)
	if err == nil {
		c.p.opened()
	}
	return s, err
}

// load is N proxies against one control plane address.
type load struct {
	proxies []*proxy
	conns   []*grpc.ClientConn
	tr      *tracker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// streams is the context the proxies' current streams run under, under
	// root (start's), and endStreams ends them (reconnect).
	mu         sync.Mutex
	root       context.Context
	streams    context.Context
	endStreams context.CancelFunc
}

func newLoad(addr string, n int, p model.Protocol, w *World) (*load, error) {
	l := &load{tr: &tracker{}}
	ap := adsclient.SotW
	if p == model.Delta {
		ap = adsclient.Delta
	}
	for i := 0; i < n; i += proxiesPerConn {
		cc, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)),
			// Reconnect quickly after a restart; Envoy's own backoff
			// (500 ms base) would add its delay to what is measured.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
				MinConnectTimeout: 5 * time.Second,
			}),
		)
		if err != nil {
			l.close()
			return nil, err
		}
		l.conns = append(l.conns, cc)
	}
	views := w.Views()
	for i := range n {
		v := i % len(views)
		l.proxies = append(l.proxies, newProxy(i, v, w.Scopes[views[v].Scope].Key, views[v].Loc, ap, l.tr))
	}
	return l, nil
}

// start runs every proxy, reconnecting whenever its stream ends, until stop.
// A stream the control plane refused for pacing (ResourceExhausted), or
// because it is not ready yet (a replica starting), is
// retried with a jittered exponential backoff, as Envoy retries a failed
// xDS stream (500 ms doubling to 30 s; here 50 ms to 1 s, so the sync is
// not lengthened by much): retrying every 20 ms, 10,000 proxies opened over
// a hundred thousand refused streams in one sync, work no fleet would ask
// of a control plane. Any other end is reconnected after 20 ms, as after a
// restart, so that what is measured is not Envoy's delay.
func (l *load) start() {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.root = ctx
	l.streams, l.endStreams = context.WithCancel(ctx)
	for i, p := range l.proxies {
		conn := &proxyConn{cc: l.conns[i/proxiesPerConn], p: p}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			refusedWait := time.Duration(0)
			for ctx.Err() == nil {
				wait := 20 * time.Millisecond
				if err := p.c.Run(l.streamContext(), conn); refused(err) {
					refusedWait = min(max(2*refusedWait, 50*time.Millisecond), time.Second)
					wait = refusedWait/2 + rand.N(refusedWait/2)
				} else {
					refusedWait = 0
				}
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
		}()
	}
}

// streamContext is the context a proxy's next stream runs under.
func (l *load) streamContext() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams
}

// reconnect ends every proxy's stream from the proxy's side, as a proxy
// whose connection broke; each opens a new one at once (after start's 20
// ms), declaring what it holds (delta) or naming the versions it accepted
// (SotW), to the same control plane.
func (l *load) reconnect() {
	l.mu.Lock()
	end := l.endStreams
	l.streams, l.endStreams = context.WithCancel(l.root)
	l.mu.Unlock()
	end()
}

// refused reports whether the control plane refused the stream for now: over
// its pace (ResourceExhausted), or not ready yet (a replica starting, which
// refuses streams until its first build from the whole cluster).
func refused(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.ResourceExhausted || st.Code() == codes.Unavailable && strings.HasPrefix(st.Message(), "not ready")
}

func (l *load) close() {
	if l.cancel != nil {
		l.cancel()
		l.wg.Wait()
	}
	for _, cc := range l.conns {
		_ = cc.Close()
	}
}

// counts sums every proxy's traffic counters.
func (l *load) counts() adsclient.Counts {
	var c adsclient.Counts
	for _, p := range l.proxies {
		s := p.c.Stats()
		c.Bytes += s.Bytes
		c.Responses += s.Responses
		c.Resources += s.Resources
		c.Removed += s.Removed
		c.NACKs += s.NACKs
		c.Unrequested += s.Unrequested
		c.Ignored += s.Ignored
	}
	return c
}

// waitDone waits until want armed proxies converged, or the deadline.
func (l *load) waitDone(want int, deadline time.Time) bool {
	for time.Now().Before(deadline) {
		if int(l.tr.done.Load()) >= want {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return int(l.tr.done.Load()) >= want
}

// settle waits until no proxy processed a response for quiet, so traffic
// that follows convergence is counted in its phase; at most max.
func (l *load) settle(quiet, max time.Duration) {
	end := time.Now().Add(max)
	for time.Now().Before(end) {
		idle := time.Since(time.Unix(0, l.tr.lastEvent.Load()))
		if idle >= quiet {
			return
		}
		time.Sleep(min(quiet-idle, 20*time.Millisecond))
	}
}
