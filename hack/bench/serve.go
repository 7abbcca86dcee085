package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
)

// controlPlane is one implementation under test, running in the serve
// process.
type controlPlane interface {
	// Apply hands one event's change to the control plane; the world already
	// holds it.
	Apply(ch Change)
	// Serve serves ADS on lis until ctx ends.
	Serve(ctx context.Context, lis net.Listener) error
	// Priced is the bytes the control plane says the other protocol would
	// have sent so far, or -1 when it does not say.
	Priced() int64
	// Synced is how many streams bound to their scope at or after since
	// the control plane counts at their scope's current version, or -1
	// when it does not say.
	Synced(since time.Time) int
	// Builds is how many versions of the world the control plane has built
	// so far, summed over its scopes: what it pushed, as opposed to the
	// changes it was handed.
	Builds() int64
}

// serveMain is the control-plane process: `bench serve`. It builds the world
// (replaying earlier events after a restart), serves ADS, prints
// "ready <addr>" and then answers one command per stdin line:
//
//	event <name>   apply an event; answers "ok"
//	usage          answers "usage <cpu-ns>": user+system CPU of this process (getrusage)
//	priced         answers "priced <bytes>": what the other protocol would have sent (-1: not said)
//	synced [t]     answers "synced <n>": streams counted at their scope's version (-1: not said), of those bound at or after t (Unix nanoseconds) when given
//	builds         answers "builds <n>": versions built so far, over every scope
//	gc             forces a GC and returns freed memory to the OS; answers "ok"
//	heapprofile <file> writes a heap profile; answers "ok"
//	profile <file> starts a CPU profile; "profile-stop" ends it; both answer "ok"
//	quit           exits (so does the end of stdin)
func serveMain(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	impl := fs.String("impl", "scopeplane", "control plane: scopeplane, baseline (stock go-control-plane SnapshotCache), or operator (scopeplane's whole operator, against -kubeconfig)")
	services := fs.Int("services", 1000, "number of Services")
	routes := fs.Int("routes", 0, "number of Services with a mesh route (a 90/10 canary)")
	layout := fs.String("layout", string(Unscoped), "unscoped, scoped or zoned")
	protocol := fs.String("protocol", string(model.SotW), "SotW or Delta (the scopes' protocol)")
	addr := fs.String("addr", "127.0.0.1:0", "ADS listen address (loopback only)")
	replay := fs.String("replay", "", "comma-separated events applied before serving (a restart)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process's whole life to this file")
	kubeconfig := fs.String("kubeconfig", "", "with -impl operator: the API server to run scopeplane's operator against")
	heapprofiles := fs.String("heapprofiles", "", "with -impl operator: write heap profiles to files starting with this: when the informers have listed, the listed objects are reconciled and the first snapshots are built (<prefix>.listed, .reconciled, .built.heap.pprof), and at the process's highest resident set (.peak.heap.pprof, rewritten each time it rises 64 MiB above the last one written, past 1 GiB)")
	shards := fs.Int("shards", 1, "with -impl operator: the number of shards (scopeplane's --shards); the operator is one of them")
	shardIndex := fs.Int("shard", 0, "with -impl operator: the operator's shard (scopeplane's --shard)")
	window := fs.Duration("coalesce-window", 0, "build changes in the background as they arrive, coalescing those within this window, as scopeplane's --coalesce-window (0: build each event as one batch before answering it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *impl == "operator" {
		if err := serveOperator(*kubeconfig, *addr, model.Protocol(*protocol), *shards, *shardIndex, *cpuprofile, *heapprofiles); err != nil {
			fmt.Fprintln(os.Stderr, "bench serve:", err)
			return 1
		}
		return 0
	}
	if l := Layout(*layout); l != Unscoped && l != Scoped && l != Zoned {
		fmt.Fprintf(os.Stderr, "bench serve: -layout %q: want unscoped, scoped or zoned\n", *layout)
		return 2
	}
	if err := serve(*impl, WorldParams{Services: *services, Layout: Layout(*layout), Protocol: model.Protocol(*protocol), Routes: *routes},
		*addr, *replay, *cpuprofile, *window); err != nil {
		fmt.Fprintln(os.Stderr, "bench serve:", err)
		return 1
	}
	return 0
}

