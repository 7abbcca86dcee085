// Package controlplane wires the pipeline into a controller-runtime manager:
// reconcilers → catalog → snapshot builder → ADS server, with feedback from
// the proxies. main, the demo and the end-to-end tests all run it this way.
package controlplane

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/controllers/nodezones"
	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
	"github.com/scopeplane/scopeplane/controllers/routestatus"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/controllers/shardwatch"
	"github.com/scopeplane/scopeplane/controllers/status"
	"github.com/scopeplane/scopeplane/controllers/tokenbindings"
	"github.com/scopeplane/scopeplane/internal/apiwatch"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/xdstls"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/translate"
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
	// With shards, each scope's bootstrap names its slot's address from
	// Shards instead.
	XDSServerAddress string
	// Shards divides the scopes among shards of replicas
	// (docs/sharding.md): this replica translates and serves the scopes of
	// its shard only, refuses the others' proxies with their slot's
	// address, and its shard elects a leader of its own (shard 0 for
	// LeaderElection.ID's Lease, shard K for "<ID>-shard-K"), which writes
	// the status and bootstrap ConfigMaps of the shard's scopes. Shard 0's
	// leader also writes the routes' status, and marks the scopes of a
	// shard whose Lease went unrenewed for ShardAbsentAfter
	// (shardwatch.DefaultAfter when zero) Ready=False, ShardAbsent. The
	// zero value is one shard.
	Shards           shard.Shards
	ShardAbsentAfter time.Duration
	// StatusWindow coalesces changes into status writes, per burst.
	StatusWindow time.Duration
	// StatusWrites paces the leader's status patches.
	StatusWrites StatusWrites
	// CostBucket is the width of one of the 60 buckets of status.cost's
	// rolling window (a minute when zero).
	CostBucket time.Duration
	// AdminListener is where CSDS (proxy status and config dumps) is
	// served; AdminAddress is used when it is nil, and neither disables it.
	// It must be a loopback address (see CheckAdminAddress).
	AdminListener net.Listener
	AdminAddress  string
	// NoBootstrapConfigMaps turns the bootstrap ConfigMaps off: no
	// ConfigMap of the scopes' namespaces is read or written, so the
	// control plane needs no cluster-wide access to ConfigMaps (RBAC cannot
	// narrow ConfigMap writes to the bootstrap names, which are not known
	// before the scopes exist). The replicas' feedback ConfigMaps, under
	// leader election, stay in Replica.Namespace.
	NoBootstrapConfigMaps bool
	// BootstrapNamespaces, when not empty, are the only namespaces whose
	// scopes get a bootstrap ConfigMap: the control plane then reads and
	// writes ConfigMaps of these namespaces only (build the manager with
	// CacheOptions of the same list), so that RBAC can grant ConfigMap
	// access namespace by namespace instead of cluster-wide. Scopes of
	// other namespaces are served, but their status names no ConfigMap.
	BootstrapNamespaces []string
	// LeaderElection decides which replica writes to the API.
	LeaderElection LeaderElection
	// Replica names this replica to the others. Under leader election
	// every replica publishes its proxies' feedback in a ConfigMap of
	// Replica.Namespace (LeaderElection.Namespace when empty), and the
	// leader's status counts every replica's proxies; Name is required
	// then, and unique among the replicas.
	Replica replicafeedback.Replica
	// BootstrapMountPath is where pods mount their bootstrap ConfigMap
	// (bootstrap.MountPath when empty): the bootstraps name the CA file
	// in it.
	BootstrapMountPath string
	// TLS is the xDS port's TLS.
	TLS TLS
	// CrossNamespace says whether selections of other namespaces' Services
	// need their consent (ReferenceGrants; the zero value) or not, and
	// likewise routes' backends in other namespaces.
	CrossNamespace catalog.CrossNamespace
	// RouteControllerName names the status.parents entries the leader
	// writes on mesh routes (routestatus.DefaultControllerName when
	// empty).
	RouteControllerName string
}

