// Package pipeline assembles the Kubernetes-free part of scopeplane in one
// place: catalog → snapshot builder → store → ADS server, with the proxies'
// feedback and the status service (CSDS) that reports it. The operator
// (internal/controlplane) feeds its catalog from reconcilers; the
// conformance tests, the server's model-based tests and the benchmark feed
// it directly. All of them build it here, so they test the
// wiring that runs in production.
package pipeline

import (
	"context"
	"time"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// Options configure a pipeline.
type Options struct {
	// CoalesceWindow is how long the builder waits after a change for more
	// changes before it versions them as one revision (Run only).
	CoalesceWindow time.Duration
	// Server bounds what one proxy can make the ADS server do.
	Server server.Options
	// CostBucket is the width of one bucket of the scopes' cost window
	// (feedback.DefaultCostBucket when zero).
	CostBucket time.Duration
}

// Pipeline is one control plane's data path.
type Pipeline struct {
	Catalog  *catalog.Catalog
	Store    *snapshot.Store
	Builder  *snapshot.Builder
	Feedback *feedback.Tracker
	Server   *server.Server
	// Status is the Client Status Discovery Service over the same state.
	Status *csds.Server
}

// New returns an empty pipeline.
func New(opts Options) *Pipeline {
	p := &Pipeline{Catalog: catalog.New(), Store: snapshot.NewStore(), Feedback: feedback.New(opts.CostBucket)}
	p.Catalog.SetBackendGrace(catalog.DefaultBackendGrace)
	p.Catalog.SetRouteWarmUp(catalog.DefaultRouteWarmUp)
	p.Builder = snapshot.NewBuilder(p.Catalog, p.Store, opts.CoalesceWindow)
	p.Server = server.New(p.Store, p.Feedback, p.Builder.Built(), opts.Server)
	p.Status = csds.New(p.Store, p.Feedback)
	return p
}

// Run versions the catalog's changes until ctx ends, coalescing them for
// the window; synced is closed once the catalog holds the whole world, and
// the first build after it closes Builder.Built.
func (p *Pipeline) Run(ctx context.Context, synced <-chan struct{}) error {
	return p.Builder.Run(ctx, synced)
}

// Sync versions every change recorded so far, at once: the store is
// current when it returns. Tests use it instead of Run to know when a change
// is served; what the catalog holds then is the whole world, so the first
// Sync makes the server ready.
func (p *Pipeline) Sync() { p.Builder.ApplyWhole(p.Catalog.Take()) }
