package server_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// allTypes are the four served types in ADS order, as adsclient names them.
var allTypes = xdstype.URLs()

// world is the model's view of the cluster: what the reconcilers would
// have fed the catalog. Every value in it is immutable once stored, because
// the catalog keeps the pointers it is given.
type world struct {
	namespaces map[string]map[string]string
	services   map[model.Key]*model.Service
	scopes     map[model.Key]*model.Scope
}

func newWorld() *world {
	return &world{
		namespaces: map[string]map[string]string{},
		services:   map[model.Key]*model.Service{},
		scopes:     map[model.Key]*model.Scope{},
	}
}

func (w *world) clone() *world {
	return &world{namespaces: maps.Clone(w.namespaces), services: maps.Clone(w.services), scopes: maps.Clone(w.scopes)}
}

// truth is what a scope's proxies must hold: type URL → name → the
// resource marshalled deterministically.
type truth map[string]map[string][]byte

// truthOf translates the scope from scratch, independently of the catalog's
// incremental bookkeeping, and marshals it the way the snapshot builder
// does, as proxies of the zone see it: the zone's view of an assignment
// where there is one.
func (w *world) truthOf(key model.Key, zone string) (truth, error) {
	sc := w.scopes[key]
	if sc == nil {
		return nil, fmt.Errorf("scope %s does not exist", key)
	}
	var selected []*model.Service
	for _, svc := range w.services {
		nsLabels, nsKnown := w.namespaces[svc.Key.Namespace]
		if sc.Selects(svc, nsLabels, nsKnown) {
			selected = append(selected, svc)
		}
	}
	res := translate.Translate(sc, selected).Seen(model.Location{Zone: zone})
	if err := kubeProxyOrder(selected, res.Endpoints); err != nil {
		return nil, fmt.Errorf("scope %s, zone %q: %w", key, zone, err)
	}
	out := truth{}
	for _, t := range allTypes {
		out[t] = map[string][]byte{}
	}
	mo := proto.MarshalOptions{Deterministic: true}
	add := func(t, name string, m proto.Message) error {
		b, err := mo.Marshal(m)
		if err != nil {
			return err
		}
		if _, dup := out[t][name]; dup {
			return fmt.Errorf("translation of %s has two %s named %q", key, t, name)
		}
		out[t][name] = b
		return nil
	}
	var err error
	res.Each(func(t xdstype.Type, m proto.Message) {
		if err == nil {
			err = add(t.URL(), t.Info().NameOf(m), m)
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// clusterService is the Service an assignment's name says it belongs to,
// read as a client reads it: "<ns>/<svc>:<port>", then "@<uid>" in
// ProxylessGRPC mode (model.ClusterName).
func clusterService(name string) (model.Key, bool) {
	ns, rest, ok := strings.Cut(name, "/")
	svc, _, hasPort := strings.Cut(rest, ":")
	return model.Key{Namespace: ns, Name: svc}, ok && hasPort && ns != "" && svc != ""
}

// kubeProxyOrder checks the assignments against kube-proxy's rule for
// endpoint states (KEP-1669), read straight from the Services: an endpoint
// that neither is ready nor serves gets no traffic, so it is absent; a
// serving-but-terminating one gets traffic exactly when no ready endpoint
// is left, so it is HEALTHY (every xDS client skips an unhealthy endpoint
// even then) at a priority after every ready endpoint's (every xDS client
// uses a priority only while those before it have no healthy endpoint).
// An address is ready when any of its copies is.
func kubeProxyOrder(services []*model.Service, clas []*endpointv3.ClusterLoadAssignment) error {
	byKey := map[model.Key]*model.Service{}
	for _, svc := range services {
		byKey[svc.Key] = svc
	}
	for _, cla := range clas {
		key, ok := clusterService(cla.GetClusterName())
		svc := byKey[key]
		if !ok || svc == nil {
			return fmt.Errorf("assignment %s: of no selected Service", cla.GetClusterName())
		}
		// The Service port's name, by the number the cluster name ends in:
		// of TCP ports that share a number, the first by name.
		name, _, _ := strings.Cut(cla.GetClusterName(), "@")
		portName, found := "", false
		for _, p := range svc.Ports {
			tcp := p.Protocol == model.ProtocolTCP || p.Protocol == ""
			if tcp && strings.HasSuffix(name, fmt.Sprintf(":%d", p.Port)) && (!found || p.Name < portName) {
				portName, found = p.Name, true
			}
		}
		type hostPort struct {
			addr string
			port uint32
		}
		ready, serving := map[hostPort]bool{}, map[hostPort]bool{}
		for i := range svc.Endpoints {
			ep := &svc.Endpoints[i]
			for _, p := range ep.Ports {
				if p.Name == portName {
					hp := hostPort{ep.Address, uint32(p.Port)}
					ready[hp] = ready[hp] || ep.Ready
					serving[hp] = serving[hp] || ep.Serving
				}
			}
		}
		lastReady, firstTerminating := -1, -1
		for _, loc := range cla.GetEndpoints() {
			prio := int(loc.GetPriority())
			for _, lb := range loc.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				addr := hostPort{sa.GetAddress(), sa.GetPortValue()}
				switch {
				case lb.GetHealthStatus() != corev3.HealthStatus_HEALTHY:
					return fmt.Errorf("assignment %s: %v is %v, want HEALTHY", cla.GetClusterName(), addr, lb.GetHealthStatus())
				case ready[addr]:
					lastReady = max(lastReady, prio)
				case serving[addr]:
					if firstTerminating < 0 || prio < firstTerminating {
						firstTerminating = prio
					}
				default:
					return fmt.Errorf("assignment %s: %v neither is ready nor serves", cla.GetClusterName(), addr)
				}
			}
		}
		if firstTerminating >= 0 && firstTerminating <= lastReady {
			return fmt.Errorf("assignment %s: a terminating endpoint at priority %d, not after every ready one (up to %d)",
				cla.GetClusterName(), firstTerminating, lastReady)
		}
	}
	return nil
}

// controlPlane is one incarnation of the control plane: catalog, builder,
// store, feedback and ADS server, served on its own loopback listener.
type controlPlane struct {
	*pipeline.Pipeline
	cancel context.CancelFunc
	served chan error
	conn   *grpc.ClientConn
	recvs  *recvCounter
}

// recvCounter is a stream interceptor that counts, per stream, the requests
// its handler has taken. The server reads requests in a goroutine that
// hands each one to the stream's loop and only then reads the next, so a
// read that has begun means every earlier request was handed over: the loop
// handles it before it looks at the next scope change. That is the barrier
// a step needs, since a request that changes nothing (an unsubscription, an
// ACK) is not answered.
//
// It also counts the responses each stream sent, so that the harness can
// wait until the proxy processed all of them.
//
// A stream is known by the key its proxy sends in the streamKey metadata,
// from the moment its handler starts. Neither the node (every stream of a
// proxy has the same) nor the order in which streams are seen tells which
// stream a proxy is on: a stream can reach the server after the proxy
// opened the next one, and a stream the proxy already cancelled still has
// its first request read.
type recvCounter struct {
	mu       sync.Mutex
	byStream map[string]*streamCounts
	changed  chan struct{}
}

// streamKey is the metadata key that names a model proxy's stream.
const streamKey = "x-model-stream"

// streamSeq numbers the streams model proxies open.
var streamSeq atomic.Int64

type streamCounts struct {
	reads atomic.Int64 // RecvMsg calls begun
	sent  atomic.Int64 // responses sent
}

func newRecvCounter() *recvCounter {
	return &recvCounter{byStream: map[string]*streamCounts{}, changed: make(chan struct{}, 1)}
}

func (rc *recvCounter) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	n := &streamCounts{}
	if md, ok := metadata.FromIncomingContext(ss.Context()); ok && len(md.Get(streamKey)) == 1 {
		rc.mu.Lock()
		rc.byStream[md.Get(streamKey)[0]] = n
		rc.mu.Unlock()
		rc.signal()
	}
	return handler(srv, &countingStream{ServerStream: ss, rc: rc, n: n})
}

func (rc *recvCounter) signal() {
	select {
	case rc.changed <- struct{}{}:
	default:
	}
}

// taken returns how many requests the stream of that key handed to its
// loop and how many responses it sent, and whether the stream reached the
// server.
func (rc *recvCounter) taken(stream string) (taken, sent int64, ok bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n, ok := rc.byStream[stream]
	if !ok {
		return 0, 0, false
	}
	return n.reads.Load() - 1, n.sent.Load(), true
}

type countingStream struct {
	grpc.ServerStream
	rc *recvCounter
	n  *streamCounts
}

func (cs *countingStream) SendMsg(m any) error {
	err := cs.ServerStream.SendMsg(m)
	if err == nil {
		cs.n.sent.Add(1)
		cs.rc.signal()
	}
	return err
}

func (cs *countingStream) RecvMsg(m any) error {
	cs.n.reads.Add(1)
	cs.rc.signal()
	return cs.ServerStream.RecvMsg(m)
}

// loopbackFleet is the production limits for a fleet whose proxies all
// connect from the loopback address, as the model's do: the per-address
// bounds on connections and the per-client bound on streams are the
// replica's, since in a cluster each proxy has its own address (the
// hostile suite tests the per-address ones).
var loopbackFleet = server.Options{
	MaxConnectionsPerPeer:          server.DefaultOptions.MaxConnections,
	MaxStreamsPerClient:            server.DefaultOptions.MaxConnections * server.DefaultOptions.MaxStreamsPerConnection,
	NewConnectionsPerPeerPerSecond: server.DefaultOptions.NewConnectionsPerSecond,
	NewConnectionsPerPeerBurst:     server.DefaultOptions.NewConnectionsBurst,
}

// startControlPlane builds a control plane from the world, as a restarted
// operator does from its informers' initial lists, and serves it.
func startControlPlane(w *world, opts server.Options) (*controlPlane, error) {
	return startFedControlPlane(func(cat *catalog.Catalog) {
		for _, name := range slices.Sorted(maps.Keys(w.namespaces)) {
			cat.UpsertNamespace(name, w.namespaces[name])
		}
		for _, svc := range w.services {
			cat.UpsertService(svc)
		}
		for _, sc := range w.scopes {
			cat.UpsertScope(sc)
		}
	}, opts)
}

// startFedControlPlane is startControlPlane with the initial lists fed to
// the catalog by fill, in the order it chooses.
func startFedControlPlane(fill func(*catalog.Catalog), opts server.Options) (*controlPlane, error) {
	if opts.Authenticator == nil {
		opts.Authenticator = &auth.Authenticator{AllowAnonymous: true}
	}
	cp := &controlPlane{Pipeline: pipeline.New(pipeline.Options{Server: opts})}
	// The model's truth selects across namespaces freely: these tests are
	// about serving, and consent is the catalog's (tested there).
	cp.Catalog.SetCrossNamespace(catalog.CrossNamespaceAllow, false)
	fill(cp.Catalog)
	cp.Sync()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp.cancel = cancel
	cp.served = make(chan error, 1)
	cp.recvs = newRecvCounter()
	go func() {
		cp.served <- cp.Server.ServeListener(ctx, lis, grpc.ChainStreamInterceptor(cp.recvs.intercept))
	}()
	cp.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		return nil, errors.Join(err, <-cp.served)
	}
	return cp, nil
}

// stop ends ServeListener (which drains every stream) and waits for it.
// It leaves the client connection open, so that its streams see how the
// server ended them rather than the connection closing under them; close
// closes it too.
func (cp *controlPlane) stop() error {
	cp.cancel()
	select {
	case err := <-cp.served:
		return err
	case <-time.After(20 * time.Second):
		return errors.New("ServeListener did not return 20s after its context ended")
	}
}

// close stops the control plane and closes the client connection.
func (cp *controlPlane) close() error {
	err := cp.stop()
	_ = cp.conn.Close()
	return err
}

// scopeVersion returns the served version of a scope, and whether it exists.
func (cp *controlPlane) scopeVersion(key model.Key) (string, bool) {
	sc := cp.Store.Get(key)
	if sc == nil {
		return "", false
	}
	var v string
	var ok bool
	sc.Read(func(view snapshot.View) { v, ok = view.Version(), view.Spec() != nil })
	return v, ok
}

// proxyState is what the model expects of a proxy's stream.
type proxyState int

const (
	// idle: no stream, none expected.
	idle proxyState = iota
	// connected: the stream is expected to be up and in sync with the scope.
	connected
	// ending: the stream is expected to end with proxy.want.
	ending
)

// proxy is one simulated Envoy (or gRPC client) with the harness's
// bookkeeping around its adsclient.Client.
type proxy struct {
	id    string
	ref   string // the scope named in node metadata ("" for none)
	proto model.Protocol
	c     *adsclient.Client
	node  *corev3.Node // what c sends
	armed atomic.Bool  // NACK the next response

	state  proxyState
	want   codes.Code // when ending
	cancel context.CancelFunc
	done   chan struct{}
	err    error // how the last stream ended, valid once done is closed

	// streamStart is the number of events recorded before the current stream.
	streamStart int
	// reqStart is the number of requests the client sent before the current stream.
	reqStart int64
	// stream is the key the current stream sends as streamKey.
	stream string
	// opened are the types the current stream requested when it opened;
	// the server answers each first request, so until every one of them got
	// a response the stream is not established, whatever the proxy holds.
	opened []string
	// stepStart is the number of events recorded before the current step.
	stepStart int
	// openedInStep is set when the current stream opened during the
	// current step: a stream that adopted what the proxy held may get its
	// first response steps after it opened.
	openedInStep bool
	// changed are the types of the scope's truth the current step changed.
	changed map[string]bool
	// subs are SotW by-name subscriptions the harness made, per type.
	subs map[string]map[string]struct{}
	// subMarks records, per type, the event count when a subscription changed.
	subMarks map[string][]int
	// drops records, per type, the names the harness unsubscribed, with
	// the event counts just before and after it did.
	drops map[string][]subDrop
	// raced counts, per type, the resources of the responses before
	// scanned that carried a name the proxy had just unsubscribed from
	// (see scanRaced); lastOf is the index of the last response of each
	// type among them.
	raced   map[string]int64
	lastOf  map[string]int
	scanned int
	// zone is where the proxy runs, as its bootstrap's node.locality says.
	zone string
	// adopted are the SotW types whose version_info, as the current stream
	// opened, was the version the server serves the proxy's subscription
	// at: it holds exactly that, and must be sent nothing of the type until
	// something changes.
	adopted map[string]bool
}

func (p *proxy) key() (model.Key, bool) {
	ns, name, ok := strings.Cut(p.ref, "/")
	if !ok {
		return model.Key{}, false
	}
	return model.Key{Namespace: ns, Name: name}, true
}

func (p *proxy) sotw() bool { return p.proto == model.SotW }

func (p *proxy) running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func newProxy(id, ref string, proto model.Protocol) *proxy {
	p := &proxy{id: id, ref: ref, proto: proto,
		subs:     map[string]map[string]struct{}{xdstype.Endpoint.URL(): {}, xdstype.Route.URL(): {}},
		subMarks: map[string][]int{},
		drops:    map[string][]subDrop{},
		raced:    map[string]int64{},
		lastOf:   map[string]int{},
	}
	node := testkit.Node(id, ref)
	node.Cluster = "model"
	p.node = node
	cfg := adsclient.Config{
		Node:         node,
		Types:        allTypes,
		Validate:     true,
		RecordEvents: true,
		Reject: func(string, []*anypb.Any, []string) string {
			if p.armed.CompareAndSwap(true, false) {
				return "model test: rejected on purpose"
			}
			return ""
		},
	}
	if proto == model.Delta {
		cfg.Protocol = adsclient.Delta
		cfg.Wildcard = map[string]bool{}
		for _, t := range allTypes {
			cfg.Wildcard[t] = true
		}
	} else {
		cfg.Wildcard = map[string]bool{xdstype.Cluster.URL(): true, xdstype.Listener.URL(): true}
	}
	p.c = adsclient.New(cfg)
	return p
}

// moveTo makes the proxy's next stream declare that it runs in zone; the
// client sends the node it was made with, so this changes it in place,
// between streams.
func (p *proxy) moveTo(zone string) {
	p.zone = zone
	p.node.Locality = nil
	if zone != "" {
		p.node.Locality = &corev3.Locality{Zone: zone}
	}
}

// start opens a stream on conn; Run goes on in the background.
func (p *proxy) start(conn *grpc.ClientConn) {
	p.streamStart = len(p.c.Events())
	p.openedInStep = true
	p.reqStart = p.c.Stats().Requests
	p.opened = []string{xdstype.Cluster.URL(), xdstype.Listener.URL()}
	if p.proto == model.Delta {
		p.opened = allTypes
	} else {
		for _, t := range []string{xdstype.Endpoint.URL(), xdstype.Route.URL()} {
			if len(p.subs[t]) > 0 {
				p.opened = append(p.opened, t)
			}
		}
	}
	p.stream = fmt.Sprintf("%s/%d", p.id, streamSeq.Add(1))
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), streamKey, p.stream))
	done := make(chan struct{})
	p.cancel, p.done = cancel, done
	go func() {
		err := p.c.Run(ctx, conn)
		p.err = err
		close(done)
	}()
}