// StatusWrites is the pace of the leader's status patches: PerSecond a
// second (status.DefaultWritesPerSecond when zero), Burst at once
// (status.DefaultWritesBurst when zero). One pace serves every term, so a
// quick change of leaders does not restart the burst.
type StatusWrites struct {
	PerSecond float64
	Burst     int
}

// TLS configures the xDS port's TLS, on unless Insecure. The serving
// certificate comes from Dir when set (a mounted Secret: tls.crt, tls.key,
// ca.crt, reloaded when they change), otherwise from a CA scopeplane keeps
// in Secret, which the leader creates and renews (package xdstls).
type TLS struct {
	// Insecure serves xDS in plaintext: anyone who can reach the port can
	// read and alter what proxies get, and no proxy can be authenticated
	// by certificate.
	Insecure bool
	Dir      string
	Secret   types.NamespacedName
	// Refresh is how often the self-managed Secret is read again (and
	// renewed, on the leader); a minute when zero.
	Refresh time.Duration
}

// MetricsOptions serves the metrics endpoint on addr. When secure, it is
// served over HTTPS (with a self-signed certificate made at start: the
// connection is encrypted, the scraper cannot verify it) and every request must carry a bearer token the API server
// authenticates (TokenReview) for an identity allowed to get the
// non-resource URL /metrics (SubjectAccessReview): 401 without a valid
// token, 429 past the pace of reviews of unknown tokens, 403 without the
// permission (see metricsFilter). It speaks HTTP/1.1 only, which
// Prometheus uses, so that HTTP/2's stream-reset attacks do not apply.
// Otherwise it is plain, unauthenticated HTTP.
func MetricsOptions(addr string, secure bool) metricsserver.Options {
	if !secure {
		return metricsserver.Options{BindAddress: addr}
	}
	return metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: metricsFilter,
		TLSOpts:        []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
}

// CheckAdminAddress refuses an admin address that is not on a loopback
// interface: the admin service is unauthenticated and shows every scope's
// configuration, so it is reached through kubectl port-forward only.
func CheckAdminAddress(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("admin address %q is not a loopback address: the admin service is unauthenticated and shows every scope's configuration; bind it to 127.0.0.1 and reach it with kubectl port-forward", addr)
	}
	return nil
}

// CacheOptions restricts the manager's cache to what the control plane
// reads: of ConfigMaps, only those it writes, and with bootstrapNamespaces
// (Options.BootstrapNamespaces) only those of these namespaces, so that it
// watches ConfigMaps with namespaced rights alone. Of each object it keeps
// only what is read (see ServiceCacheOptions), Pods as the peer-address
// method reads them (stripPod). Services and EndpointSlices are read from
// caches of their own (controllers/servicecache), built from
// ServiceCacheOptions.
func CacheOptions(bootstrapNamespaces ...string) cache.Options {
	configMaps := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{bootstrapconfig.ManagedByLabel: bootstrapconfig.ManagedBy}), Transform: trimMeta}
	if len(bootstrapNamespaces) > 0 {
		configMaps.Namespaces = map[string]cache.Config{}
		for _, ns := range bootstrapNamespaces {
			configMaps.Namespaces[ns] = cache.Config{}
		}
	}
	o := ServiceCacheOptions()
	o.ByObject[&corev1.ConfigMap{}] = configMaps
	// Pods are cached, with their address indexes, only for the
	// peer-address method (newPodIndex), and then only the fields it
	// reads.
	o.ByObject[&corev1.Pod{}] = cache.ByObject{Transform: stripPod}
	return o
}

