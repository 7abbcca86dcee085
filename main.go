// Command scopeplane is a Kubernetes operator that is an Envoy xDS control
// plane: it turns Services, EndpointSlices and ProxyScopes into one scoped
// snapshot per ProxyScope and serves it over ADS.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	clientconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/scopeplane/scopeplane/controllers/replicafeedback"
	"github.com/scopeplane/scopeplane/controllers/routestatus"
	"github.com/scopeplane/scopeplane/controllers/status"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// version is the binary's version, set at build time from the Helm chart's
// appVersion (make build, the Dockerfile), so the chart and the binary agree.
var version = "dev"

// config is the command line.
type config struct {
	metricsAddr   string
	metricsSecure bool
	bootstrapCMs  bool
	bootstrapNS   []string
	probeAddr     string
	leaderElect   bool
	leaderNS      string
	replicaName   string
	xdsAddr       string
	xdsServer     string
	shards, shard int
	window        time.Duration
	costBucket    time.Duration
	metricsScopes string
	adminAddr     string
	pprofAddr     string
	showVersion   bool
	xdsInsecure   bool
	xdsTLSDir     string
	xdsTLSSecret  string
	xdsTLSNS      string
	crossNS       catalog.CrossNamespace
	routeCtrlName string
	statusWrites  controlplane.StatusWrites
	kubeQPS       float64
	kubeBurst     int
	limits        server.Options
	auth          auth.Config
	zap           zap.Options
}