// claims returns, for a SotW proxy about to open a stream to a scope that
// serves sc, the types whose version_info is the version the scope's
// current state has for the proxy's subscription, and how many of the
// types it will request name some other version. A wildcard
// subscription's version is the type's; a by-name one's covers the
// subscribed names too. The proxies here are not gRPC clients, so their
// assignments and route configurations are adopted too (sotw.adopt).
func (p *proxy) claims(sc *snapshot.Snapshot) (adopted map[string]bool, stale int) {
	adopted = map[string]bool{}
	if !p.sotw() || sc == nil {
		return adopted, 0
	}
	sc.ReadFrom(model.Location{Zone: p.zone}, func(v snapshot.View) {
		for _, t := range allTypes {
			claimed := p.c.VersionInfo(t)
			wildcard := t == xdstype.Cluster.URL() || t == xdstype.Listener.URL()
			if claimed == "" || (!wildcard && len(p.subs[t]) == 0) {
				continue
			}
			served := v.TypeVersion(snapshotType(t))
			if !wildcard {
				var names uint64
				for n := range p.subs[t] {
					names ^= snapshot.NameDigest(n)
				}
				served = snapshot.SubsetVersion(served, names)
			}
			if claimed == served {
				adopted[t] = true
			} else {
				stale++
			}
		}
	})
	return adopted, stale
}

