// Package server is scopeplane's ADS gRPC service. It serves both xDS
// variants from the shared per-scope snapshots: State of the World
// (StreamAggregatedResources) and delta (DeltaAggregatedResources). Each
// stream is authenticated (package auth) before anything it sends is read,
// then bound to the ProxyScope its node names in metadata if that scope
// admits the stream's identity, and refused with PermissionDenied
// otherwise, the same whether the scope exists or not; an admitted stream
// of the other protocol is told what to fix.
//
// The stream handlers are scopeplane's own rather than go-control-plane's
// server over a cache: a scope's resources are marshalled once and shared by
// all of its streams, each stream catches up by reading the scope's change
// log instead of diffing snapshots, a NACKed version is never resent, and
// ACKs and NACKs are reported per scope (package feedback).
package server

import (
	"sync"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/peerrate"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// Options bound what one proxy can make the server do. A zero field takes
// its value from DefaultOptions; docs/troubleshooting.md gives the reason
// for each default.
type Options struct {
	// MaxRequestBytes bounds one request message (gRPC's MaxRecvMsgSize).
	MaxRequestBytes int
	// MaxNamesPerRequest bounds the resource names (subscribed, unsubscribed
	// or claimed in initial_resource_versions) one request may carry.
	MaxNamesPerRequest int
	// ExtraNamesPerType is how many names a stream may subscribe to per
	// type beyond what its scope serves of that type: room for names that
	// do not exist yet, never room to grow without bound.
	ExtraNamesPerType int
	// MaxStreamsPerConnection is HTTP/2's MaxConcurrentStreams; grpc-go's
	// protection against rapid reset depends on it being set.
	MaxStreamsPerConnection int
	// MaxStreamsPerClient bounds the ADS streams one client (an identity at
	// one client IP address) has open at once: with MaxRequestBytes it
	// bounds the request bytes one client can make gRPC hold (see
	// clientStreams).
	MaxStreamsPerClient int
	// FirstRequestTimeout ends a stream that sent no request by then.
	FirstRequestTimeout time.Duration
	// MaxNodeBytes bounds the node (serialized) and MaxNodeIDBytes its id:
	// both are kept for the stream's life.
	MaxNodeBytes   int
	MaxNodeIDBytes int
	// NewStreamsPerSecond and NewStreamsBurst pace the streams this
	// replica accepts, whoever opens them.
	NewStreamsPerSecond float64
	NewStreamsBurst     int
	// UnauthenticatedStreamsPerPeerPerSecond and UnauthenticatedStreamsPerPeerBurst
	// pace the streams of one client IP address that fail authentication
	// or present no credential (identified by their peer address alone),
	// and its connections that close without carrying a stream admitted to
	// a scope: a peer that spent its budget is refused before its
	// credentials are looked at, its new connections before their
	// handshake, and the shared paces are spent only by the others, so a
	// client without credentials cannot use them up for the proxies that
	// have them.
	UnauthenticatedStreamsPerPeerPerSecond float64
	UnauthenticatedStreamsPerPeerBurst     int
	// NewConnectionsPerSecond and NewConnectionsBurst pace the TCP
	// connections this replica accepts (in ServeListener): a connection
	// costs gRPC's buffers and goroutines before it opens any stream.
	NewConnectionsPerSecond float64
	NewConnectionsBurst     int
	// NewConnectionsPerPeerPerSecond and NewConnectionsPerPeerBurst pace
	// the connections of one client IP address, before the shared pace is
	// spent: no credentials are known when a connection is accepted, so
	// only a budget per peer keeps one client from spending the shared one.
	NewConnectionsPerPeerPerSecond float64
	NewConnectionsPerPeerBurst     int
	// MaxConnections and MaxConnectionsPerPeer bound the connections open
	// at once on this replica, and from one client IP address: each holds
	// gRPC's transport and, over TLS, crypto/tls's records (ConnectionHeap)
	// whether or not it opens a stream.
	MaxConnections        int
	MaxConnectionsPerPeer int
	// IPv6PrefixLength is how many leading bits of a client's IPv6 address
	// name it for every per-address budget above (an IPv4 address is
	// always one client): a host is commonly given a whole /64, and a
	// budget per address would give it 2^64 budgets.
	IPv6PrefixLength int
	// MaxConnectionIdle closes a connection that has had no open stream
	// for that long (HTTP/2 GOAWAY): a proxy always holds its ADS stream,
	// so an idle connection holds a slot for nothing.
	MaxConnectionIdle time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface (gRPC's ConnectionTimeout, 120 s unset).
	HandshakeTimeout time.Duration
	// MaxHeaderListBytes bounds the request headers of a stream (HTTP/2
	// SETTINGS_MAX_HEADER_LIST_SIZE), which gRPC reads and holds before
	// the stream is authenticated: a ServiceAccount token in authorization
	// is 1–2 KiB.
	MaxHeaderListBytes int
	// SendTimeout ends a stream, and closes its connection, when one
	// response cannot be handed to the transport within it, or a change
	// waits for the proxy to answer the last response longer: the proxy
	// does not read what it was sent before.
	SendTimeout time.Duration
	// MemoryBudget is the live heap, in bytes, above the replica's floor
	// (its world, and ConnectionHeap for each open connection) beyond
	// which the replica refuses new streams and ends the least proven ones
	// (memoryBudget): what clients make it hold (requests being received
	// and held, responses queued but unsent, per-stream state) is bounded
	// by it, however many clients and addresses there are. Zero derives it
	// from the Go memory limit (memoryBudgetShare of it; none without a
	// limit); a negative value turns it off.
	MemoryBudget int64
	// NACKsPerSecond and NACKBurst pace the rejections one stream gets
	// reported (to status, Events and metrics); the rest are answered but
	// only counted.
	NACKsPerSecond float64
	NACKBurst      int
	// MaxConnectionAge is how long a proxy's connection lives before the
	// server asks it, with an HTTP/2 GOAWAY, to reconnect: grpc-go adds
	// ±10% jitter, so connections made together (after a restart) age out
	// spread over a fifth of it. Without it a proxy stays on the replica it
	// first reached, and new replicas of a scale-up or a rollout get none.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long streams may go on after the GOAWAY
	// before the connection is closed. An ADS stream never ends by itself,
	// so it always runs to the end of the grace: it needs only long enough
	// to finish a push in flight, since a reconnecting proxy is sent again
	// only what it does not hold.
	MaxConnectionAgeGrace time.Duration
	// Authenticator establishes each stream's identity before its scope is
	// resolved. Nil refuses every stream with Unauthenticated: anonymous
	// proxies are admitted only when asked for explicitly
	// (auth.Authenticator.AllowAnonymous).
	Authenticator *auth.Authenticator
	// Zones tells the zone of a Kubernetes Node, for proxies whose token
	// names the Node their pod runs on; nil trusts only what bootstraps
	// declare.
	Zones Zones
	// Shards is this replica's shard: a stream naming a scope of another
	// shard is refused with the address of that scope's slot. The zero value serves
	// every scope.
	Shards shard.Shards
	// OtherShardsAdmit, with shards and the peer-address method, reports
	// whether a scope of another shard admits a client identified by its
	// address alone: such a stream is let on to its first request, where
	// it is told its scope's shard, rather than refused as admitted by no
	// scope this replica holds. Nil: only this replica's scopes count.
	OtherShardsAdmit func(*auth.Identity) bool
}

// DefaultOptions are the limits used when an Options field is zero.
var DefaultOptions = Options{
	MaxRequestBytes:                        4 << 20,
	MaxNamesPerRequest:                     100_000,
	ExtraNamesPerType:                      1024,
	MaxStreamsPerConnection:                100,
	MaxStreamsPerClient:                    32,
	FirstRequestTimeout:                    15 * time.Second,
	MaxNodeBytes:                           64 << 10,
	MaxNodeIDBytes:                         512,
	NewStreamsPerSecond:                    500,
	NewStreamsBurst:                        5000,
	NewConnectionsPerSecond:                500,
	NewConnectionsBurst:                    5000,
	UnauthenticatedStreamsPerPeerPerSecond: 5,
	UnauthenticatedStreamsPerPeerBurst:     50,
	NewConnectionsPerPeerPerSecond:         50,
	NewConnectionsPerPeerBurst:             500,
	MaxConnections:                         5000,
	MaxConnectionsPerPeer:                  500,
	IPv6PrefixLength:                       peerrate.DefaultIPv6PrefixLength,
	MaxConnectionIdle:                      time.Minute,
	HandshakeTimeout:                       10 * time.Second,
	MaxHeaderListBytes:                     16 << 10,
	SendTimeout:                            30 * time.Second,
	NACKsPerSecond:                         1,
	NACKBurst:                              10,
	MaxConnectionAge:                       30 * time.Minute,
	MaxConnectionAgeGrace:                  10 * time.Second,
}

// keptNodeText bounds the node's cluster and user agent as a stream keeps
// them (for CSDS and status); longer values are cut, not refused.
const keptNodeText = 256

// withDefaults fills the zero fields of o from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions
	o.MaxRequestBytes = orDefault(o.MaxRequestBytes, d.MaxRequestBytes)
	o.MaxNamesPerRequest = orDefault(o.MaxNamesPerRequest, d.MaxNamesPerRequest)
	o.ExtraNamesPerType = orDefault(o.ExtraNamesPerType, d.ExtraNamesPerType)
	o.MaxStreamsPerConnection = orDefault(o.MaxStreamsPerConnection, d.MaxStreamsPerConnection)
	o.MaxStreamsPerClient = orDefault(o.MaxStreamsPerClient, d.MaxStreamsPerClient)
	o.FirstRequestTimeout = orDefault(o.FirstRequestTimeout, d.FirstRequestTimeout)
	o.MaxNodeBytes = orDefault(o.MaxNodeBytes, d.MaxNodeBytes)
	o.MaxNodeIDBytes = orDefault(o.MaxNodeIDBytes, d.MaxNodeIDBytes)
	o.NewStreamsPerSecond = orDefault(o.NewStreamsPerSecond, d.NewStreamsPerSecond)
	o.NewStreamsBurst = orDefault(o.NewStreamsBurst, d.NewStreamsBurst)
	o.NewConnectionsPerSecond = orDefault(o.NewConnectionsPerSecond, d.NewConnectionsPerSecond)
	o.NewConnectionsBurst = orDefault(o.NewConnectionsBurst, d.NewConnectionsBurst)
	o.UnauthenticatedStreamsPerPeerPerSecond = orDefault(o.UnauthenticatedStreamsPerPeerPerSecond, d.UnauthenticatedStreamsPerPeerPerSecond)
	o.UnauthenticatedStreamsPerPeerBurst = orDefault(o.UnauthenticatedStreamsPerPeerBurst, d.UnauthenticatedStreamsPerPeerBurst)
	o.NewConnectionsPerPeerPerSecond = orDefault(o.NewConnectionsPerPeerPerSecond, d.NewConnectionsPerPeerPerSecond)
	o.NewConnectionsPerPeerBurst = orDefault(o.NewConnectionsPerPeerBurst, d.NewConnectionsPerPeerBurst)
	o.MaxConnections = orDefault(o.MaxConnections, d.MaxConnections)
	o.MaxConnectionsPerPeer = orDefault(o.MaxConnectionsPerPeer, d.MaxConnectionsPerPeer)
	o.IPv6PrefixLength = orDefault(o.IPv6PrefixLength, d.IPv6PrefixLength)
	o.MaxConnectionIdle = orDefault(o.MaxConnectionIdle, d.MaxConnectionIdle)
	o.HandshakeTimeout = orDefault(o.HandshakeTimeout, d.HandshakeTimeout)
	o.MaxHeaderListBytes = orDefault(o.MaxHeaderListBytes, d.MaxHeaderListBytes)
	o.SendTimeout = orDefault(o.SendTimeout, d.SendTimeout)
	o.NACKsPerSecond = orDefault(o.NACKsPerSecond, d.NACKsPerSecond)
	o.NACKBurst = orDefault(o.NACKBurst, d.NACKBurst)
	o.MaxConnectionAge = orDefault(o.MaxConnectionAge, d.MaxConnectionAge)
	o.MaxConnectionAgeGrace = orDefault(o.MaxConnectionAgeGrace, d.MaxConnectionAgeGrace)
	if o.MemoryBudget == 0 {
		o.MemoryBudget = defaultMemoryBudget()
	}
	return o
}

func orDefault[T int | float64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Server implements the ADS service over a snapshot store.
type Server struct {
	store    *snapshot.Store
	fb       *feedback.Tracker
	opts     Options
	ready    <-chan struct{}
	pace     *rate.Limiter
	connPace *peerrate.Limiter
	// unauthenticated is each peer's budget of streams that fail
	// authentication.
	unauthenticated *peerrate.Limiter
	conns           *conns
	clients         *clientStreams
	budget          *memoryBudget
	drain           chan struct{}
	drainOnce       sync.Once
}

var _ discoveryv3.AggregatedDiscoveryServiceServer = (*Server)(nil)

// New returns a server that serves store and reports to fb. It refuses
// streams until ready is closed: before the first build from the whole
// cluster a scope lacks what is not reconciled yet, and a SotW proxy takes
// an omission for a deletion.
func New(store *snapshot.Store, fb *feedback.Tracker, ready <-chan struct{}, opts Options) *Server {
	opts = opts.withDefaults()
	unauthenticated := peerrate.New(opts.UnauthenticatedStreamsPerPeerPerSecond, opts.UnauthenticatedStreamsPerPeerBurst, nil)
	s := &Server{
		store: store, fb: fb, opts: opts, ready: ready, drain: make(chan struct{}),
		pace: rate.NewLimiter(rate.Limit(opts.NewStreamsPerSecond), opts.NewStreamsBurst),
		connPace: peerrate.New(opts.NewConnectionsPerPeerPerSecond, opts.NewConnectionsPerPeerBurst,
			rate.NewLimiter(rate.Limit(opts.NewConnectionsPerSecond), opts.NewConnectionsBurst)),
		unauthenticated: unauthenticated,
		clients:         newClientStreams(opts.MaxStreamsPerClient),
	}
	s.conns = newConns(opts.MaxConnections, opts.MaxConnectionsPerPeer, unauthenticated.Spend)
	s.budget = newMemoryBudget(opts.MemoryBudget, s.conns.Open)
	return s
}

// Register adds the ADS service to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s)
}
