// Package whoami is a one-method gRPC service that answers with the name of
// the backend that served the call. The demo and the end-to-end tests run it
// as real backends on 127.0.0.1, to see where xDS routes traffic.
package whoami

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Method is the full name of the service's only method.
const Method = "/scopeplane.whoami.Whoami/Get"

type server struct {
	name string
	*behaviour
}

// behaviour is how a backend misbehaves, as set by Behave.
type behaviour struct {
	delay     atomic.Int64 // nanoseconds
	failEvery atomic.Int64
	mu        sync.Mutex
	calls     map[string]int64 // by the caller's address
}

// count counts a call from the caller of ctx and returns how many it made.
func (b *behaviour) count(ctx context.Context) int64 {
	from := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		from = p.Addr.String()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls == nil {
		b.calls = map[string]int64{}
	}
	b.calls[from]++
	return b.calls[from]
}

func (s server) get(ctx context.Context, _ *emptypb.Empty) (*wrapperspb.StringValue, error) {
	n := s.count(ctx)
	if d := time.Duration(s.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if every := s.failEvery.Load(); every > 0 && n%every == 0 {
		return nil, status.Errorf(codes.Unavailable, "%s fails every %d calls", s.name, every)
	}
	return wrapperspb.String(s.name), nil
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "scopeplane.whoami.Whoami",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Get",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := &emptypb.Empty{}
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(server).get(ctx, in)
		},
	}},
}

// Backend is a running whoami server.
type Backend struct {
	Name string
	Port int
	srv  *grpc.Server
	*behaviour
}

// Start serves whoami as name on 127.0.0.1 on a free port.
func Start(name string) (*Backend, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return Serve(name, lis), nil
}

// Serve serves whoami as name on lis, a TCP listener: the client matrix
// listens inside a network namespace it made.
func Serve(name string, lis net.Listener) *Backend {
	g := grpc.NewServer()
	b := &behaviour{}
	g.RegisterService(&serviceDesc, server{name: name, behaviour: b})
	go func() { _ = g.Serve(lis) }()
	return &Backend{Name: name, Port: lis.Addr().(*net.TCPAddr).Port, srv: g, behaviour: b}
}

// Behave makes the backend answer every call after delay, and fail every
// failEvery-th call (0: none) of each caller's address with UNAVAILABLE: a
// slow or a flaky backend, for timeouts and retries to be seen working.
// Counting by caller, a client's retry of a failed call is its next call
// however many other clients call meanwhile.
func (b *Backend) Behave(delay time.Duration, failEvery int) {
	b.delay.Store(int64(delay))
	b.failEvery.Store(int64(failEvery))
}

// Stop stops the backend.
func (b *Backend) Stop() { b.srv.Stop() }

// GracefulStop stops accepting calls and waits for those in flight, as a
// backend Pod does when it terminates during a rollout.
func (b *Backend) GracefulStop() { b.srv.GracefulStop() }

// Call asks the server behind conn who it is.
func Call(ctx context.Context, conn *grpc.ClientConn) (string, error) {
	out := &wrapperspb.StringValue{}
	if err := conn.Invoke(ctx, Method, &emptypb.Empty{}, out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

// SliceAddress is the address EndpointSlices list for local backends. The
// API server refuses loopback addresses in EndpointSlices, so they carry
// this TEST-NET-1 address (RFC 5737: never routed) instead, and clients dial
// through Dialer, which delivers connections for it to 127.0.0.1 on the same
// port. Nothing is ever sent to SliceAddress itself.
const SliceAddress = "192.0.2.1"

// Dialer is a gRPC context dialer that connects SliceAddress:port to
// 127.0.0.1:port and every other address as it is.
func Dialer(ctx context.Context, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if host == SliceAddress {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