// stop cancels the stream and waits for Run to return.
func (p *proxy) stop() error {
	if p.done == nil {
		return nil
	}
	p.cancel()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("proxy %s: Run did not return 10s after its context ended", p.id)
	}
}

// waitEnd waits for the stream to end and reports whether it did, and how.
func (p *proxy) waitEnd(timeout time.Duration) (bool, error) {
	if p.done == nil {
		return true, nil
	}
	select {
	case <-p.done:
		return true, p.err
	case <-time.After(timeout):
		return false, nil
	}
}

// staleness says what a NACK on the current stream may have left behind:
// the proxy keeps its previous configuration of what it rejected, and the
// server does not resend a rejected version, only sends the rejected
// resources again with the next change of their type. A SotW Cluster or
// Listener response replaces the whole type, so a NACK leaves the whole type
// behind until a later response of it is accepted (types); elsewhere it
// leaves behind the names the rejected response carried, until a later
// accepted response carries them again (names). And until a later response
// of a type is accepted, the server rightly counts the proxy as rejecting
// it, even when the rejected response carried nothing (latest).
type staleness struct {
	types  map[string]bool
	names  map[string]map[string]bool
	latest map[string]bool
}

func (s staleness) any() bool {
	if len(s.types) > 0 || len(s.latest) > 0 {
		return true
	}
	for _, n := range s.names {
		if len(n) > 0 {
			return true
		}
	}
	return false
}