func serve(impl string, p WorldParams, addr string, replay, cpuprofile string, window time.Duration) error {
	if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("-addr %q: the benchmark serves on loopback only", addr)
	}
	cmd := &commander{}
	defer func() { _ = cmd.stopProfile() }()
	if cpuprofile != "" {
		if err := cmd.startProfile(cpuprofile); err != nil {
			return err
		}
	}

	w := NewWorld(p)
	if replay != "" {
		for _, ev := range strings.Split(replay, ",") {
			if _, err := w.Apply(ev); err != nil {
				return err
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp controlPlane
	switch impl {
	case "scopeplane":
		cp = newScopeplane(w, window)
	case "baseline":
		cp = newBaseline(w, window)
	default:
		return fmt.Errorf("unknown -impl %q", impl)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- cp.Serve(ctx, lis) }()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "ready %s\n", lis.Addr())
	_ = out.Flush()
	return cmd.loop(cp, w, out, served, func() error { return shutdown(cancel, served) })
}

// commander answers the driver's commands (see serveMain) for one
// control-plane process.
type commander struct {
	prof *os.File
}

func (c *commander) startProfile(path string) error {
	if c.prof != nil {
		return errors.New("a profile is already running")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	c.prof = f
	return nil
}

func (c *commander) stopProfile() error {
	if c.prof == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := c.prof.Close()
	c.prof = nil
	return err
}

// answerer is a control plane with commands of its own.
type answerer interface {
	answer(cmd string) (string, bool)
}

// loop answers one command per stdin line until "quit" or the end of
// stdin, then stops the control plane. w is nil when the control plane
// takes no events from the driver.
func (c *commander) loop(cp controlPlane, w *World, out *bufio.Writer, served <-chan error, stop func() error) error {
	reply := func(format string, a ...any) {
		fmt.Fprintf(out, format+"\n", a...)
		_ = out.Flush()
	}
	defer func() { _ = c.stopProfile() }()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		cmd, arg, _ := strings.Cut(line, " ")
		if a, ok := cp.(answerer); ok {
			if answer, ok := a.answer(line); ok {
				reply("%s", answer)
				continue
			}
		}
		switch cmd {
		case "event":
			if w == nil {
				reply("error this control plane takes its events from the API server")
				continue
			}
			ch, err := w.Apply(arg)
			if err != nil {
				reply("error %v", err)
				continue
			}
			cp.Apply(ch)
			reply("ok")
		case "usage":
			reply("usage %d", cpuNanos())
		case "priced":
			reply("priced %d", cp.Priced())
		case "synced":
			var since int64
			if arg != "" {
				if _, err := fmt.Sscanf(arg, "%d", &since); err != nil {
					reply("error synced %q: %v", arg, err)
					continue
				}
			}
			reply("synced %d", cp.Synced(time.Unix(0, since)))
		case "builds":
			reply("builds %d", cp.Builds())
		case "gc":
			// Twice, so buffers parked in sync.Pools (which survive one
			// collection) are freed too: what remains is retained state.
			runtime.GC()
			debug.FreeOSMemory()
			reply("ok")
		case "heapprofile":
			if err := writeHeapProfile(arg); err != nil {
				reply("error %v", err)
				continue
			}
			reply("ok")
		case "profile":
			if err := c.startProfile(arg); err != nil {
				reply("error %v", err)
				continue
			}
			reply("ok")
		case "profile-stop":
			if err := c.stopProfile(); err != nil {
				reply("error %v", err)
				continue
			}
			reply("ok")
		case "quit":
			return stop()
		default:
			reply("error unknown command %q", cmd)
		}
		select {
		case err := <-served:
			return fmt.Errorf("the control plane stopped: %w", err)
		default:
		}
	}
	return stop()
}

// shutdown stops serving, waiting a bounded time for the streams to drain.
func shutdown(cancel context.CancelFunc, served <-chan error) error {
	cancel()
	select {
	case err := <-served:
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench serve: ADS server:", err)
		}
	case <-time.After(3 * time.Second):
	}
	return nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// cpuNanos is this process's user+system CPU time so far.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// scopeplaneCP is the real pipeline minus Kubernetes: catalog → snapshot
// builder → scopeplane's ADS server, with feedback. Without a window each
// event is built as one batch (Sync), not through the coalescing window: the
// window would split an event that changes many Services (a node drain)
// wherever the process happens to be descheduled, and then the SotW and the
// Delta cell, two processes, would push different batches and their figures
// for the other protocol could not be compared. The build's CPU is the same.
// With a window (the churn cells) the builder runs as in production: each
// change goes into the catalog and the builder versions what arrived within
// the window as one revision.
type scopeplaneCP struct {
	*pipeline.Pipeline
	// types are the type URLs every proxy of the world subscribes to.
	types  []string
	window time.Duration
}

func newScopeplane(w *World, window time.Duration) *scopeplaneCP {
	// Every proxy of the bench connects from the loopback address, anonymous,
	// so the per-peer connection bounds and the per-client stream bound are
	// the replica's.
	p := pipeline.New(pipeline.Options{CoalesceWindow: window, Server: server.Options{
		Authenticator:  &auth.Authenticator{AllowAnonymous: true},
		MaxConnections: 1 << 20, MaxConnectionsPerPeer: 1 << 20, MaxStreamsPerClient: 1 << 20,
		NewConnectionsPerPeerPerSecond: server.DefaultOptions.NewConnectionsPerSecond, NewConnectionsPerPeerBurst: server.DefaultOptions.NewConnectionsBurst,
	}})
	// The baseline serves every scope the Services its selections name, in
	// any namespace; so does scopeplane here, as with --cross-namespace=allow.
	p.Catalog.SetCrossNamespace(catalog.CrossNamespaceAllow, false)
	for _, svc := range w.Services {
		p.Catalog.UpsertService(svc)
	}
	for _, r := range w.Routes {
		p.Catalog.UpsertRoute(r)
	}
	for _, sc := range w.Scopes {
		p.Catalog.UpsertScope(sc)
	}
	p.Sync()
	_, types := typesOf(w.P.Protocol)
	return &scopeplaneCP{Pipeline: p, types: types, window: window}
}

func (s *scopeplaneCP) Apply(ch Change) {
	for _, svc := range ch.Upserted {
		s.Catalog.UpsertService(svc)
	}
	for _, k := range ch.Deleted {
		s.Catalog.DeleteService(k)
	}
	for _, r := range ch.Routes {
		s.Catalog.UpsertRoute(r)
	}
	if s.window == 0 {
		s.Sync()
	}
}

// Builds sums the revisions of every scope: each is one version pushed.
func (s *scopeplaneCP) Builds() int64 {
	var n int64
	for _, key := range s.Store.Keys() {
		if sc := s.Store.Get(key); sc != nil {
			sc.Read(func(v snapshot.View) { n += int64(v.Rev()) })
		}
	}
	return n
}

// Priced is what scopeplane says the other protocol would have sent, over
// every scope, since it started.
func (s *scopeplaneCP) Priced() int64 {
	var n int64
	for _, key := range s.Store.Keys() {
		n += s.Feedback.Get(key).Total.OtherBytes
	}
	return n
}

// Synced is how many streams scopeplane's feedback counts at their scope's
// current version (what the status's "N of M proxies at version V" says)
// having answered every type the world's proxies subscribe to. A stream is
// at its version as soon as every type it asked for so far is answered, so
// a SotW proxy sent nothing on a restart counts before it has asked for
// its other types; what those requests cost (and price) is recorded before
// their ACK, so counting ACKs of every type waits for all of it.
func (s *scopeplaneCP) Synced(since time.Time) int {
	n := 0
	for _, key := range s.Store.Keys() {
		sc := s.Store.Get(key)
		if sc == nil {
			continue
		}
		var version string
		sc.Read(func(v snapshot.View) { version = v.Version() })
		for _, p := range s.Feedback.Get(key).Proxies {
			if p.AtVersion == version && s.answeredAll(p) && !p.Since.Before(since) {
				n++
			}
		}
	}
	return n
}

// answeredAll reports whether p ACKed every type of the world.
func (s *scopeplaneCP) answeredAll(p *feedback.Proxy) bool {
	for _, url := range s.types {
		if _, ok := p.Acked[url]; !ok {
			return false
		}
	}
	return true
}

func (s *scopeplaneCP) Serve(ctx context.Context, lis net.Listener) error {
	if s.window > 0 {
		// The world is built (Sync, above): the builder only waits for
		// changes.
		go func() { _ = s.Run(ctx, nil) }()
	}
	return s.Server.ServeListener(ctx, lis)
}

// baselineCP is how most control planes use stock go-control-plane v0.14.0:
// a SnapshotCache holding one snapshot per node, made with NewSnapshot and
// one version string for every type, served by pkg/server/v3. On every event
// it re-translates every scope (with xds/translate, so the resources are the
// ones scopeplane serves) and sets a new snapshot for every node: the view
// of its scope from its zone, as a control plane with per-node snapshots
// does topology-aware routing. A node gets its snapshot when it first shows
// up on a stream.
//
// With a window (the churn cells) it rebuilds in the background instead, as
// a controller whose work queue folds the changes that arrive during a
// rebuild into the next one: the fairest coalescing a rebuild-everything
// control plane can have. Each rebuild waits the window after the change
// that woke it, then builds the latest world.
type baselineCP struct {
	mu      sync.Mutex
	w       *World
	views   map[baselineView]int // → index in w.Views()
	window  time.Duration
	next    chan *World // with a window: the latest world not built yet
	cache   cachev3.SnapshotCache
	res     []map[resourcev3.Type][]types.Resource // by view
	version string
	builds  int64
	nodes   []baselineNode
	known   sync.Map // node id → struct{}; read without mu so streams never wait for a rebuild
}

// baselineView names a view as a node's bootstrap does.
type baselineView struct {
	scope model.Key
	zone  string
}

type baselineNode struct {
	id   string
	view int
}

func newBaseline(w *World, window time.Duration) *baselineCP {
	b := &baselineCP{w: w, views: map[baselineView]int{}, window: window, next: make(chan *World, 1),
		cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	for i, v := range w.Views() {
		b.views[baselineView{w.Scopes[v.Scope].Key, v.Loc.Zone}] = i
	}
	b.rebuild(w)
	return b
}

// rebuild translates every view of w from scratch and gives every node a
// snapshot of its view, versioned by the number of events applied. b.mu
// must be held (or b not shared yet).
func (b *baselineCP) rebuild(w *World) {
	views := w.Views()
	b.res = make([]map[resourcev3.Type][]types.Resource, len(views))
	b.version = fmt.Sprint("w", len(w.Applied))
	b.builds++
	for i, v := range views {
		sc := w.Scopes[v.Scope]
		r := w.Translate(sc).Seen(v.Loc)
		m := map[resourcev3.Type][]types.Resource{}
		for _, c := range r.Clusters {
			m[resourcev3.ClusterType] = append(m[resourcev3.ClusterType], c)
		}
		for _, c := range r.Endpoints {
			m[resourcev3.EndpointType] = append(m[resourcev3.EndpointType], c)
		}
		for _, l := range r.Listeners {
			m[resourcev3.ListenerType] = append(m[resourcev3.ListenerType], l)
		}
		for _, rc := range r.Routes {
			m[resourcev3.RouteType] = append(m[resourcev3.RouteType], rc)
		}
		if translate.VHDS(sc) {
			for _, vh := range r.VirtualHosts {
				m[resourcev3.VirtualHostType] = append(m[resourcev3.VirtualHostType], vh)
			}
		}
		b.res[i] = m
	}
	for _, n := range b.nodes {
		if err := b.setSnapshot(n.id, n.view); err != nil {
			fmt.Fprintln(os.Stderr, "baseline: SetSnapshot:", err)
		}
	}
}

func (b *baselineCP) setSnapshot(id string, view int) error {
	snap, err := cachev3.NewSnapshot(b.version, b.res[view])
	if err != nil {
		return err
	}
	return b.cache.SetSnapshot(context.Background(), id, snap)
}

// ensure gives a node seen for the first time its snapshot.
func (b *baselineCP) ensure(node *corev3.Node) error {
	if node == nil {
		return nil
	}
	id := node.GetId()
	if _, ok := b.known.Load(id); ok {
		return nil
	}
	ns, name, _ := strings.Cut(node.GetMetadata().GetFields()[model.ScopeMetadataKey].GetStringValue(), "/")
	key := baselineView{model.Key{Namespace: ns, Name: name}, node.GetLocality().GetZone()}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.known.Load(id); ok {
		return nil
	}
	view, ok := b.views[key]
	if !ok {
		return status.Errorf(codes.NotFound, "node %q: unknown scope %q in zone %q", id, key.scope, key.zone)
	}
	if err := b.setSnapshot(id, view); err != nil {
		return err
	}
	b.nodes = append(b.nodes, baselineNode{id: id, view: view})
	b.known.Store(id, struct{}{})
	return nil
}

// Priced is -1: the baseline does not price the other protocol.
func (b *baselineCP) Priced() int64 { return -1 }

// Synced is -1: the baseline answers every reconnect, which is how the
// driver sees its proxies converge.
func (b *baselineCP) Synced(time.Time) int { return -1 }

func (b *baselineCP) Apply(Change) {
	if b.window > 0 {
		// Hand the rebuild loop a copy of the world as it is now (the
		// serve loop goes on changing b.w), replacing one it has not
		// taken yet. Only this goroutine sends, so the send cannot block.
		select {
		case <-b.next:
		default:
		}
		b.next <- b.w.copy()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rebuild(b.w)
}

// Builds is how many times the baseline rebuilt the world: each is a new
// version for every node.
func (b *baselineCP) Builds() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.builds
}

// rebuildLoop rebuilds the latest world handed over by Apply, a window
// after the change that woke it, until ctx ends.
func (b *baselineCP) rebuildLoop(ctx context.Context) {
	for {
		var w *World
		select {
		case <-ctx.Done():
			return
		case w = <-b.next:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.window):
		}
		select {
		case w = <-b.next:
		default:
		}
		b.mu.Lock()
		b.rebuild(w)
		b.mu.Unlock()
	}
}

func (b *baselineCP) Serve(ctx context.Context, lis net.Listener) error {
	if b.window > 0 {
		go b.rebuildLoop(ctx)
	}
	cb := baselineCallbacks{b}
	srv := &baselineADS{sotw: sotwv3.NewServer(ctx, b.cache, cb), delta: deltav3.NewServer(ctx, b.cache, cb)}
	g := grpc.NewServer(server.GRPCOptions(server.DefaultOptions)...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, srv)
	return server.ServeUntil(ctx, g, lis, g.Stop)
}

// baselineADS is go-control-plane's ADS service exactly as pkg/server/v3
// assembles it — its StreamAggregatedResources and DeltaAggregatedResources
// are these same one-line delegations to the sotw and delta servers — minus
// the REST and per-type services the benchmark does not use. pkg/server/v3
// itself is not imported because it links in the rate-limit service module,
// which the project's go.mod does not require.
type baselineADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	sotw  sotwv3.Server
	delta deltav3.Server
}

