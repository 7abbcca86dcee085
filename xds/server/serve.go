package server

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// MaxRecvMsgSize bounds one request from a proxy. A reconnecting delta proxy
// lists every resource it holds in initial_resource_versions, which passes
// gRPC's 4 MiB default for large scopes, so the bound is higher.
const MaxRecvMsgSize = 32 << 20

// GRPCServer returns a gRPC server with the ADS service registered and the
// limits a public control plane needs: keepalive pings are enforced (a proxy
// pinging more than every 10 seconds is disconnected), dead connections are
// detected, and requests are bounded in size.
func (s *Server) GRPCServer(extra ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append(GRPCOptions(), extra...)...)
	s.Register(g)
	metrics.GRPC.InitializeMetrics(g)
	return g
}

// GRPCOptions are the transport limits and the gRPC metrics interceptor
// GRPCServer applies; the benchmark gives its baseline the same, so neither
// wins by transport settings or saved bookkeeping.
func GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainStreamInterceptor(metrics.GRPC.StreamServerInterceptor()),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

// Drain ends every open stream with Unavailable, so proxies reconnect (to
// another replica, or to this one when it comes back), and refuses new ones.
func (s *Server) Drain() {
	s.drainOnce.Do(func() { close(s.drain) })
}

func (s *Server) draining() error {
	return status.Error(codes.Unavailable, "the control plane is shutting down: reconnect")
}

// Serve listens on addr and serves ADS until ctx ends, then drains the
// streams and stops gracefully. It runs on every replica: all of them serve
// xDS, whether or not they lead.
func (s *Server) Serve(ctx context.Context, addr string, extra ...grpc.ServerOption) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("xDS listener on %s: %w", addr, err)
	}
	return s.ServeListener(ctx, lis, extra...)
}

// ServeListener is Serve on an existing listener.
func (s *Server) ServeListener(ctx context.Context, lis net.Listener, extra ...grpc.ServerOption) error {
	g := s.GRPCServer(extra...)
	return ServeUntil(ctx, g, lis, func() {
		s.Drain()
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			g.Stop()
		}
	})
}

// ServeUntil serves g on lis until ctx ends and then calls stop, or returns
// the error that ended serving first.
func ServeUntil(ctx context.Context, g *grpc.Server, lis net.Listener, stop func()) error {
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		stop()
		return nil
	}
}