// touches reports whether type t has anything stale.
func (s staleness) touches(t string) bool { return s.types[t] || s.latest[t] || len(s.names[t]) > 0 }

func (p *proxy) staleness() staleness {
	evs := p.c.Events()
	s := staleness{types: map[string]bool{}, names: map[string]map[string]bool{}, latest: map[string]bool{}}
	for _, ev := range evs[min(p.streamStart, len(evs)):] {
		t := ev.TypeURL
		s.latest[t] = !ev.Accepted
		if p.sotw() && (t == xdstype.Cluster.URL() || t == xdstype.Listener.URL()) {
			s.types[t] = !ev.Accepted
			continue
		}
		if s.names[t] == nil {
			s.names[t] = map[string]bool{}
		}
		for _, n := range slices.Concat(ev.Names, ev.Removed) {
			if ev.Accepted {
				delete(s.names[t], n)
			} else {
				s.names[t][n] = true
			}
		}
	}
	maps.DeleteFunc(s.types, func(_ string, v bool) bool { return !v })
	maps.DeleteFunc(s.latest, func(_ string, v bool) bool { return !v })
	return s
}

// lastAnswer returns whether the latest response of type t on the current
// stream was accepted, and whether there was one; and whether one arrived
// during the current step.
func (p *proxy) lastAnswer(t string) (accepted, any, thisStep bool) {
	evs := p.c.Events()
	for i := len(evs) - 1; i >= min(p.streamStart, len(evs)); i-- {
		if evs[i].TypeURL == t {
			return evs[i].Accepted, true, i >= p.stepStart
		}
	}
	return false, false, false
}

