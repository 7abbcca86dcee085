// Package controlplane wires the pipeline into a controller-runtime manager:
// reconcilers → catalog → snapshot builder → ADS server, with feedback from
// the proxies. main, the demo and the end-to-end tests all run it this way.
package controlplane

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/scopeplane/scopeplane/controllers"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/controllers/status"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
)

// Options configure the control plane.
type Options struct {
	// XDSListener is where ADS is served; XDSAddress is used when it is nil.
	XDSListener net.Listener
	XDSAddress  string
	// CoalesceWindow is how long the builder waits after a change for more
	// changes before it versions them as one revision.
	CoalesceWindow time.Duration
	Server         server.Options
	// XDSServerAddress is the host:port written into bootstrap ConfigMaps:
	// how proxies reach this control plane (its Service, in a cluster).
	XDSServerAddress string
	// StatusWindow coalesces changes into status writes, per burst.
	StatusWindow time.Duration
}

// CacheOptions restricts the manager's cache to what the control plane
// reads: of ConfigMaps, only those it writes.
func CacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{bootstrapconfig.ManagedByLabel: bootstrapconfig.ManagedBy})},
	}}
}

// ControlPlane is the running pipeline, fed by the reconcilers.
type ControlPlane struct {
	*pipeline.Pipeline
	Sync *controllers.InitialSync
	opts Options
}

// Setup adds the whole pipeline to mgr. Every part runs on every replica,
// except what writes to the API (status, bootstrap ConfigMaps): leader
// election decides only who writes. mgr should be built with CacheOptions.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) (*ControlPlane, error) {
	cp := &ControlPlane{
		Pipeline: pipeline.New(pipeline.Options{CoalesceWindow: opts.CoalesceWindow, Server: opts.Server}),
		opts:     opts,
	}
	var err error
	if cp.Sync, err = controllers.Setup(ctx, mgr, cp.Catalog); err != nil {
		return nil, err
	}
	if err := (&bootstrapconfig.Reconciler{Client: mgr.GetClient(), XDSServer: opts.XDSServerAddress}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if opts.StatusWindow <= 0 {
		opts.StatusWindow = 200 * time.Millisecond
	}
	if err := (&status.Reconciler{
		Client: mgr.GetClient(), Store: cp.Store, Feedback: cp.Feedback,
		Recorder: mgr.GetEventRecorder("scopeplane"), Window: opts.StatusWindow,
	}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	for _, r := range []manager.Runnable{
		everyReplica(func(ctx context.Context) error { return cp.Run(ctx, cp.Sync.Synced()) }),
		everyReplica(cp.serve),
	} {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("first-build", cp.Ready); err != nil {
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) serve(ctx context.Context) error {
	if cp.opts.XDSListener != nil {
		return cp.Server.ServeListener(ctx, cp.opts.XDSListener)
	}
	return cp.Server.Serve(ctx, cp.opts.XDSAddress)
}

// Ready is the readiness check: it passes once every object listed at cache
// sync was reconciled and the snapshots were built from them, so a replica
// never takes traffic with a partial configuration.
func (cp *ControlPlane) Ready(req *http.Request) error {
	if err := cp.Sync.Check(req); err != nil {
		return err
	}
	select {
	case <-cp.Builder.Built():
		return nil
	default:
		return errors.New("the first snapshot build has not finished")
	}
}

// everyReplica is a Runnable that runs whether or not this replica leads.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }

func (everyReplica) NeedLeaderElection() bool { return false }
