package server

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

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
	// protocol is the stream's; price frames what it sends in the other.
	protocol model.Protocol
	price    pricer
	// nacks paces the rejections the stream gets reported (rejected).
	nacks *rate.Limiter
	// spec is the spec the stream last looked at; ends fires when a
	// transition that still serves the stream's protocol is over.
	spec *model.Scope
	ends <-chan time.Time
	// grpc is set for a gRPC client (see isGRPC), which is told a different
	// fix when its scope stops serving its protocol, and whose SotW claims
	// of assignments and route configurations are not adopted (sotw.adopt).
	grpc bool
	// answers counts the responses the proxy answered (ACK or NACK), and
	// waiting is set while one is unanswered: serve's send timeout runs
	// from the first unanswered response, or the last answer since.
	answers uint64
	waiting bool
}

// nextNonce is the nonce of the stream's next response: its count, and
// nonceRandom random characters that a proxy learns only by reading the
// response. An answer (ACK or NACK) restarts the send timeout, so it must
// prove that the proxy read what it answers: with counted nonces alone, a
// client that grants no HTTP/2 window (and so reads nothing) could answer
// nonces it guessed and keep its stream, and everything queued for it, for
// as long as it liked.
func (st *stream) nextNonce() string {
	st.nonce++
	const digits = "0123456789abcdefghijklmnopqrstuv"
	b := strconv.AppendUint(make([]byte, 0, 21+nonceRandom), st.nonce, 10)
	b = append(b, '.')
	for r, i := rand.Uint64(), 0; i < nonceRandom; i++ {
		b = append(b, digits[r&31])
		r >>= 5
	}
	return string(b)
}

// nonceRandom is how many random characters a nonce carries (5 bits each).
const nonceRandom = 8

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
	if err := s.credentialless(ctx, id); err != nil {
		return err
	}
	client := clientKey(id, s.peerIP(ctx))
	if !s.clients.take(client) {
		s.fb.Refuse(model.Key{}, RefusedClientStreamLimit)
		who := "an anonymous client"
		if id != nil {
			who = id.Refused()
		}
		return status.Errorf(codes.ResourceExhausted,
			"%s at %s has %d ADS streams open on this replica, the most one client may (--xds-max-streams-per-client): a proxy needs one stream, a gRPC process one per xDS target; close the others, or raise the limit when many proxies share one identity and one address",
			who, s.peerIP(ctx), s.opts.MaxStreamsPerClient)
	}
	defer s.clients.release(client)
	paid, err := s.paced(id)
	if err != nil {
		return err
	}
	cn := s.conns.of(ctx)
	charged, err := s.budget.take(client, cn)
	if err != nil {
		s.fb.Refuse(model.Key{}, RefusedMemoryBudget)
		return err
	}
	defer s.budget.release(charged)
	revoked, expired, stop := s.credentialEnds(id)
	defer stop()
	reqs, errc := recv(ctx, srv, s.countRecvError, cn.taken)
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
	case <-charged.shed:
		silent.Stop()
		return s.shedError()
	}
	// The node is on the first request (the only one, in delta).
	key, sc, err := s.resolve(ctx, first.GetNode(), p, id, paid)
	if err != nil {
		return err
	}
	s.conns.admitted(ctx)
	s.budget.admit(charged)
	loc := s.locate(id, first.GetNode())
	st := &stream{srv: s, key: key, sc: sc, at: loc, id: s.fb.Connect(key, kept(first.GetNode()), p, peerOf(ctx), id.String(), loc), grpc: isGRPC(first.GetNode()),
		nacks: rate.NewLimiter(rate.Limit(s.opts.NACKsPerSecond), s.opts.NACKBurst), protocol: p, price: newPricer(p)}
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
		case <-charged.shed:
			return s.shedError()
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
// scope changes; the error channel receives how the stream ended. It calls
// taken once the handler took a request (what the memory budget counts a
// proxy holding ends there).
func recv[T any](ctx context.Context, stream interface{ Recv() (T, error) }, onErr func(error), taken func()) (<-chan T, <-chan error) {
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
				taken()
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errc
}

// sendWithin sends m on g, or gives up once the send timeout passed: gRPC's
// Send blocks while the stream's HTTP/2 flow control has no room, which is
// for as long as the proxy does not read what it was sent before. It then
// closes the stream's connection (freeing what the transport buffers for
// it) and returns the status that ends the stream. The Send goroutine
// returns once the stream is done, which ending the handler makes it.
func (st *stream) sendWithin(g grpc.ServerStream, m any) error {
	sent := make(chan error, 1)
	go func() { sent <- g.SendMsg(m) }()
	timeout := time.NewTimer(st.srv.opts.SendTimeout)
	defer timeout.Stop()
	select {
	case err := <-sent:
		return err
	case <-timeout.C:
	}
	return st.slowReader(g.Context(), "the next one waited %s for room in the stream")
}

// slowReader ends a stream whose proxy does not read or answer what it was
// sent, saying how (a format taking the send timeout), and closes its
// connection. The status cannot reach a proxy that does not read (it would
// queue behind what the proxy left unread); it stays for the server's own
// accounting, gRPC's handled-streams metric.
func (st *stream) slowReader(ctx context.Context, how string) error {
	st.srv.fb.Refuse(st.key, RefusedSlowReader)
	st.srv.conns.close(ctx)
	return status.Errorf(codes.DeadlineExceeded,
		"the proxy did not read the responses sent to it: "+how+" (--xds-send-timeout); the stream and its connection are closed", st.srv.opts.SendTimeout)
}