// adjustSubs makes a SotW proxy's EDS and RDS subscriptions follow what its
// clusters and listeners reference, and reports whether it changed any.
func (p *proxy) adjustSubs() (bool, error) {
	changed := false
	for _, t := range []string{xdstype.Endpoint.URL(), xdstype.Route.URL()} {
		want, err := testkit.Referenced(p.c, t)
		if err != nil {
			return false, err
		}
		var add, drop []string
		for n := range want {
			if _, ok := p.subs[t][n]; !ok {
				add = append(add, n)
			}
		}
		for n := range p.subs[t] {
			if _, ok := want[n]; !ok {
				drop = append(drop, n)
			}
		}
		if len(add) == 0 && len(drop) == 0 {
			continue
		}
		changed = true
		sort.Strings(add)
		sort.Strings(drop)
		p.subMarks[t] = append(p.subMarks[t], len(p.c.Events()))
		if len(drop) > 0 {
			for _, n := range drop {
				delete(p.subs[t], n)
			}
			before := len(p.c.Events())
			_ = p.c.Unsubscribe(t, drop...) // a failed Send ends the stream, which is checked
			p.drops[t] = append(p.drops[t], subDrop{before: before, after: len(p.c.Events()), names: drop})
		}
		if len(add) > 0 {
			for _, n := range add {
				p.subs[t][n] = struct{}{}
			}
			_ = p.c.Subscribe(t, add...)
		}
	}
	return changed, nil
}

