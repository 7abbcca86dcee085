package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

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
	// new connections, or from a peer that used up its budget of failures
	// (Options.UnauthenticatedStreamsPerPeerPerSecond), before any stream;
	// RefusedSlowReader streams ended
	// because their proxy did not read (Options.SendTimeout).
	RefusedConnectionPaced = "ConnectionPaced"
	RefusedSlowReader      = "SlowReader"
	// RefusedConnectionLimit counts connections closed as they were
	// accepted because the replica, or their peer, holds as many as it may
	// (Options.MaxConnections, MaxConnectionsPerPeer).
	RefusedConnectionLimit = "ConnectionLimit"
	// RefusedConnectionEvicted counts connections closed to make room for
	// a new one where the bounds were reached: each had carried no stream
	// admitted to a scope (conns.take).
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
	// RefusedWrongShard counts streams naming a scope of another shard
	// (Options.Shards), globally: the name may be made up.
	RefusedWrongShard = "WrongShard"
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
	if !s.unauthenticated.Has(s.peerIP(ctx)) {
		s.fb.Refuse(model.Key{}, RefusedPeerPaced)
		return status.Errorf(codes.ResourceExhausted,
			"this client address opened more streams that failed authentication than this replica accepts (%g a second, burst %d): fix the proxy's credentials and reconnect with backoff (--xds-unauthenticated-streams-per-peer-per-second / --xds-unauthenticated-streams-per-peer-burst)",
			s.opts.UnauthenticatedStreamsPerPeerPerSecond, s.opts.UnauthenticatedStreamsPerPeerBurst)
	}
	return nil
}

// paced refuses an authenticated stream beyond the pace of new streams. It
// is spent only after authentication, and only by a stream that presented a
// credential (or an anonymous one, with the insecure opt-out): a stream
// identified by its peer address alone spends its address's budget of
// streams that fail authentication instead (credentialless), so that a
// client without credentials cannot use up the replica's pace for proxies
// that have them. It reports whether the stream spent a share of the pace,
// which it gives back when it turns out to be another shard's (resolve).
func (s *Server) paced(id *auth.Identity) (spent bool, err error) {
	if id != nil && id.Method == auth.MethodPeerAddress {
		return false, nil
	}
	if !s.pace.Allow() {
		s.fb.Refuse(model.Key{}, RefusedPaced)
		return false, status.Errorf(codes.ResourceExhausted,
			"this replica accepts at most %g new ADS streams a second (burst %d), and they are used up: reconnect with backoff, or raise --xds-new-streams-per-second / --xds-new-streams-burst",
			s.opts.NewStreamsPerSecond, s.opts.NewStreamsBurst)
	}
	return true, nil
}

// givePaceBack returns a share of the pace of new streams that a stream
// spent. rate.Limiter has no refund of a used token (a Reservation's
// Cancel restores only one not acted on yet); taking -1 tokens adds one,
// and the bucket's next refill caps it at the burst as always, so a give
// back never lets more than the burst through at once.
func (s *Server) givePaceBack() {
	s.pace.AllowN(time.Now(), -1)
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
		s.unauthenticated.Spend(s.peerIP(ctx))
		return nil, err
	}
	return id, nil
}

// credentialless decides a stream that presented no credential and was
// identified by its peer address, before anything it sends is read. It
// spends its address's budget of streams that fail authentication (admit
// checked it before), as a stream without a credential that is refused
// would: such a client proved nothing, and the replica's pace of new
// streams is kept for proxies that did. A stream that no scope can admit
// (no single Running Pod holds its address, or no scope of that Pod's
// namespace opts in and admits its ServiceAccount) is refused here, with
// the same status and message whichever it is: reading its first request
// (up to --xds-max-request-bytes) first would let any client that reaches
// the port make the replica hold that much per stream for nothing.
func (s *Server) credentialless(ctx context.Context, id *auth.Identity) error {
	if id == nil || id.Method != auth.MethodPeerAddress {
		return nil
	}
	s.unauthenticated.Spend(s.peerIP(ctx))
	if s.anyScopeAdmits(id) || s.opts.OtherShardsAdmit != nil && s.opts.OtherShardsAdmit(id) {
		return nil
	}
	s.fb.Refuse(model.Key{}, RefusedNotAdmitted)
	return status.Errorf(codes.PermissionDenied,
		"no ProxyScope admits %s: a proxy without a credential is admitted only by a scope of its own namespace that sets spec.admitByPeerAddress, when one Running Pod of that namespace holds its address; give the proxy a ServiceAccount token or a SPIFFE certificate otherwise",
		id.Refused())
}

