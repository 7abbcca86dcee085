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
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/clip"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/peerrate"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
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
	// pace the streams of one client IP address that fail authentication:
	// a peer that spent its budget is refused before its credentials are
	// looked at, and the shared pace above is spent only by authenticated
	// streams, so a client without credentials cannot use it up for the
	// proxies that have them.
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
	// gRPC's transport buffers (~37 KiB) whether or not it opens a stream.
	MaxConnections        int
	MaxConnectionsPerPeer int
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
	o.MaxConnectionIdle = orDefault(o.MaxConnectionIdle, d.MaxConnectionIdle)
	o.HandshakeTimeout = orDefault(o.HandshakeTimeout, d.HandshakeTimeout)
	o.MaxHeaderListBytes = orDefault(o.MaxHeaderListBytes, d.MaxHeaderListBytes)
	o.SendTimeout = orDefault(o.SendTimeout, d.SendTimeout)
	o.NACKsPerSecond = orDefault(o.NACKsPerSecond, d.NACKsPerSecond)
	o.NACKBurst = orDefault(o.NACKBurst, d.NACKBurst)
	o.MaxConnectionAge = orDefault(o.MaxConnectionAge, d.MaxConnectionAge)
	o.MaxConnectionAgeGrace = orDefault(o.MaxConnectionAgeGrace, d.MaxConnectionAgeGrace)
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
	return &Server{
		store: store, fb: fb, opts: opts, ready: ready, drain: make(chan struct{}),
		pace: rate.NewLimiter(rate.Limit(opts.NewStreamsPerSecond), opts.NewStreamsBurst),
		connPace: peerrate.New(opts.NewConnectionsPerPeerPerSecond, opts.NewConnectionsPerPeerBurst,
			rate.NewLimiter(rate.Limit(opts.NewConnectionsPerSecond), opts.NewConnectionsBurst)),
		unauthenticated: peerrate.New(opts.UnauthenticatedStreamsPerPeerPerSecond, opts.UnauthenticatedStreamsPerPeerBurst, nil),
		conns:           newConns(opts.MaxConnections, opts.MaxConnectionsPerPeer),
		clients:         newClientStreams(opts.MaxStreamsPerClient),
	}
}

// Register adds the ADS service to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s)
}

// Refusal reasons of the per-client limits, counted in
// scopeplane_xds_refusals_total next to feedback's scope reasons. The set is
// fixed: a client cannot add a label value.
const (
	RefusedNotReady        = "NotReady"
	RefusedPaced           = "Paced"
	RefusedSilent          = "Silent"
	RefusedNodeTooLarge    = "NodeTooLarge"
	RefusedRequestTooLarge = "RequestTooLarge"
	RefusedMalformed       = "Malformed"
	RefusedTooManyNames    = "TooManyNames"
	// RefusedConnectionPaced counts connections closed beyond the pace of
	// new connections, before any stream; RefusedSlowReader streams ended
	// because their proxy did not read (Options.SendTimeout).
	RefusedConnectionPaced = "ConnectionPaced"
	RefusedSlowReader      = "SlowReader"
	// RefusedConnectionLimit counts connections closed as they were
	// accepted because the replica, or their peer, holds as many as it may
	// (Options.MaxConnections, MaxConnectionsPerPeer).
	RefusedConnectionLimit = "ConnectionLimit"
	// RefusedConnectionEvicted counts connections closed to make room for
	// a new one where the bounds were reached: each had carried no
	// authenticated stream for the handshake timeout (conns.evict).
	RefusedConnectionEvicted = "ConnectionEvicted"
	// RefusedClientStreamLimit counts authenticated streams refused
	// because their client (identity and address) holds as many as it may
	// (Options.MaxStreamsPerClient).
	RefusedClientStreamLimit = "ClientStreamLimit"
	// RefusedPeerPaced counts streams refused before authentication
	// because their peer used up its budget of streams that failed it.
	RefusedPeerPaced = "PeerPaced"
	// RefusedUnauthenticated counts streams without valid credentials, and
	// RefusedNotAdmitted those naming a scope that is missing or does not
	// admit their identity: both globally, so that a stranger cannot mark
	// someone else's scope Degraded.
	RefusedUnauthenticated = "Unauthenticated"
	RefusedNotAdmitted     = "NotAdmitted"
)