// subDrop is one unsubscription the harness made: the names, and how many
// responses the proxy had processed just before and just after.
type subDrop struct {
	before, after int
	names         []string
}

// scanRaced counts, per type, and returns the resources of the proxy's
// accepted responses (from the last scan on) that carried a name it
// unsubscribed from after it processed the previous response of the type.
// Such a response may be one the server sent before it read the
// unsubscription: that request named the nonce of the previous response,
// superseded once this one was sent, so the server rightly ignored it (the
// proxy's ACK of this response states the subscription again). A SotW
// server cannot avoid the race, and Envoy drops such resources as the
// client does. Every other resource the client counts as unrequested is
// one the server sent though it knew better.
func (p *proxy) scanRaced() (found int64) {
	evs := p.c.Events()
	for i := p.scanned; i < len(evs); i++ {
		ev := evs[i]
		prev, ok := p.lastOf[ev.TypeURL]
		if !ok {
			prev = -1
		}
		p.lastOf[ev.TypeURL] = i
		if !ev.Accepted {
			continue
		}
		dropped := map[string]bool{}
		for _, d := range p.drops[ev.TypeURL] {
			if d.after > prev && d.before <= i {
				for _, n := range d.names {
					dropped[n] = true
				}
			}
		}
		for _, n := range ev.Names {
			if dropped[n] {
				p.raced[ev.TypeURL]++
				found++
			}
		}
	}
	p.scanned = len(evs)
	return found
}