// ServiceCacheOptions are the Service caches' options: of each object they
// keep only what is read, no managed fields and no last-applied annotation
// (trimMeta), Services and EndpointSlices as the converter reads them
// (stripService, stripEndpointSlice). Their informers ride out API server
// outages and report their data's age (package apiwatch).
func ServiceCacheOptions() cache.Options {
	return cache.Options{
		// A transform of ByObject replaces DefaultTransform for its kind.
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Service{}:            {Transform: stripService},
			&discoveryv1.EndpointSlice{}: {Transform: stripEndpointSlice},
		},
		DefaultTransform: trimMeta,
		NewInformer:      apiwatch.NewInformer(scheme.Scheme),
	}
}

// ControlPlane is the running pipeline, fed by the reconcilers.
type ControlPlane struct {
	*pipeline.Pipeline
	Sync *controllers.InitialSync
	// Services are the Service and EndpointSlice caches.
	Services *servicecache.Caches
	// XDSTLS is the xDS port's TLS configuration, nil when plaintext: it
	// requests (never requires or verifies) a client certificate, which
	// the ADS handler may verify itself.
	XDSTLS *tls.Config
	// Certificates is the serving certificate and CA bundle in use, nil
	// when plaintext.
	Certificates *xdstls.Certificates
	// Replicas is the other replicas' feedback as this replica collects
	// it (nil without leader election): which of them its status would
	// count now.
	Replicas *replicafeedback.Collector
	opts     Options
	elector  *elector
	// feedbackNamespace holds the replicas' feedback ConfigMaps.
	feedbackNamespace string
}

// Leading reports whether this replica runs the leader-only work (status,
// bootstrap ConfigMaps) now.
func (cp *ControlPlane) Leading() bool { return cp.elector.Leading() }

