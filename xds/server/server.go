// Package server is scopeplane's ADS gRPC service. It serves both xDS
// variants from the shared per-scope snapshots: State of the World
// (StreamAggregatedResources) and delta (DeltaAggregatedResources). Each
// stream is bound to the ProxyScope its node names in metadata, and refused
// with a status that says what to fix when that scope is missing, unknown, or
// requires the other protocol.
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Options bound what one proxy can make the server do.
type Options struct {
	// MaxNamesPerRequest bounds the resource names (subscribed, unsubscribed
	// or claimed in initial_resource_versions) one request may carry.
	MaxNamesPerRequest int
}

// DefaultOptions are the limits used when an Options field is zero.
var DefaultOptions = Options{MaxNamesPerRequest: 100_000}

// Server implements the ADS service over a snapshot store.
type Server struct {
	store     *snapshot.Store
	fb        *feedback.Tracker
	opts      Options
	drain     chan struct{}
	drainOnce sync.Once
}

var _ discoveryv3.AggregatedDiscoveryServiceServer = (*Server)(nil)

// New returns a server that serves store and reports to fb.
func New(store *snapshot.Store, fb *feedback.Tracker, opts Options) *Server {
	if opts.MaxNamesPerRequest <= 0 {
		opts.MaxNamesPerRequest = DefaultOptions.MaxNamesPerRequest
	}
	return &Server{store: store, fb: fb, opts: opts, drain: make(chan struct{})}
}

// Register adds the ADS service to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s)
}

// resolve binds a stream to the scope its node names, or refuses it.
func (s *Server) resolve(node *corev3.Node, p model.Protocol) (model.Key, *snapshot.Snapshot, error) {
	value := node.GetMetadata().GetFields()[model.ScopeMetadataKey].GetStringValue()
	if value == "" {
		s.fb.Refuse(model.Key{}, feedback.RefusedNoScope)
		return model.Key{}, nil, status.Errorf(codes.InvalidArgument,
			"node %q names no ProxyScope: set node.metadata[%q] to \"<namespace>/<name>\" of a ProxyScope in the proxy's bootstrap",
			node.GetId(), model.ScopeMetadataKey)
	}
	key, err := parseScope(value)
	if err != nil {
		s.fb.Refuse(model.Key{}, feedback.RefusedNoScope)
		return model.Key{}, nil, status.Errorf(codes.InvalidArgument,
			"node %q: node.metadata[%q] = %q is not \"<namespace>/<name>\" of a ProxyScope: %v",
			node.GetId(), model.ScopeMetadataKey, value, err)
	}
	sc := s.store.Get(key)
	var spec *model.Scope
	if sc != nil {
		sc.Read(func(v snapshot.View) { spec = v.Spec() })
	}
	if spec == nil {
		s.fb.Refuse(model.Key{}, feedback.RefusedUnknownScope)
		return model.Key{}, nil, status.Errorf(codes.NotFound,
			"node %q names ProxyScope %q, which does not exist (or is not built yet): create it, or fix node.metadata[%q]",
			node.GetId(), value, model.ScopeMetadataKey)
	}
	if !spec.Serves(p, time.Now()) {
		s.fb.Refuse(key, feedback.RefusedWrongProto)
		return model.Key{}, nil, wrongProtocol(key, spec.Protocol, p)
	}
	return key, sc, nil
}

// wrongProtocol is the refusal for a stream of the other xDS variant.
func wrongProtocol(key model.Key, want, got model.Protocol) error {
	return status.Errorf(codes.FailedPrecondition,
		"ProxyScope %q requires the %s protocol (spec.protocol: %s) but this proxy opened a %s stream: set api_type: %s in the ADS config of its bootstrap, or change the scope's spec.protocol",
		key.String(), want, want, got, want.APIType())
}

func parseScope(v string) (model.Key, error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok || strings.Contains(name, "/") {
		return model.Key{}, fmt.Errorf("want exactly one '/'")
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return model.Key{}, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return model.Key{}, fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
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
	return status.Errorf(codes.InvalidArgument, "a request carries %d resource names; the limit is %d per request", n, limit)
}

// stream is the state both protocols keep per ADS stream: which scope it
// serves, and up to which revision of that scope it has caught up.
type stream struct {
	srv     *Server
	key     model.Key
	sc      *snapshot.Snapshot
	id      uint64
	rev     uint64
	ver     string
	revTime time.Time
	wake    <-chan struct{}
	nonce   uint64
	// spec is the spec the stream last looked at; ends fires when a
	// transition that still serves the stream's protocol is over.
	spec *model.Scope
	ends <-chan time.Time
}

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
		return wrongProtocol(st.key, spec.Protocol, p)
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
	reqs, errc := recv(ctx, srv)
	var first Req
	select {
	case first = <-reqs:
	case err := <-errc:
		return endOf(err)
	case <-ctx.Done():
		return nil
	}
	// The node is on the first request (the only one, in delta).
	key, sc, err := s.resolve(first.GetNode(), p)
	if err != nil {
		return err
	}
	st := &stream{srv: s, key: key, sc: sc, id: s.fb.Connect(key, first.GetNode(), p)}
	defer s.fb.Disconnect(key, st.id)
	sc.Read(func(v snapshot.View) { st.caughtUp(v); st.watchTransition(v, p) })
	h := open(st)
	if err := h.handle(first); err != nil {
		return err
	}
	for {
		select {
		case req := <-reqs:
			err = h.handle(req)
		case <-st.ends:
			// The transition is over, unless the spec changed meanwhile.
			sc.Read(func(v snapshot.View) {
				st.spec = nil
				if err = st.stillServes(v, p); err == nil {
					st.watchTransition(v, p)
				}
			})
		case <-st.wake:
			err = h.push()
		case err := <-errc:
			return endOf(err)
		case <-ctx.Done():
			return nil
		case <-s.drain:
			return s.draining()
		}
		if err != nil {
			return err
		}
	}
}

// endOf turns how a request stream ended into the handler's result.
func endOf(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

// recv reads requests into a channel so the stream loop can also wait for
// scope changes; the error channel receives how the stream ended.
func recv[T any](ctx context.Context, stream interface{ Recv() (T, error) }) (<-chan T, <-chan error) {
	reqs, errc := make(chan T), make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
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