// subsStable reports whether a SotW proxy's by-name subscriptions are what its
// held clusters and listeners reference.
func (p *proxy) subsStable() bool {
	for _, t := range []string{xdstype.Endpoint.URL(), xdstype.Route.URL()} {
		want, err := testkit.Referenced(p.c, t)
		if err != nil || !setEqual(want, p.subs[t]) {
			return false
		}
	}
	return true
}

func setEqual(a, b map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// mismatch describes how the proxy's held state differs from what it must
// hold given the truth of its scope, or returns "" when it holds exactly
// that. What a NACK left behind is checked only as far as it can be, unless
// strict.
func (p *proxy) mismatch(tr truth, cp *controlPlane, key model.Key, strict bool) string {
	stale := p.staleness()
	if strict {
		stale = staleness{}
	}
	var b strings.Builder
	evs := p.c.Events()
	for _, t := range p.opened {
		if p.adopted[t] {
			continue
		}
		if !slices.ContainsFunc(evs[min(p.streamStart, len(evs)):], func(ev adsclient.Event) bool { return ev.TypeURL == t }) {
			fmt.Fprintf(&b, "  %s: no response yet on the current stream\n", shortType(t))
		}
	}
	sc := cp.Store.Get(key)
	for _, t := range allTypes {
		held := p.c.State(t)
		want := tr[t]
		short := shortType(t)
		lenient := slices.Sorted(maps.Keys(stale.names[t]))
		if p.proto == model.Delta {
			diffHeld(&b, short, held, want, lenient)
			// A delta proxy's versions are what it declares on reconnect, so
			// they must be the server's.
			if sc != nil {
				sc.ReadFrom(model.Location{Zone: p.zone}, func(v snapshot.View) {
					for name, h := range held {
						if r := v.Get(snapshotType(t), name); r != nil && r.Version != h.Version && !stale.names[t][name] {
							fmt.Fprintf(&b, "  %s %q: held version %s, served version %s\n", short, name, h.Version, r.Version)
						}
					}
				})
			}
			continue
		}
		switch t {
		case xdstype.Cluster.URL(), xdstype.Listener.URL():
			if stale.types[t] {
				continue
			}
			diffHeld(&b, short, held, want, nil)
			if sc != nil {
				sc.ReadFrom(model.Location{Zone: p.zone}, func(v snapshot.View) {
					tv := v.TypeVersion(snapshotType(t))
					for name, h := range held {
						if h.Version != tv {
							fmt.Fprintf(&b, "  %s %q: held at version_info %s, the type is at %s\n", short, name, h.Version, tv)
						}
					}
				})
			}
		default:
			parent := xdstype.Cluster.URL()
			if t == xdstype.Route.URL() {
				parent = xdstype.Listener.URL()
			}
			need, err := testkit.Referenced(p.c, t)
			if err != nil {
				fmt.Fprintf(&b, "  %s: %v\n", short, err)
				continue
			}
			if !setEqual(need, p.subs[t]) {
				fmt.Fprintf(&b, "  %s: subscriptions %v not yet %v\n", short, keys(p.subs[t]), keys(need))
			}
			restricted := map[string][]byte{}
			var absent []string
			for n := range need {
				if body, ok := want[n]; ok {
					restricted[n] = body
				} else {
					absent = append(absent, n)
				}
			}
			// A name referenced by a held parent must exist in the truth,
			// unless the parent itself is held back by a NACK.
			if len(absent) > 0 && !stale.types[parent] {
				slices.Sort(absent)
				fmt.Fprintf(&b, "  %s: referenced but not in the scope: %v\n", short, absent)
			}
			diffHeld(&b, short, held, restricted, slices.Concat(absent, lenient))
		}
	}
	return b.String()
}

// diffHeld writes the differences between held and want; names in lenient
// may be held or not, with any content.
func diffHeld(b *strings.Builder, short string, held map[string]adsclient.Held, want map[string][]byte, lenient []string) {
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if slices.Contains(lenient, name) {
			continue
		}
		h, ok := held[name]
		switch {
		case !ok:
			fmt.Fprintf(b, "  %s %q: missing\n", short, name)
		case h.Resource == nil:
			fmt.Fprintf(b, "  %s %q: held without payload\n", short, name)
		case !bytesEqual(h.Resource.GetValue(), want[name]):
			fmt.Fprintf(b, "  %s %q: held content differs from the truth\n", short, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(held)) {
		if _, ok := want[name]; !ok && !slices.Contains(lenient, name) {
			fmt.Fprintf(b, "  %s %q: held but not in the truth\n", short, name)
		}
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

func keys(m map[string]struct{}) []string { return slices.Sorted(maps.Keys(m)) }

func snapshotType(url string) xdstype.Type {
	t, _ := xdstype.ByURL(url)
	return t
}

// serverSynced reports whether the server's feedback says the proxy's
// current stream ACKed everything of the scope's current version, which is
// what the scope's Ready condition is computed from.
func serverSynced(cp *controlPlane, key model.Key, node string) (bool, string) {
	version, ok := cp.scopeVersion(key)
	if !ok {
		return false, "scope not served"
	}
	var newest *feedback.Proxy
	for _, fp := range cp.Feedback.Get(key).Proxies {
		if fp.Node == node && (newest == nil || fp.ID > newest.ID) {
			newest = fp
		}
	}
	if newest == nil {
		return false, "the stream is not in the scope's feedback"
	}
	if newest.AtVersion != version {
		return false, fmt.Sprintf("feedback has the proxy at version %q (acked %v, nacked %v), the scope is at %q",
			newest.AtVersion, newest.Acked, newest.Nacked, version)
	}
	return true, ""
}

// nackResends returns a description of every response that repeats a
// NACKed one (same type, version and resources) on the same stream without
// a subscription change in between: the resend loop of go-control-plane
// issue #962.
func (p *proxy) nackResends() string {
	evs := p.c.Events()
	evs = evs[min(p.streamStart, len(evs)):]
	base := p.streamStart
	var b strings.Builder
	for i, ev := range evs {
		if ev.Accepted {
			continue
		}
		for j := i + 1; j < len(evs); j++ {
			nx := evs[j]
			if nx.TypeURL != ev.TypeURL {
				continue
			}
			resubscribed := false
			for _, m := range p.subMarks[ev.TypeURL] {
				if m > base+i && m <= base+j {
					resubscribed = true
				}
			}
			if !resubscribed && nx.Version == ev.Version && slices.Equal(nx.Names, ev.Names) && slices.Equal(nx.Removed, ev.Removed) {
				fmt.Fprintf(&b, "  %s version %q NACKed (nonce %s) and sent again (nonce %s)\n", ev.TypeURL, ev.Version, ev.Nonce, nx.Nonce)
			}
			break
		}
	}
	return b.String()
}

// endCode is the status code a stream ended with; io.EOF counts as OK.
func endCode(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Unknown
}

func shortType(t string) string { return t[strings.LastIndex(t, ".")+1:] }

// trace describes the proxy's recent responses and subscription changes,
// for failure messages.
func (p *proxy) trace() string {
	evs := p.c.Events()
	var b strings.Builder
	from := max(0, len(evs)-25)
	fmt.Fprintf(&b, "  last %d of %d responses (current stream from #%d):\n", len(evs)-from, len(evs), p.streamStart)
	for i := from; i < len(evs); i++ {
		ev := evs[i]
		for _, t := range allTypes {
			for _, m := range p.subMarks[t] {
				if m == i {
					fmt.Fprintf(&b, "    -- %s subscription or content change before #%d\n", shortType(t), i)
				}
			}
		}
		verdict := "ACK"
		if !ev.Accepted {
			verdict = "NACK"
		}
		fmt.Fprintf(&b, "    #%d %s nonce=%s version=%s %s names=%v removed=%v\n", i, shortType(ev.TypeURL), ev.Nonce, ev.Version, verdict, ev.Names, ev.Removed)
	}
	for _, t := range []string{xdstype.Endpoint.URL(), xdstype.Route.URL()} {
		fmt.Fprintf(&b, "  %s subscriptions now: %v\n", shortType(t), keys(p.subs[t]))
	}
	return b.String()
}