// anyScopeAdmits reports whether some scope of id's namespace admits id.
func (s *Server) anyScopeAdmits(id *auth.Identity) bool {
	if id.Namespace == "" {
		return false
	}
	for _, key := range s.store.Keys() {
		if key.Namespace != id.Namespace {
			continue
		}
		sc := s.store.Get(key)
		if sc == nil {
			continue
		}
		admits := false
		sc.Read(func(v snapshot.View) {
			spec := v.Spec()
			admits = spec != nil && auth.Admits(id, key.Namespace, spec.Proxies, spec.AdmitByPeerAddress)
		})
		if admits {
			return true
		}
	}
	return false
}

// peerIP is the peer of the stream of ctx (its client IPv4 address, or
// IPv6 prefix: peerrate.Key): what per-peer budgets are kept by.
func (s *Server) peerIP(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return peerrate.Key(p.Addr, s.opts.IPv6PrefixLength)
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
// scope. A stream of another shard's scope gives its share of the pace
// back (paid: it spent one), since proxies left on the wrong shard by a
// change of the shard count retry for as long as they run and must not use
// up the pace of the shard's own proxies; it spends its address's budget
// of failed streams instead, as a stream that fails authentication does,
// so that a client cannot open such streams without bound.
func (s *Server) resolve(ctx context.Context, node *corev3.Node, p model.Protocol, id *auth.Identity, paid bool) (model.Key, *snapshot.Snapshot, error) {
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
	if !s.opts.Shards.Owns(key) {
		if paid {
			s.givePaceBack()
		}
		s.unauthenticated.Spend(s.peerIP(ctx))
		s.fb.Refuse(model.Key{}, RefusedWrongShard)
		return model.Key{}, nil, wrongShard(key, s.opts.Shards)
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

// wrongShard is the refusal of a stream that reached a replica of another
// shard than its scope's. It tells the proxy where the scope is served: the
// shard follows from the name alone, so it says nothing of whether the
// scope exists or admits the proxy.
func wrongShard(key model.Key, s shard.Shards) error {
	return status.Errorf(codes.FailedPrecondition,
		"ProxyScope %q is served by shard %d of %d, at %s; this replica is shard %d: point the proxy's xDS server at %s (the scope's bootstrap ConfigMap names it; a proxy reads its bootstrap when it starts)",
		key.String(), s.ShardOf(key), s.Count(), s.AddressOf(key), s.Index, s.AddressOf(key))
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

// clientStreams counts the open ADS streams of each client — an identity
// at one client IP address — against Options.MaxStreamsPerClient.
//
// The bound is what keeps one admitted client from holding the replica's
// memory: gRPC assembles each request whole (up to MaxRequestBytes)
// before the handler sees any of it, and nothing in grpc-go lets the
// server budget those bytes before they are allocated, so what a client
// can make the server hold at once is its streams times MaxRequestBytes. A
// proxy holds one ADS stream, a gRPC process one per xDS target it dials.
// The address is part of the key because many Pods share a ServiceAccount
// (and a SPIFFE ID): each replica of a Deployment has its own address and
// its own count, while one Pod cannot open streams for all of them.
type clientStreams struct {
	max int

	mu   sync.Mutex
	open map[string]int
}

func newClientStreams(max int) *clientStreams {
	return &clientStreams{max: max, open: map[string]int{}}
}

// clientKey names the client of a stream: its identity (nil for an
// anonymous one) at its peer address.
func clientKey(id *auth.Identity, peer string) string {
	return id.String() + "@" + peer
}

// take counts a new stream of client, or reports false when the client
// holds as many as it may.
func (cs *clientStreams) take(client string) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open[client] >= cs.max {
		return false
	}
	cs.open[client]++
	return true
}

// release uncounts a stream of client.
func (cs *clientStreams) release(client string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open[client]--; cs.open[client] <= 0 {
		delete(cs.open, client)
	}
}

// requestedType resolves a request's type URL and checks its name count.
func (st *stream) requestedType(url string, names int) (xdstype.Type, error) {
	t, ok := xdstype.ByURL(url)
	if !ok {
		return 0, unknownType(url)
	}
	if names > st.srv.opts.MaxNamesPerRequest {
		st.srv.fb.Refuse(st.key, RefusedTooManyNames)
		return 0, tooManyNames(names, st.srv.opts.MaxNamesPerRequest)
	}
	return t, nil
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