// bindFlags defines every flag on fs: main's command line, and the flags
// reference in docs/flags.md, which a test renders from the same set.
func bindFlags(fs *flag.FlagSet) *config {
	c := &config{}
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.StringVar(&c.metricsScopes, "metrics-scope-labels", string(metrics.ScopeLabelsAll), "What the scope label of the per-scope series holds: all (each series labelled with its ProxyScope, about 35 series per scope served) or none (every scope folded into one series per type and protocol, labelled scope=\"*\", and scopeplane_scope_condition kept only for unhealthy conditions). none is the setting past a few hundred scopes: 10,000 scopes take 350,000 series with all (docs/metrics.md).")
	fs.BoolVar(&c.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS (a self-signed certificate) to callers whose bearer token the API server authenticates and authorizes for get on the non-resource URL /metrics (TokenReview, SubjectAccessReview); false serves plain, unauthenticated HTTP.")
	fs.BoolVar(&c.bootstrapCMs, "bootstrap-configmaps", true, "Write each ProxyScope's bootstrap ConfigMap (an Envoy and a gRPC xDS bootstrap) in its namespace; false writes none and reads no ConfigMaps of the scopes' namespaces, so no cluster-wide ConfigMap access is needed (with --leader-elect, replicas still publish their proxies' feedback in ConfigMaps of the pod's namespace).")
	fs.Func("bootstrap-configmap-namespaces", "Comma-separated namespaces whose ProxyScopes get a bootstrap ConfigMap; empty (the default) means every namespace. With a list, scopeplane reads and writes ConfigMaps of these namespaces only, so it needs ConfigMap access there (namespaced Roles) and none cluster-wide; scopes of other namespaces are served but get no ConfigMap (status.bootstrapConfigMap stays empty).", func(v string) error {
		c.bootstrapNS = nil
		for ns := range strings.SplitSeq(v, ",") {
			if ns = strings.TrimSpace(ns); ns == "" {
				continue
			}
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
			}
			if !slices.Contains(c.bootstrapNS, ns) {
				c.bootstrapNS = append(c.bootstrapNS, ns)
			}
		}
		return nil
	})
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "Address /healthz and /readyz bind to.")
	fs.BoolVar(&c.leaderElect, "leader-elect", false, "Elect a leader among replicas; only the leader writes status (ProxyScopes' and mesh routes'), every replica serves xDS.")
	fs.StringVar(&c.leaderNS, "leader-election-namespace", "", "Namespace of the leader election Lease and of each replica's proxy-feedback ConfigMap, which the leader merges into status (default: the pod's namespace).")
	fs.StringVar(&c.replicaName, "replica-name", "", "This replica's name among the replicas, unique: it names the replica's proxy-feedback ConfigMap (default: $POD_NAME, else the host name). With $POD_UID set, the Pod owns that ConfigMap.")
	fs.StringVar(&c.xdsAddr, "xds-bind-address", ":18000", "Address the ADS gRPC server (SotW and delta) binds to.")
	fs.StringVar(&c.xdsServer, "xds-server-address", "127.0.0.1:18000", "host:port proxies dial to reach this control plane, written into each scope's bootstrap ConfigMap (in a cluster: the xDS Service's DNS name). With --shards N above 1: the addresses of the slots the scopes hash to, comma-separated, slot 0's first, at least N; slot i belongs to shard i mod N (docs/sharding.md).")
	fs.IntVar(&c.shards, "shards", 1, "Shards the ProxyScopes are divided among (docs/sharding.md): each shard is replicas of its own, with its own leader, that translate and serve only the scopes whose slot, a hash of their namespace and name over the addresses of --xds-server-address, is theirs. 1 serves every scope from every replica.")
	fs.IntVar(&c.shard, "shard", 0, "This replica's shard, 0 to --shards minus 1.")
	fs.BoolVar(&c.xdsInsecure, "xds-insecure", false, "Serve xDS in plaintext: anyone who can reach the port can read every scope's configuration and alter what proxies receive, and proxies cannot verify the control plane. Off by default: xDS is served over TLS.")
	fs.StringVar(&c.xdsTLSDir, "xds-tls-dir", "", "Directory holding the xDS serving certificate as tls.crt, tls.key and the CA bundle proxies trust as ca.crt (a mounted Secret, e.g. cert-manager's); reloaded when the files change. Empty: scopeplane keeps its own CA in --xds-tls-secret.")
	fs.StringVar(&c.xdsTLSSecret, "xds-tls-secret", "scopeplane-xds-tls", "Secret of the self-managed xDS CA and serving certificate (used without --xds-tls-dir): the leader creates it when missing and renews it before expiry; every replica serves from it.")
	fs.StringVar(&c.xdsTLSNS, "xds-tls-secret-namespace", "", "Namespace of --xds-tls-secret (default: the pod's namespace).")
	fs.DurationVar(&c.window, "coalesce-window", 10*time.Millisecond, "How long to wait after a change for more changes before pushing them as one version; while changes keep coming, each wait doubles, up to ten times this.")
	fs.DurationVar(&c.costBucket, "cost-bucket", time.Minute, "Width of one of the 60 buckets of each ProxyScope's status.cost window (what was sent, and what the other protocol would have sent): a minute gives the last hour.")
	fs.StringVar(&c.adminAddr, "admin-bind-address", "127.0.0.1:18001", "Loopback address of the admin gRPC service: Envoy's Client Status Discovery Service (proxy status and config dumps, what kubectl scopeplane reads through port-forward); empty disables it.")
	fs.StringVar(&c.pprofAddr, "pprof-bind-address", "", "Address net/http/pprof binds to; empty (the default) disables it.")
	fs.Var(&c.crossNS, "cross-namespace", "How a ProxyScope may select Services of other namespaces: grant serves them only where that namespace holds a Gateway API ReferenceGrant from ProxyScopes of the scope's namespace to Services; allow serves every selection (for single-tenant clusters).")
	fs.StringVar(&c.routeCtrlName, "route-controller-name", routestatus.DefaultControllerName, "Controller name of the status.parents entries the leader writes on HTTPRoutes and GRPCRoutes attached to Services (a domain-prefixed path); entries of other controller names are left as they are.")
	fs.Float64Var(&c.statusWrites.PerSecond, "status-writes-per-second", status.DefaultWritesPerSecond, "ProxyScope status patches the leader sends per second, at most: after a leader starts, every scope whose status is not current is written at this pace (10,000 scopes in under 40 s at the default, with the burst). The status controller runs a worker per 20 writes a second, so that the API server's round trip does not hold the rate lower.")
	fs.IntVar(&c.statusWrites.Burst, "status-writes-burst", status.DefaultWritesBurst, "ProxyScope status patches the leader sends at once above the per-second pace.")
	fs.Float64Var(&c.kubeQPS, "kube-api-qps", defaultKubeQPS, "Requests per second to the API server that each of scopeplane's API clients may send (client-go's limiter: controller-runtime builds a client per resource type, so the ProxyScope status patches have one to themselves); at least --status-writes-per-second, which it would otherwise undercut. A negative value turns client-side limiting off and leaves the pace to the API server's priority and fairness.")
	fs.IntVar(&c.kubeBurst, "kube-api-burst", defaultKubeBurst, "Requests to the API server each API client may send at once above --kube-api-qps; at least --status-writes-burst.")
	fs.BoolVar(&c.showVersion, "version", false, "Print the version and exit.")
	bindLimits(fs, &c.limits)
	bindAuth(fs, &c.auth)
	c.zap.BindFlags(fs)
	// --kubeconfig, which controller-runtime registers on the command line
	// itself (a no-op there), so that the reference lists it too.
	clientconfig.RegisterFlags(fs)
	return c
}

