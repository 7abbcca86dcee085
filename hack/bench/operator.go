package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/scopeplane/scopeplane/controllers/status"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// serveOperator is the control-plane process of a world cell: scopeplane as
// main.go runs it (a controller-runtime manager with the control plane's
// cache options, reconcilers, builder, ADS server and status writer) against
// the API server of kubeconfig, with plaintext xDS and anonymous proxies, as
// the bench's proxies are. It prints "ready <addr>" once ADS listens and
// answers the commands of serveMain (no events: the driver writes those to
// the API server) and
//
//	phases   answers "phases <listed> <reconciled> <built>": nanoseconds
//	         from this process's start until the informer caches had listed
//	         every kind (the Service caches, those of the namespaces the
//	         scopes reach), every listed object was reconciled, and the first
//	         snapshots were built (0: not yet)
//	peaks    answers "peaks <phase>:<sample> ...": per phase of the process's
//	         life (list, reconcile, build, serve, then what "phase" named), the
//	         sample of its highest resident set (peakWatch)
//	phase <name>  names the phase from now on (the driver's events); answers "ok"
//
// With heapprofiles, it writes heap profiles at the ends of the start's
// phases and at its highest resident set (see serveMain's -heapprofiles).
//
// With shards above 1 it is shard shardIndex of them; the others' addresses
// are names that do not resolve, for the refusals to name.
func serveOperator(kubeconfig, addr string, protocol model.Protocol, shards, shardIndex int, cpuprofile, heapprofiles string) error {
	start := time.Now()
	// A heap sample every 64 KiB rather than 512 KiB, so that the heap
	// profile splits even a small world into its layers.
	runtime.MemProfileRate = 64 << 10
	cmd := &commander{}
	if cpuprofile != "" {
		if err := cmd.startProfile(cpuprofile); err != nil {
			return err
		}
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("-addr %q: the benchmark serves on loopback only", addr)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// main.go's defaults (--kube-api-qps, --kube-api-burst); the status
	// writes keep theirs (--status-writes-per-second, -burst).
	cfg.QPS, cfg.Burst = 2*status.DefaultWritesPerSecond, 2*status.DefaultWritesBurst
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Cache:                  controlplane.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	var sh shard.Shards
	if shards > 1 {
		sh.Index = shardIndex
		for i := range shards {
			a := fmt.Sprintf("shard-%d.bench.invalid:18000", i)
			if i == shardIndex {
				a = lis.Addr().String()
			}
			sh.Addresses = append(sh.Addresses, a)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, err := controlplane.Setup(ctx, mgr, controlplane.Options{
		Shards:           sh,
		XDSListener:      lis,
		XDSServerAddress: lis.Addr().String(),
		CoalesceWindow:   churnWindow,
		Server: server.Options{
			Authenticator:  &auth.Authenticator{AllowAnonymous: true},
			MaxConnections: 1 << 20, MaxConnectionsPerPeer: 1 << 20, MaxStreamsPerClient: 1 << 20,
			NewConnectionsPerPeerPerSecond: server.DefaultOptions.NewConnectionsPerSecond, NewConnectionsPerPeerBurst: server.DefaultOptions.NewConnectionsBurst,
		},
		TLS: controlplane.TLS{Insecure: true},
	})
	if err != nil {
		return err
	}
	var listed, reconciled, built atomic.Int64
	var named atomic.Pointer[string]
	heapAt := func(what string) {
		if heapprofiles != "" {
			_ = writeHeapProfile(heapprofiles + "." + what + ".heap.pprof")
		}
	}
	since := func(v *atomic.Int64, what string) {
		v.Store(int64(time.Since(start)))
		heapAt(what)
	}
	phase := func() string {
		switch {
		case named.Load() != nil:
			return *named.Load()
		case listed.Load() == 0:
			return "list"
		case reconciled.Load() == 0:
			return "reconcile"
		case built.Load() == 0:
			return "build"
		}
		return "serve"
	}
	var profiled int64 // the resident set at the last peak profile
	watch := newPeakWatch(start, phase, func(s peakSample) {
		if s.RSS >= 1<<30 && s.RSS >= profiled+64<<20 {
			profiled = s.RSS
			heapAt("peak")
		}
	})
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go watch.run(stopWatch)
	go func() {
		// The lists: the manager's cache, then the Service caches of the
		// namespaces the scopes reach, known once the scopes are
		// reconciled (every namespace's at once, unsharded).
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return
		}
		select {
		case <-cp.Sync.Reconciled():
		case <-ctx.Done():
			return
		}
		if cp.Services.WaitListed(ctx) {
			since(&listed, "listed")
		}
	}()
	go func() {
		select {
		case <-cp.Sync.Synced():
			since(&reconciled, "reconciled")
		case <-ctx.Done():
			return
		}
		select {
		case <-cp.Builder.Built():
			since(&built, "built")
		case <-ctx.Done():
		}
	}()
	managed := make(chan error, 1)
	go func() { managed <- mgr.Start(ctx) }()

	_, types := typesOf(protocol)
	sp := &scopeplaneCP{Pipeline: cp.Pipeline, types: types}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "ready %s\n", lis.Addr())
	_ = out.Flush()
	phases := func() string {
		return fmt.Sprintf("phases %d %d %d", listed.Load(), reconciled.Load(), built.Load())
	}
	setPhase := func(name string) { named.Store(&name) }
	return cmd.loop(operatorCP{sp, phases, watch, setPhase}, nil, out, managed, func() error {
		cancel()
		select {
		case err := <-managed:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("the manager did not stop within 5s")
		}
	})
}

// operatorCP is the operator seen as the bench's control plane: its
// pipeline's counts, and the phases of its start.
type operatorCP struct {
	*scopeplaneCP
	phases   func() string
	peaks    fmt.Stringer
	setPhase func(string)
}

// Apply is never called: the driver changes the world through the API server.
func (operatorCP) Apply(Change) {}

// answer answers the commands only the operator knows.
func (o operatorCP) answer(cmd string) (string, bool) {
	name, arg, _ := strings.Cut(strings.TrimSpace(cmd), " ")
	switch name {
	case "phases":
		return o.phases(), true
	case "peaks":
		return o.peaks.String(), true
	case "phase":
		o.setPhase(arg)
		return "ok", true
	}
	return "", false
}