// Setup adds the whole pipeline to mgr. Every part runs on every replica,
// except what writes to the API (status, bootstrap ConfigMaps): leader
// election (opts.LeaderElection) decides only who writes. mgr should be
// built with CacheOptions and without controller-runtime's leader
// election: losing the Lease then stops only the writing, never the
// manager and the ADS streams it serves.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) (*ControlPlane, error) {
	started := time.Now()
	if err := opts.Shards.Check(); err != nil {
		return nil, fmt.Errorf("shards: %w", err)
	}
	// Shard 0 campaigns for the unsharded Lease, so that when the count
	// changes from one, the unsharded leader and shard 0's never lead at
	// once.
	baseLease := cmp.Or(opts.LeaderElection.ID, LeaseName)
	shardLease := func(k int) string {
		if k == 0 {
			return baseLease
		}
		return fmt.Sprintf("%s-shard-%d", baseLease, k)
	}
	opts.LeaderElection.ID = shardLease(opts.Shards.Index)
	opts.Server.Shards = opts.Shards
	if a := opts.Server.Authenticator; a != nil && a.PeerAddress && opts.Shards.Sharded() {
		opts.Server.OtherShardsAdmit = otherShardsAdmit(mgr.GetCache(), opts.Shards)
	}
	metrics.SetShard(opts.Shards.Index, opts.Shards.Count())
	if opts.Server.Zones == nil {
		zones, err := nodezones.New(ctx, mgr.GetCache())
		if err != nil {
			return nil, err
		}
		opts.Server.Zones = zones
	}
	if a := opts.Server.Authenticator; a != nil && a.Tokens != nil && a.Bindings == nil {
		b, err := tokenbindings.New(ctx, mgr.GetCache())
		if err != nil {
			return nil, err
		}
		a.Bindings = b
	}
	if a := opts.Server.Authenticator; a != nil && a.PeerAddress && a.Pods == nil {
		pods, err := newPodIndex(ctx, mgr.GetCache())
		if err != nil {
			return nil, err
		}
		a.Pods = pods
	}
	cp := &ControlPlane{
		Pipeline: pipeline.New(pipeline.Options{CoalesceWindow: opts.CoalesceWindow, Server: opts.Server, CostBucket: opts.CostBucket}),
		opts:     opts,
	}
	opts.RouteControllerName = cmp.Or(opts.RouteControllerName, routestatus.DefaultControllerName)
	if err := routestatus.CheckControllerName(opts.RouteControllerName); err != nil {
		return nil, err
	}
	// Unsharded, one cache holds every namespace's Services; a shard's
	// replica watches the namespaces its scopes reach (shard 0's, those
	// the routes name too: it writes their status), and the builder
	// versions no change before the namespaces it reaches are listed.
	newCache := servicecache.ForManager(mgr, ServiceCacheOptions())
	if log := ctrl.Log.WithName("service-cache"); opts.Shards.Sharded() {
		writesRoutes := opts.Shards.Index == 0
		cp.Services = servicecache.NewSharded(newCache, func() ([]string, uint64) { return cp.Catalog.Reach(writesRoutes) },
			cp.Catalog.ReachVersion, cp.Catalog.ReachChanged(), log)
		cp.Builder.SetHold(cp.Services.Hold)
	} else {
		cp.Services = servicecache.New(newCache, log)
	}
	var err error
	if cp.Sync, err = controllers.Setup(ctx, mgr, cp.Catalog, opts.CrossNamespace, opts.Shards, cp.Services); err != nil {
		return nil, err
	}
	routeKinds := cp.Sync.RouteKinds()
	if err := routestatus.Index(ctx, mgr.GetFieldIndexer(), routeKinds); err != nil {
		return nil, err
	}
	routeConsent := routestatus.Consent{
		Allow:       opts.CrossNamespace == catalog.CrossNamespaceAllow,
		Unavailable: opts.CrossNamespace == catalog.CrossNamespaceGrant && !cp.Sync.GrantsWatched(),
	}
	var runTLS func(context.Context) error
	if !opts.TLS.Insecure {
		if runTLS, err = cp.setupTLS(mgr); err != nil {
			return nil, err
		}
	}
	writes, err := status.NewWriteLimiter(cmp.Or(opts.StatusWrites.PerSecond, status.DefaultWritesPerSecond), cmp.Or(opts.StatusWrites.Burst, status.DefaultWritesBurst))
	if err != nil {
		return nil, err
	}
	conflicts := bootstrapconfig.NewConflicts()
	if opts.StatusWindow <= 0 {
		opts.StatusWindow = 200 * time.Millisecond
	}
	recorder := mgr.GetEventRecorder("scopeplane")
	var replicas status.Replicas
	if opts.LeaderElection.Enabled {
		if replicas, err = cp.setupReplicaFeedback(mgr); err != nil {
			return nil, err
		}
	}
	// What writes to the API runs on the leader only, built anew for each
	// term (see elector).
	leaderOnly := func(m manager.Manager) error {
		if !opts.NoBootstrapConfigMaps {
			r := &bootstrapconfig.Reconciler{Client: m.GetClient(), APIReader: m.GetAPIReader(), XDSServer: opts.XDSServerAddress, Shards: opts.Shards, Started: started, Recorder: recorder,
				Conflicts: conflicts, MountPath: opts.BootstrapMountPath, Namespaces: opts.BootstrapNamespaces}
			if cp.Certificates != nil {
				r.CA = cp.Certificates
			}
			// The bootstraps present what the server accepts.
			if a := opts.Server.Authenticator; a != nil {
				r.Token = a.Tokens != nil
				if a.SPIFFE != nil {
					r.SPIFFEDir = bootstrap.SPIFFEDir
				}
			}
			if err := r.SetupWithManager(m); err != nil {
				return err
			}
		}
		// The routes' entries are written at the scopes' status pace,
		// from the same limiter, by one shard: they are computed from the
		// routes, which every shard reads whole, and the Services they
		// name, which shard 0 watches for that.
		routeWriters := routeKinds
		if opts.Shards.Index != 0 {
			routeWriters = nil
		}
		for _, k := range routeWriters {
			if err := (&routestatus.Reconciler{
				Kind: k, Client: m.GetClient(), APIReader: m.GetAPIReader(), Services: cp.Services, ControllerName: opts.RouteControllerName, Consent: routeConsent,
				Kinds: routeKinds, Grants: cp.Sync.GrantsWatched(), Omissions: translate.ProxylessOmissions, Invalid: translate.InvalidEntries, Writes: writes, Workers: status.Workers(float64(writes.Limit())),
			}).SetupWithManager(m); err != nil {
				return err
			}
		}
		// Shard 0's leader tells the scopes of a shard without one.
		if opts.Shards.Sharded() && opts.Shards.Index == 0 && cp.elector.lock != nil {
			if err := m.Add(&shardwatch.Watcher{
				Client: m.GetClient(), APIReader: m.GetAPIReader(), Namespace: cp.elector.leaseNamespace(), Lease: shardLease, Feedback: cp.feedbackNamespace,
				Shards: opts.Shards, After: opts.ShardAbsentAfter, Writes: writes, Recorder: recorder, Log: ctrl.Log.WithName("shard-watch"),
			}); err != nil {
				return err
			}
		}
		return (&status.Reconciler{
			Client: m.GetClient(), Store: cp.Store, Feedback: cp.Feedback, Replicas: replicas, Bootstrap: conflicts, NoBootstrapConfigMaps: opts.NoBootstrapConfigMaps,
			BootstrapNamespaces: opts.BootstrapNamespaces, Recorder: recorder, Window: opts.StatusWindow, Writes: writes, Built: cp.Builder.Built(), Shards: opts.Shards,
		}).SetupWithManager(m)
	}
	if cp.elector, err = newElector(mgr, opts.LeaderElection, leaderOnly); err != nil {
		return nil, err
	}
	for _, r := range []manager.Runnable{
		everyReplica(func(ctx context.Context) error { return cp.Run(ctx, cp.Sync.Synced()) }),
		everyReplica(cp.serve),
		everyReplica(cp.serveAdmin),
		cp.elector,
	} {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	if runTLS != nil {
		if err := mgr.Add(everyReplica(runTLS)); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("xds-certificate", func(*http.Request) error { return cp.Certificates.Loaded() }); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("first-build", cp.Ready); err != nil {
		return nil, err
	}
	return cp, nil
}

// setupReplicaFeedback publishes this replica's feedback and collects the
// others' for the leader's status.
func (cp *ControlPlane) setupReplicaFeedback(mgr ctrl.Manager) (*replicafeedback.Collector, error) {
	r := cp.opts.Replica
	r.Namespace = cmp.Or(r.Namespace, cp.opts.LeaderElection.Namespace)
	if cp.opts.Shards.Sharded() {
		r.Shard, r.Shards = strconv.Itoa(cp.opts.Shards.Index), strconv.Itoa(cp.opts.Shards.Count())
	}
	cp.feedbackNamespace = r.Namespace
	if r.Name == "" || r.Namespace == "" {
		return nil, errors.New("replica feedback: with leader election every replica needs a name, unique among them, and the namespace of its feedback ConfigMap")
	}
	if errs := validation.IsDNS1123Subdomain(replicafeedback.ConfigMapName(r.Name)); len(errs) > 0 {
		return nil, fmt.Errorf("replica name %q: %s", r.Name, strings.Join(errs, "; "))
	}
	log := ctrl.Log.WithName("replica-feedback")
	col, err := replicafeedback.NewCollector(mgr, r, log)
	if err != nil {
		return nil, err
	}
	cp.Replicas = col
	return col, mgr.Add(&replicafeedback.Publisher{Client: mgr.GetClient(), Feedback: cp.Feedback, Replica: r, Log: log})
}

// setupTLS makes the xDS port's certificate store and returns what keeps
// it current on every replica: the watch of the TLS directory, or the
// self-managed CA's Secret (renewed by the leader, read by all).
func (cp *ControlPlane) setupTLS(mgr ctrl.Manager) (func(context.Context) error, error) {
	cp.Certificates = xdstls.NewCertificates()
	cp.XDSTLS = cp.Certificates.ServerConfig()
	log := ctrl.Log.WithName("xds-tls")
	t := cp.opts.TLS
	if t.Dir != "" {
		return func(ctx context.Context) error { return xdstls.WatchDir(ctx, t.Dir, cp.Certificates, log) }, nil
	}
	if t.Secret.Name == "" || t.Secret.Namespace == "" {
		return nil, errors.New("xDS TLS: name a directory holding the certificate, or the Secret (name and namespace) of the self-managed CA; or serve plaintext explicitly")
	}
	// One certificate serves every shard: it names every slot's address.
	addrs := []string{cp.opts.XDSServerAddress}
	if cp.opts.Shards.Sharded() {
		addrs = cp.opts.Shards.Addresses
	}
	var (
		dns []string
		ips []net.IP
	)
	for _, a := range addrs {
		d, i, err := xdstls.ServingNames(a)
		if err != nil {
			return nil, fmt.Errorf("xDS TLS: the serving certificate's names: %w", err)
		}
		dns, ips = append(dns, d...), append(ips, i...)
	}
	ss := &xdstls.SelfSigned{Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), Secret: t.Secret, DNSNames: dns, IPs: ips}
	refresh := cmp.Or(t.Refresh, time.Minute)
	// Every shard's leader keeps the one Secret: each asks for every
	// shard's names, and re-issues only a certificate that lacks one, so
	// they agree (and leaders of two shard counts, during a change,
	// converge on both counts' names).
	return func(ctx context.Context) error { return ss.Run(ctx, cp.Certificates, cp.Leading, refresh, log) }, nil
}