// bindAuth defines the flags of how proxies authenticate to the ADS server;
// docs/bootstrap.md shows the proxy side.
func bindAuth(fs *flag.FlagSet, c *auth.Config) {
	fs.StringVar(&c.Methods, "xds-auth", "token", "Credentials proxies authenticate with, comma-separated: token (a projected ServiceAccount token as gRPC call credentials, verified against the API server's service-account issuer keys, TokenReview as fallback), spiffe (a TLS client certificate with a SPIFFE ID spiffe://<trust-domain>/ns/<namespace>/sa/<name>) and peer-address (no credential: a stream is the ServiceAccount of the one Running Pod holding its source address, admitted only by scopes with spec.admitByPeerAddress; for gRPC clients that cannot send a token, see docs/bootstrap.md; it watches every Pod). A scope admits only ServiceAccounts of its namespace (and of its spec.proxies).")
	fs.StringVar(&c.Audience, "xds-token-audience", auth.DefaultAudience, "Audience a proxy's ServiceAccount token must carry (the projected volume's audience).")
	fs.StringVar(&c.TrustDomain, "xds-spiffe-trust-domain", "cluster.local", "SPIFFE trust domain of proxies' client certificates.")
	fs.StringVar(&c.TrustBundle, "xds-spiffe-trust-bundle", "", "PEM file of the SPIFFE trust domain's CA certificates, read again when it changes; required with --xds-auth=spiffe.")
	fs.DurationVar(&c.MaxTokenLifetime, "xds-max-token-lifetime", auth.DefaultMaxTokenLifetime, "Longest lifetime (exp - iat) of a ServiceAccount token accepted: a projected token lives an hour by default and is renewed by the kubelet; a longer-lived one outlives revocation of anything but its ServiceAccount and Pod.")
	fs.BoolVar(&c.AllowAnonymous, "xds-allow-anonymous", false, "Admit proxies that present no credentials, to any scope they name: gives up knowing who a proxy is and keeping a scope's configuration (its Services and endpoints) to its namespace. Invalid credentials are still refused.")
}