// admit refuses a new stream before it reads anything: while the replica
// has not built the whole cluster yet, and when its peer has used up its
// budget of streams that failed authentication.
func (s *Server) admit(ctx context.Context) error {
	select {
	case <-s.ready:
	default:
		s.fb.Refuse(model.Key{}, RefusedNotReady)
		return status.Error(codes.Unavailable,
			"not ready: this control plane replica has not finished its initial sync of the cluster, and what it would serve now lacks what is not reconciled yet; retry (Envoy's ADS retry does), or reach a ready replica")
	}
	if !s.unauthenticated.Has(peerIP(ctx)) {
		s.fb.Refuse(model.Key{}, RefusedPeerPaced)
		return status.Errorf(codes.ResourceExhausted,
			"this client address opened more streams that failed authentication than this replica accepts (%g a second, burst %d): fix the proxy's credentials and reconnect with backoff (--xds-unauthenticated-streams-per-peer-per-second / --xds-unauthenticated-streams-per-peer-burst)",
			s.opts.UnauthenticatedStreamsPerPeerPerSecond, s.opts.UnauthenticatedStreamsPerPeerBurst)
	}
	return nil
}

// paced refuses an authenticated stream beyond the pace of new streams. It
// is spent only after authentication: a client without credentials cannot
// use it up for proxies that have them.
func (s *Server) paced() error {
	if !s.pace.Allow() {
		s.fb.Refuse(model.Key{}, RefusedPaced)
		return status.Errorf(codes.ResourceExhausted,
			"this replica accepts at most %g new ADS streams a second (burst %d), and they are used up: reconnect with backoff, or raise --xds-new-streams-per-second / --xds-new-streams-burst",
			s.opts.NewStreamsPerSecond, s.opts.NewStreamsBurst)
	}
	return nil
}

// checkNode refuses a node larger than the limits: a stream keeps its node
// (the SotW protocol even repeats it on every request) for its whole life.
func (s *Server) checkNode(node *corev3.Node) error {
	if n := len(node.GetId()); n > s.opts.MaxNodeIDBytes {
		s.fb.Refuse(model.Key{}, RefusedNodeTooLarge)
		return status.Errorf(codes.InvalidArgument,
			"node.id %s is %d bytes; the limit is %d (--xds-max-node-id-bytes): give the proxy a shorter node id",
			clip.Quote(node.GetId()), n, s.opts.MaxNodeIDBytes)
	}
	if n := proto.Size(node); n > s.opts.MaxNodeBytes {
		s.fb.Refuse(model.Key{}, RefusedNodeTooLarge)
		return status.Errorf(codes.InvalidArgument,
			"node %s is %d bytes serialized; the limit is %d (--xds-max-node-bytes): trim node.metadata and the other node fields in the proxy's bootstrap",
			clip.Quote(node.GetId()), n, s.opts.MaxNodeBytes)
	}
	return nil
}

// kept is the part of a node a stream keeps: its id (within the limit
// checkNode enforces), and its cluster and user agent cut to keptNodeText.
func kept(node *corev3.Node) *corev3.Node {
	return &corev3.Node{
		Id:                   node.GetId(),
		Cluster:              clip.String(node.GetCluster(), keptNodeText),
		UserAgentName:        clip.String(node.GetUserAgentName(), keptNodeText),
		UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: clip.String(node.GetUserAgentVersion(), keptNodeText)},
	}
}

// authenticate establishes the identity of a new stream (nil for an
// anonymous one, when allowed), before anything the stream sends is read.
func (s *Server) authenticate(ctx context.Context) (*auth.Identity, error) {
	if s.opts.Authenticator == nil {
		s.fb.Refuse(model.Key{}, RefusedUnauthenticated)
		return nil, status.Error(codes.Unauthenticated, "this server has no authentication configured and does not admit anonymous proxies")
	}
	id, err := s.opts.Authenticator.Authenticate(ctx)
	if err != nil {
		s.fb.Refuse(model.Key{}, RefusedUnauthenticated)
		s.unauthenticated.Spend(peerIP(ctx))
		return nil, err
	}
	return id, nil
}

// peerIP is the client IP address of the stream of ctx: what per-peer
// budgets are kept by.
func peerIP(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return peerrate.Of(p.Addr)
	}
	return ""
}