func (cp *ControlPlane) serve(ctx context.Context) error {
	var extra []grpc.ServerOption
	if cp.XDSTLS != nil {
		extra = append(extra, grpc.Creds(credentials.NewTLS(cp.XDSTLS)))
	}
	if cp.opts.XDSListener != nil {
		return cp.Server.ServeListener(ctx, cp.opts.XDSListener, extra...)
	}
	return cp.Server.Serve(ctx, cp.opts.XDSAddress, extra...)
}

func (cp *ControlPlane) serveAdmin(ctx context.Context) error {
	lis := cp.opts.AdminListener
	if lis == nil {
		if cp.opts.AdminAddress == "" {
			return nil
		}
		if err := CheckAdminAddress(cp.opts.AdminAddress); err != nil {
			return err
		}
		var err error
		if lis, err = net.Listen("tcp", cp.opts.AdminAddress); err != nil {
			return fmt.Errorf("admin listener: %w", err)
		}
	}
	return cp.Status.ServeListener(ctx, lis)
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

// otherShardsAdmit reports whether a ProxyScope of another shard than
// shards', read from the cache, which holds every shard's, admits id by its
// peer address. It reads the cache's objects in place: it runs for streams
// that no scope of this replica admits, and copies nothing per stream.
func otherShardsAdmit(reader client.Reader, shards shard.Shards) func(*auth.Identity) bool {
	return func(id *auth.Identity) bool {
		if id.Namespace == "" {
			return false
		}
		list := &xdsv1alpha1.ProxyScopeList{}
		if err := reader.List(context.Background(), list, client.InNamespace(id.Namespace), client.UnsafeDisableDeepCopy); err != nil {
			return false
		}
		for i := range list.Items {
			ps := &list.Items[i]
			if !ps.Spec.AdmitByPeerAddress || shards.Owns(model.Key{Namespace: ps.Namespace, Name: ps.Name}) {
				continue
			}
			proxies := make([]string, len(ps.Spec.Proxies))
			for j, sa := range ps.Spec.Proxies {
				proxies[j] = string(sa)
			}
			if auth.Admits(id, ps.Namespace, proxies, true) {
				return true
			}
		}
		return false
	}
}

// everyReplica is a Runnable that runs whether or not this replica leads.
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }

func (everyReplica) NeedLeaderElection() bool { return false }