// bindLimits defines the flags of the per-client limits of the ADS server;
// docs/troubleshooting.md gives the reason for each default.
func bindLimits(fs *flag.FlagSet, o *server.Options) {
	d := server.DefaultOptions
	fs.IntVar(&o.MaxRequestBytes, "xds-max-request-bytes", d.MaxRequestBytes, "Largest ADS request accepted, in bytes; a larger one ends the stream with ResourceExhausted.")
	fs.IntVar(&o.MaxNamesPerRequest, "xds-max-names-per-request", d.MaxNamesPerRequest, "Most resource names (subscribed, unsubscribed or claimed) one ADS request may carry.")
	fs.IntVar(&o.ExtraNamesPerType, "xds-extra-names-per-type", d.ExtraNamesPerType, "How many names a stream may subscribe to per type beyond what its scope serves of that type.")
	fs.IntVar(&o.MaxStreamsPerConnection, "xds-max-streams-per-connection", d.MaxStreamsPerConnection, "HTTP/2 MaxConcurrentStreams of the xDS server: ADS streams one connection may have open at once.")
	fs.IntVar(&o.MaxStreamsPerClient, "xds-max-streams-per-client", d.MaxStreamsPerClient, "Most ADS streams one client (an identity at one client IP address) may have open at once on a replica; with --xds-max-request-bytes it bounds the request bytes one client can make the replica hold.")
	fs.DurationVar(&o.FirstRequestTimeout, "xds-first-request-timeout", d.FirstRequestTimeout, "How long a new ADS stream may stay silent before its first request; then it ends with DeadlineExceeded.")
	fs.IntVar(&o.MaxNodeBytes, "xds-max-node-bytes", d.MaxNodeBytes, "Largest xDS node (serialized, metadata included) a stream may present, in bytes.")
	fs.IntVar(&o.MaxNodeIDBytes, "xds-max-node-id-bytes", d.MaxNodeIDBytes, "Longest node.id a stream may present, in bytes.")
	fs.Float64Var(&o.NewStreamsPerSecond, "xds-new-streams-per-second", d.NewStreamsPerSecond, "New authenticated ADS streams this replica accepts per second, from all clients; beyond it (and the burst) streams are refused with ResourceExhausted.")
	fs.IntVar(&o.NewStreamsBurst, "xds-new-streams-burst", d.NewStreamsBurst, "New ADS streams this replica accepts at once above the per-second pace (every proxy reconnecting after a restart).")
	fs.Float64Var(&o.NewConnectionsPerSecond, "xds-new-connections-per-second", d.NewConnectionsPerSecond, "New TCP connections this replica's xDS server accepts per second; beyond it (and the burst) connections are closed before the HTTP/2 handshake.")
	fs.IntVar(&o.NewConnectionsBurst, "xds-new-connections-burst", d.NewConnectionsBurst, "New TCP connections the xDS server accepts at once above the per-second pace (every proxy reconnecting after a restart).")
	fs.Float64Var(&o.NewConnectionsPerPeerPerSecond, "xds-new-connections-per-peer-per-second", d.NewConnectionsPerPeerPerSecond, "New TCP connections the xDS server accepts per second from one client IP address, before the per-replica pace is spent; beyond it (and the burst) they are closed before the HTTP/2 handshake.")
	fs.IntVar(&o.NewConnectionsPerPeerBurst, "xds-new-connections-per-peer-burst", d.NewConnectionsPerPeerBurst, "New TCP connections the xDS server accepts at once from one client IP address above its per-second pace.")
	fs.IntVar(&o.MaxConnections, "xds-max-connections", d.MaxConnections, "Most xDS connections open at once on this replica (each holds ~14 KiB of live heap over TLS, which the memory budget counts in the replica's floor); beyond it new ones are closed as they are accepted.")
	fs.IntVar(&o.MaxConnectionsPerPeer, "xds-max-connections-per-peer", d.MaxConnectionsPerPeer, "Most xDS connections open at once from one client IP address (a proxy needs one; raise it when many proxies reach the server through one NAT address).")
	o.IPv6PrefixLength = d.IPv6PrefixLength
	fs.Var(prefixLength{&o.IPv6PrefixLength}, "xds-ipv6-prefix-length", "How many leading bits of a client's IPv6 address name one client for the per-address limits (connections, their pace, failed streams, streams per client): a host is commonly given a whole /64. 128 keys each address; IPv4 addresses are always keyed whole.")
	fs.DurationVar(&o.MaxConnectionIdle, "xds-max-connection-idle", d.MaxConnectionIdle, "How long an xDS connection may have no open stream before the server closes it (HTTP/2 GOAWAY); a proxy always holds its ADS stream.")
	fs.DurationVar(&o.HandshakeTimeout, "xds-handshake-timeout", d.HandshakeTimeout, "How long a new xDS connection may take for its TLS handshake and HTTP/2 preface; then it is closed.")
	fs.IntVar(&o.MaxHeaderListBytes, "xds-max-header-list-bytes", d.MaxHeaderListBytes, "Largest request header list (HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE) of an xDS stream, in bytes, read before authentication; a ServiceAccount token is 1-2 KiB. A larger one resets the stream.")
	fs.Float64Var(&o.UnauthenticatedStreamsPerPeerPerSecond, "xds-unauthenticated-streams-per-peer-per-second", d.UnauthenticatedStreamsPerPeerPerSecond, "Streams per second one client IP address may open that fail authentication; beyond it (and the burst) its streams are refused with ResourceExhausted before their credentials are checked. Authenticated streams never spend it; a connection that closes without carrying a stream admitted to a scope does, and once it is spent the address's new connections are closed before their handshake.")
	fs.IntVar(&o.UnauthenticatedStreamsPerPeerBurst, "xds-unauthenticated-streams-per-peer-burst", d.UnauthenticatedStreamsPerPeerBurst, "Streams failing authentication one client IP address may open at once above that pace.")
	fs.Int64Var(&o.MemoryBudget, "xds-memory-budget", 0, "Live heap, in bytes, that clients may make a replica hold above what it holds for its world and its open connections; beyond it the replica refuses new ADS streams and ends the least proven ones (not yet admitted to a scope, then those of the clients holding the most streams), with ResourceExhausted. 0 takes a third of the Go memory limit (none without one), a negative value turns it off. See docs/admission.md.")
	fs.DurationVar(&o.SendTimeout, "xds-send-timeout", d.SendTimeout, "How long one ADS response may wait for the proxy to read the ones before it, or the proxy may leave what it was sent unanswered (counted from the first unanswered response or the last answer since, whether or not a change waits); then the stream ends with DeadlineExceeded and its connection is closed.")
	fs.Float64Var(&o.NACKsPerSecond, "xds-nacks-per-second", d.NACKsPerSecond, "Rejections (NACKs) per second one stream gets reported to status, Events and metrics; the rest are answered but only counted.")
	fs.IntVar(&o.NACKBurst, "xds-nack-burst", d.NACKBurst, "Rejections one stream gets reported at once above the per-second pace.")
	fs.DurationVar(&o.MaxConnectionAge, "xds-max-connection-age", d.MaxConnectionAge, "How long an xDS connection lives (±10% jitter) before the server sends GOAWAY, so proxies reconnect and spread over the replicas.")
	fs.DurationVar(&o.MaxConnectionAgeGrace, "xds-max-connection-age-grace", d.MaxConnectionAgeGrace, "How long ADS streams may go on after that GOAWAY (long enough to finish a push in flight); then the connection is closed and the proxy reconnects.")
}