// notAdmitted is the refusal of a scope that does not exist and of one
// that does not admit the stream's identity alike, so that a proxy learns
// nothing about scopes it may not use.
func notAdmitted(value string, id *auth.Identity) error {
	hint := ""
	if id != nil && id.Method == auth.MethodPeerAddress {
		hint = "; a proxy without a credential only when the scope sets spec.admitByPeerAddress and one Running Pod of that namespace holds its address"
	}
	return status.Errorf(codes.PermissionDenied,
		"ProxyScope %s does not exist or does not admit %s: a scope admits the ServiceAccounts of its own namespace, narrowed by its spec.proxies%s",
		clip.Quote(value), id.Refused(), hint)
}

// resolve binds a stream to the scope its node names, or refuses it.
// Refusals quote what the proxy sent only through clip.Quote. Until a
// scope admits id, refusals are counted globally and say nothing about the
// scope.
func (s *Server) resolve(node *corev3.Node, p model.Protocol, id *auth.Identity) (model.Key, *snapshot.Snapshot, error) {
	if err := s.checkNode(node); err != nil {
		return model.Key{}, nil, err
	}
	value := node.GetMetadata().GetFields()[model.ScopeMetadataKey].GetStringValue()
	if value == "" {
		s.fb.Refuse(model.Key{}, feedback.RefusedNoScope)
		return model.Key{}, nil, status.Errorf(codes.InvalidArgument,
			"node %s names no ProxyScope: set node.metadata[%q] to \"<namespace>/<name>\" of a ProxyScope in the proxy's bootstrap",
			clip.Quote(node.GetId()), model.ScopeMetadataKey)
	}
	key, err := parseScope(value)
	if err != nil {
		s.fb.Refuse(model.Key{}, feedback.RefusedNoScope)
		return model.Key{}, nil, status.Errorf(codes.InvalidArgument,
			"node %s: node.metadata[%q] = %s is not \"<namespace>/<name>\" of a ProxyScope: %v",
			clip.Quote(node.GetId()), model.ScopeMetadataKey, clip.Quote(value), err)
	}
	sc := s.store.Get(key)
	var spec *model.Scope
	if sc != nil {
		sc.Read(func(v snapshot.View) { spec = v.Spec() })
	}
	if id != nil && (spec == nil || !auth.Admits(id, key.Namespace, spec.Proxies, spec.AdmitByPeerAddress)) {
		s.fb.Refuse(model.Key{}, RefusedNotAdmitted)
		return model.Key{}, nil, notAdmitted(value, id)
	}
	if spec == nil {
		s.fb.Refuse(model.Key{}, feedback.RefusedUnknownScope)
		return model.Key{}, nil, status.Errorf(codes.NotFound,
			"node %s names ProxyScope %s, which does not exist (or is not built yet): create it, or fix node.metadata[%q]",
			clip.Quote(node.GetId()), clip.Quote(value), model.ScopeMetadataKey)
	}
	if !spec.Serves(p, time.Now()) {
		s.fb.RefuseWrongProtocol(key, feedback.ClientKind(node))
		return model.Key{}, nil, wrongProtocol(key, spec.Protocol, p, isGRPC(node))
	}
	return key, sc, nil
}

// wrongProtocol is the refusal for a stream of the other xDS variant. A
// gRPC client cannot be told to switch: every gRPC xDS client speaks State
// of the World only, so the only fix is the scope's protocol.
func wrongProtocol(key model.Key, want, got model.Protocol, grpcClient bool) error {
	if grpcClient && want == model.Delta {
		return status.Errorf(codes.FailedPrecondition,
			"ProxyScope %q requires the Delta protocol but this is a gRPC client, and gRPC xDS clients speak State of the World only: set the scope's spec.protocol: SotW",
			key.String())
	}
	return status.Errorf(codes.FailedPrecondition,
		"ProxyScope %q requires the %s protocol (spec.protocol: %s) but this proxy opened a %s stream: set api_type: %s in the ADS config of its bootstrap, or change the scope's spec.protocol",
		key.String(), want, want, got, want.APIType())
}