func (s *baselineADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return s.sotw.StreamHandler(stream, resourcev3.AnyType)
}

func (s *baselineADS) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return s.delta.DeltaStreamHandler(stream, resourcev3.AnyType)
}

// baselineCallbacks gives a node its snapshot on the first request that
// names it; everything else is a no-op.
type baselineCallbacks struct{ b *baselineCP }

func (baselineCallbacks) OnStreamOpen(context.Context, int64, string) error { return nil }
func (baselineCallbacks) OnStreamClosed(int64, *corev3.Node)                {}
func (c baselineCallbacks) OnStreamRequest(_ int64, req *discoveryv3.DiscoveryRequest) error {
	return c.b.ensure(req.GetNode())
}
func (baselineCallbacks) OnStreamResponse(context.Context, int64, *discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse) {
}
func (baselineCallbacks) OnDeltaStreamOpen(context.Context, int64, string) error { return nil }
func (baselineCallbacks) OnDeltaStreamClosed(int64, *corev3.Node)                {}
func (c baselineCallbacks) OnStreamDeltaRequest(_ int64, req *discoveryv3.DeltaDiscoveryRequest) error {
	return c.b.ensure(req.GetNode())
}
func (baselineCallbacks) OnStreamDeltaResponse(int64, *discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse) {
}