// prefixLength is a flag of an IPv6 prefix length, 1 to 128.
type prefixLength struct{ n *int }

func (p prefixLength) String() string {
	if p.n == nil {
		return ""
	}
	return strconv.Itoa(*p.n)
}

func (p prefixLength) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 128 {
		return fmt.Errorf("%q is no IPv6 prefix length: give 1 to 128 bits (64 keys a client by its /64, 128 by its whole address)", s)
	}
	*p.n = n
	return nil
}

// Default client-side limits of scopeplane's API clients. client-go gives
// each REST client its own token bucket, and controller-runtime builds one
// client per resource type, so the ProxyScope status patches (status.DefaultWritesPerSecond, status.DefaultWritesBurst)
// have this bucket to themselves: twice their pace and burst leaves room
// for their retries, and lets the other clients (bootstrap ConfigMaps, a
// fresh install's one per scope; Events; the Lease; TokenReviews) write as
// fast, while a writer gone wrong is still bounded.
const (
	defaultKubeQPS   = 2 * status.DefaultWritesPerSecond
	defaultKubeBurst = 2 * status.DefaultWritesBurst
)

// limitAPI sets cfg's client-side rate limit from the flags, and refuses
// one that would pace status writes below --status-writes-per-second or
// --status-writes-burst.
func (c *config) limitAPI(cfg *rest.Config) error {
	switch {
	case c.kubeQPS == 0:
		return errors.New("--kube-api-qps=0: client-go would take it for its default of 5 requests a second; give a pace, or a negative value to turn client-side limiting off")
	case c.kubeQPS > 0 && c.kubeQPS < c.statusWrites.PerSecond:
		return fmt.Errorf("--kube-api-qps=%v is below --status-writes-per-second=%v: the client would hold status writes below their pace; raise it, or lower the status pace", c.kubeQPS, c.statusWrites.PerSecond)
	case c.kubeQPS > 0 && c.kubeBurst < c.statusWrites.Burst:
		return fmt.Errorf("--kube-api-burst=%d is below --status-writes-burst=%d: the client would hold a burst of status writes back; raise it, or lower the status burst", c.kubeBurst, c.statusWrites.Burst)
	}
	cfg.QPS, cfg.Burst = float32(c.kubeQPS), c.kubeBurst
	return nil
}