func parseScope(v string) (model.Key, error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok || strings.Contains(name, "/") {
		return model.Key{}, fmt.Errorf("want exactly one '/'")
	}
	// The value is quoted (cut) by the caller; the parts are not repeated.
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return model.Key{}, fmt.Errorf("the namespace %s", strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return model.Key{}, fmt.Errorf("the name %s", strings.Join(errs, "; "))
	}
	return model.Key{Namespace: ns, Name: name}, nil
}

// scopeGone is the status a stream ends with when its scope is deleted; the
// proxy keeps its last configuration and reconnects.
func scopeGone(key model.Key) error {
	return status.Errorf(codes.NotFound, "ProxyScope %q was deleted", key.String())
}

func unknownType(url string) error {
	urls := xdstype.URLs()
	return status.Errorf(codes.InvalidArgument, "type URL %q is not served by scopeplane: it serves %s and %s",
		url, strings.Join(urls[:len(urls)-1], ", "), urls[len(urls)-1])
}

func tooManyNames(n, limit int) error {
	return status.Errorf(codes.InvalidArgument,
		"a request carries %d resource names; the limit is %d per request (--xds-max-names-per-request): split the subscription over several requests", n, limit)
}

// tooManySubscribed is the refusal of a stream that names more of a type
// than its scope serves, by more than the room Options.ExtraNamesPerType gives.
func (st *stream) tooManySubscribed(t xdstype.Type, n, served int) error {
	st.srv.fb.Refuse(st.key, RefusedTooManyNames)
	return status.Errorf(codes.ResourceExhausted,
		"the stream subscribes to %d %s names; ProxyScope %q serves %d, and a stream may name at most %d more (--xds-extra-names-per-type): subscribe to what the scope serves",
		n, t.URL(), st.key.String(), served, st.srv.opts.ExtraNamesPerType)
}

// checkSubscribed refuses a subscription of n names of type t when it
// exceeds what the scope serves plus the allowed extra.
func (st *stream) checkSubscribed(t xdstype.Type, n int) error {
	served := 0
	st.read(func(v snapshot.View) { served = v.Len(t) })
	if n > served+st.srv.opts.ExtraNamesPerType {
		return st.tooManySubscribed(t, n, served)
	}
	return nil
}

// stream is the state both protocols keep per ADS stream: which scope it
// serves, and up to which revision of that scope it has caught up.
type stream struct {
	srv *Server
	key model.Key
	sc  *snapshot.Snapshot
	// at is where the proxy runs, which decides the place views it sees
	// (see snapshot.ReadFrom); it is fixed for the stream's life, so a
	// proxy that moves sees its new place when it reconnects.
	at      model.Location
	id      uint64
	rev     uint64
	ver     string
	revTime time.Time
	wake    <-chan struct{}
	nonce   uint64
	// otherNonce counts the responses the other protocol would have sent
	// on this stream, whose nonces its headers are priced with: delta sends
	// one more when a stream connects to a VHDS scope.
	otherNonce uint64
	// nacks paces the rejections the stream gets reported (rejected).
	nacks *rate.Limiter
	// spec is the spec the stream last looked at; ends fires when a
	// transition that still serves the stream's protocol is over.
	spec *model.Scope
	ends <-chan time.Time
	// grpc is set for a gRPC client (see isGRPC), which is told a different
	// fix when its scope stops serving its protocol.
	grpc bool
	// answers counts the responses the proxy answered (ACK or NACK), and
	// waiting is set while one is unanswered: serve's send timeout runs
	// from the first unanswered response, or the last answer since.
	answers uint64
	waiting bool
}

// peerOf is the remote address of the stream of ctx, "" when gRPC knows
// none: what tells apart the proxies of one node id in reports.
func peerOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// isGRPC reports whether node is a gRPC xDS client: every gRPC language
// names itself in user_agent_name starting with "gRPC" ("gRPC Go",
// "gRPC C-core", "gRPC Java", grpc-js "gRPC Node Pure JS"); Envoy sends "envoy".
func isGRPC(node *corev3.Node) bool { return feedback.ClientKind(node) == feedback.KindGRPC }

// read calls fn with the scope as the stream's proxy sees it.
func (st *stream) read(fn func(v snapshot.View)) { st.sc.ReadFrom(st.at, fn) }

// caughtUp records that the stream has processed the scope as v shows it.
func (st *stream) caughtUp(v snapshot.View) {
	st.rev, st.ver, st.revTime, st.wake = v.Rev(), v.Version(), v.RevTime(), v.Wake()
}