// serviceAccountNamespace is the file that holds the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// tls is the xDS TLS the flags ask for; the self-managed CA's Secret is
// in the pod's namespace unless named.
func (c *config) tls() (controlplane.TLS, error) {
	t := controlplane.TLS{Insecure: c.xdsInsecure, Dir: c.xdsTLSDir}
	if t.Insecure || t.Dir != "" {
		return t, nil
	}
	t.Secret = types.NamespacedName{Namespace: c.xdsTLSNS, Name: c.xdsTLSSecret}
	if t.Secret.Namespace == "" {
		ns, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return t, fmt.Errorf("the namespace of the self-managed CA's Secret: not in a pod (%w); set --xds-tls-secret-namespace, --xds-tls-dir or --xds-insecure", err)
		}
		t.Secret.Namespace = strings.TrimSpace(string(ns))
	}
	return t, nil
}

// sharding is this replica's shard: one, serving every scope, unless
// --shards is above 1, when --xds-server-address lists every slot's
// address.
func (c *config) sharding() (shard.Shards, error) {
	if c.shards < 1 {
		return shard.Shards{}, fmt.Errorf("--shards=%d: there is at least one shard", c.shards)
	}
	if c.shards == 1 {
		if c.shard != 0 {
			return shard.Shards{}, fmt.Errorf("--shard=%d with one shard: the only shard is 0", c.shard)
		}
		if strings.Contains(c.xdsServer, ",") {
			return shard.Shards{}, fmt.Errorf("--xds-server-address=%s names several addresses with one shard, which is reached at one: give one, or --shards above 1", c.xdsServer)
		}
		return shard.Shards{}, nil
	}
	addrs := strings.Split(c.xdsServer, ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	if len(addrs) < c.shards {
		return shard.Shards{}, fmt.Errorf("--xds-server-address names %d address(es) for --shards=%d: give each slot's, at least one per shard, comma-separated, slot 0's first", len(addrs), c.shards)
	}
	s := shard.Shards{Index: c.shard, N: c.shards, Addresses: addrs}
	return s, s.Check()
}

// replica names this replica for leader election's feedback ConfigMaps:
// by the flags, else by the Pod's name and namespace (the chart passes
// them from the downward API, the namespace is the service account's).
func (c *config) replica(getenv func(string) string) (replicafeedback.Replica, error) {
	r := replicafeedback.Replica{Name: c.replicaName, Namespace: c.leaderNS, PodUID: types.UID(getenv("POD_UID"))}
	if r.Name == "" {
		r.Name = getenv("POD_NAME")
	}
	if r.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			return r, fmt.Errorf("this replica's name: %w; set --replica-name", err)
		}
		r.Name = strings.ToLower(host)
	}
	if r.Namespace == "" {
		ns, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return r, fmt.Errorf("the namespace of the replicas' feedback ConfigMaps: not in a pod (%w); set --leader-election-namespace", err)
		}
		r.Namespace = strings.TrimSpace(string(ns))
	}
	return r, nil
}