// stillServes returns the status that ends the stream when its scope was
// deleted or now requires the other protocol (once a transition from p is
// over), and nil while it may go on.
func (st *stream) stillServes(v snapshot.View, p model.Protocol) error {
	spec := v.Spec()
	if spec == nil {
		return scopeGone(st.key)
	}
	if !spec.Serves(p, time.Now()) {
		return wrongProtocol(st.key, spec.Protocol, p, st.grpc)
	}
	return nil
}

// watchTransition arms st.ends when the spec v shows serves the stream's
// protocol p only for a transition, and disarms it otherwise; it looks
// again only when the spec changed.
func (st *stream) watchTransition(v snapshot.View, p model.Protocol) {
	spec := v.Spec()
	if spec == st.spec {
		return
	}
	st.spec, st.ends = spec, nil
	if spec != nil && spec.InTransition(p, time.Now()) {
		st.ends = time.After(time.Until(spec.Transition.Until))
	}
}

// handler is one protocol's per-stream logic.
type handler[Req any] interface {
	// handle answers one request from the proxy.
	handle(Req) error
	// push sends what changed in the scope since the stream caught up.
	push() error
	// busy reports whether a response the stream sent is unanswered.
	busy() bool
}

// request is what serve needs of either protocol's requests.
type request interface{ GetNode() *corev3.Node }

// serve runs one ADS stream of either protocol: it binds the stream to the
// scope its first request's node names (or refuses it), then answers
// requests and pushes scope changes until the stream or the server ends.
func serve[Req request](s *Server, p model.Protocol, srv interface {
	Context() context.Context
	Recv() (Req, error)
}, open func(*stream) handler[Req]) error {
	select {
	case <-s.drain:
		return s.draining()
	default:
	}
	ctx := srv.Context()
	if err := s.admit(ctx); err != nil {
		return err
	}
	id, err := s.authenticate(ctx)
	if err != nil {
		return err
	}
	client := clientKey(id, peerIP(ctx))
	if !s.clients.take(client) {
		s.fb.Refuse(model.Key{}, RefusedClientStreamLimit)
		who := "an anonymous client"
		if id != nil {
			who = id.Refused()
		}
		return status.Errorf(codes.ResourceExhausted,
			"%s at %s has %d ADS streams open on this replica, the most one client may (--xds-max-streams-per-client): a proxy needs one stream, a gRPC process one per xDS target; close the others, or raise the limit when many proxies share one identity and one address",
			who, peerIP(ctx), s.opts.MaxStreamsPerClient)
	}
	defer s.clients.release(client)
	s.conns.prove(ctx)
	if err := s.paced(); err != nil {
		return err
	}
	revoked, expired, stop := s.credentialEnds(id)
	defer stop()
	reqs, errc := recv(ctx, srv, s.countRecvError)
	var first Req
	silent := time.NewTimer(s.opts.FirstRequestTimeout)
	select {
	case first = <-reqs:
		silent.Stop()
	case err := <-errc:
		silent.Stop()
		return endOf(err)
	case <-silent.C:
		s.fb.Refuse(model.Key{}, RefusedSilent)
		return status.Errorf(codes.DeadlineExceeded,
			"the stream sent no request within %s of opening: a proxy sends its first DiscoveryRequest at once (--xds-first-request-timeout)", s.opts.FirstRequestTimeout)
	case <-ctx.Done():
		silent.Stop()
		return nil
	}
	// The node is on the first request (the only one, in delta).
	key, sc, err := s.resolve(first.GetNode(), p, id)
	if err != nil {
		return err
	}
	loc := s.locate(id, first.GetNode())
	st := &stream{srv: s, key: key, sc: sc, at: loc, id: s.fb.Connect(key, kept(first.GetNode()), p, peerOf(ctx), id.String(), loc), grpc: isGRPC(first.GetNode()),
		nacks: rate.NewLimiter(rate.Limit(s.opts.NACKsPerSecond), s.opts.NACKBurst)}
	defer s.fb.Disconnect(key, st.id)
	st.read(func(v snapshot.View) { st.caughtUp(v); st.watchTransition(v, p) })
	h := open(st)
	if err := h.handle(first); err != nil {
		return err
	}
	// held is set while a change waits for the proxy to answer what it was
	// sent: a stream pushes only when nothing it sent is unanswered, as
	// go-control-plane's watches answer only a request, so a proxy that
	// lags behind a burst of changes gets their sum in one push when it
	// answers, not each of them queued behind the other.
	held := false
	// A proxy that answers nothing it was sent for the send timeout is
	// ended as one that does not read, whether or not a change waits: what
	// the stream sent it sits in the transport and in the stream's
	// bookkeeping until it is answered, and with nothing more sent to it no
	// send would time out. The timer runs while a response is unanswered
	// and starts again at every answer.
	unanswered := time.NewTimer(s.opts.SendTimeout)
	defer unanswered.Stop()
	answers := st.answers
	watch := func() {
		switch {
		case !h.busy():
			unanswered.Stop()
		case st.answers != answers || !st.waiting:
			unanswered.Reset(s.opts.SendTimeout)
		}
		answers, st.waiting = st.answers, h.busy()
	}
	watch()
	for {
		wake := st.wake
		if held {
			wake = nil
		}
		select {
		case req := <-reqs:
			if err = h.handle(req); err == nil && held && !h.busy() {
				held = false
				err = h.push()
			}
		case <-unanswered.C:
			if held {
				return st.slowReader(ctx, "a change waited %s for it to answer the last one")
			}
			return st.slowReader(ctx, "it answered none of the responses sent to it within %s")
		case <-st.ends:
			// The transition is over, unless the spec changed meanwhile.
			st.read(func(v snapshot.View) {
				st.spec = nil
				if err = st.stillServes(v, p); err == nil {
					st.watchTransition(v, p)
				}
			})
		case <-wake:
			if held = h.busy(); !held {
				err = h.push()
			}
		case err := <-errc:
			return endOf(err)
		case <-ctx.Done():
			return nil
		case <-s.drain:
			return s.draining()
		case <-revoked:
			s.fb.Refuse(model.Key{}, RefusedUnauthenticated)
			if id.Method == auth.MethodPeerAddress {
				return status.Errorf(codes.Unauthenticated, "%s no longer holds its address (deleted, readdressed or no longer Running): reconnect", id.String())
			}
			return status.Errorf(codes.Unauthenticated, "the credentials of %s were revoked: the ServiceAccount or the Pod its token is bound to was deleted", id.String())
		case <-expired:
			s.fb.Refuse(model.Key{}, RefusedUnauthenticated)
			return status.Errorf(codes.Unauthenticated, "the token of %s expired: reconnect with the token the kubelet renewed", id.String())
		}
		if err != nil {
			return err
		}
		watch()
	}
}