func main() {
	c := bindFlags(flag.CommandLine)
	flag.Parse()
	if c.showVersion {
		fmt.Println("scopeplane", version, runtime.Version())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&c.zap)))
	log := ctrl.Log.WithName("setup")
	if len(c.bootstrapNS) > 0 && !c.bootstrapCMs {
		log.Error(errors.New("--bootstrap-configmap-namespaces names where to write bootstrap ConfigMaps, and --bootstrap-configmaps=false writes none: drop one of them"), "bootstrap ConfigMaps")
		os.Exit(2)
	}
	if err := metrics.SetScopeLabels(metrics.ScopeLabels(c.metricsScopes)); err != nil {
		log.Error(err, "--metrics-scope-labels")
		os.Exit(2)
	}
	limit, why, err := goMemoryLimit(os.Getenv)
	if err != nil {
		log.Error(err, "the Go memory limit")
		os.Exit(2)
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	log.Info("Go memory limit", "bytes", debug.SetMemoryLimit(-1), "from", why)
	if c.adminAddr != "" {
		if err := controlplane.CheckAdminAddress(c.adminAddr); err != nil {
			log.Error(err, "--admin-bind-address")
			os.Exit(2)
		}
	}

	// The manager runs no leader election of its own: controlplane.Setup
	// runs only the writing under the Lease, so that losing it never ends
	// the manager and the ADS streams it serves.
	cfg := ctrl.GetConfigOrDie()
	if err := c.limitAPI(cfg); err != nil {
		log.Error(err, "API client limits")
		os.Exit(2)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Cache:                  controlplane.CacheOptions(c.bootstrapNS...),
		Metrics:                controlplane.MetricsOptions(c.metricsAddr, c.metricsSecure),
		HealthProbeBindAddress: c.probeAddr,
		PprofBindAddress:       c.pprofAddr,
	})
	if err != nil {
		log.Error(err, "creating the manager")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		os.Exit(1)
	}
	xdsTLS, err := c.tls()
	if err != nil {
		log.Error(err, "xDS TLS")
		os.Exit(2)
	}
	authn, err := c.auth.Build(mgr.GetConfig())
	if err != nil {
		log.Error(err, "xDS authentication")
		os.Exit(2)
	}
	c.limits.Authenticator = authn
	var replica replicafeedback.Replica
	if c.leaderElect {
		if replica, err = c.replica(os.Getenv); err != nil {
			log.Error(err, "leader election")
			os.Exit(2)
		}
	}
	shards, err := c.sharding()
	if err != nil {
		log.Error(err, "shards")
		os.Exit(2)
	}
	ctx := ctrl.SetupSignalHandler()
	if _, err := controlplane.Setup(ctx, mgr, controlplane.Options{
		XDSAddress: c.xdsAddr, XDSServerAddress: c.xdsServer, CoalesceWindow: c.window, AdminAddress: c.adminAddr,
		CostBucket: c.costBucket, NoBootstrapConfigMaps: !c.bootstrapCMs, BootstrapNamespaces: c.bootstrapNS, Server: c.limits,
		LeaderElection: controlplane.LeaderElection{Enabled: c.leaderElect, Namespace: c.leaderNS}, Replica: replica, TLS: xdsTLS,
		CrossNamespace: c.crossNS, StatusWrites: c.statusWrites, RouteControllerName: c.routeCtrlName, Shards: shards,
	}); err != nil {
		log.Error(err, "setting up the control plane")
		os.Exit(1)
	}
	metrics.SetBuildInfo(version)
	log.Info("starting scopeplane", "version", version)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "running the manager")
		os.Exit(1)
	}
}