// credentialEnds returns what ends a stream of id: the deletion of an
// object its token is bound to, and its token's expiry (nil channels when
// not known), and the function that stops watching them.
func (s *Server) credentialEnds(id *auth.Identity) (<-chan struct{}, <-chan time.Time, func()) {
	if id == nil {
		return nil, nil, func() {}
	}
	revoked, unwatch := s.opts.Authenticator.Gone(id)
	if id.Expiry.IsZero() {
		return revoked, nil, unwatch
	}
	t := time.NewTimer(time.Until(id.Expiry))
	return revoked, t.C, func() { t.Stop(); unwatch() }
}

// endOf turns how a request stream ended into the handler's result.
func endOf(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

// countRecvError counts a request gRPC refused to take as a refusal: one
// larger than MaxRequestBytes (ResourceExhausted), or one that is not a
// valid message (Internal). gRPC has answered the stream itself by then,
// with a status that gives the size and the limit or the parse error; the
// counter is what is left to do.
func (s *Server) countRecvError(err error) {
	switch status.Code(err) {
	case codes.ResourceExhausted:
		s.fb.Refuse(model.Key{}, RefusedRequestTooLarge)
	case codes.Internal:
		s.fb.Refuse(model.Key{}, RefusedMalformed)
	}
}

// recv reads requests into a channel so the stream loop can also wait for
// scope changes; the error channel receives how the stream ended.
func recv[T any](ctx context.Context, stream interface{ Recv() (T, error) }, onErr func(error)) (<-chan T, <-chan error) {
	reqs, errc := make(chan T), make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				onErr(err)
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errc
}
