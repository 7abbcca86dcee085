package server

import (
	"context"
	"fmt"
	"math"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// GRPCServer returns a gRPC server with the ADS service registered, the
// limits a public control plane needs (GRPCOptions), and the codec that
// sends responses from the shared encoded resources (codec).
func (s *Server) GRPCServer(extra ...grpc.ServerOption) *grpc.Server {
	opts := append(GRPCOptions(s.opts), grpc.ForceServerCodecV2(newCodec()))
	g := grpc.NewServer(append(opts, extra...)...)
	s.Register(g)
	metrics.GRPC.InitializeMetrics(g)
	return g
}

// GRPCOptions are the transport limits of opts (zero fields take the
// defaults) and the gRPC metrics interceptor GRPCServer applies: keepalive
// pings are enforced (a proxy pinging more than every 10 seconds is
// disconnected), dead connections are detected, connections are aged out
// (Options.MaxConnectionAge) so proxies spread over the replicas, requests
// are bounded in size, and so are the streams of one connection (grpc-go's
// rapid-reset protection runs at most that many handlers per connection). The
// benchmark gives its baseline the same, so neither wins by transport
// settings or saved bookkeeping. Before any stream is authenticated, what a
// connection may make the server hold is bounded too: the request headers
// (Options.MaxHeaderListBytes), the handshake's time (HandshakeTimeout),
// and a connection with no stream is closed after MaxConnectionIdle. The
// HTTP/2 receive windows are static (streamWindow, connWindow): grpc-go
// otherwise grows them with its bandwidth estimate up to 16 MiB a stream,
// and what a client can push to a stream the handler is not reading is
// its window. A request being read gets the window of its whole size all
// the same (gRPC opens it for the message), so only what was never asked
// for is bounded by these. gRPC's transport reads without a buffer of its
// own: its default 32 KiB per connection was most of what an idle
// connection held (5,000 of them 187 MiB of live heap), and over TLS it
// only copies what crypto/tls already buffers, without saving a read;
// proxies send a request per change at most, so a plaintext connection's
// few extra reads cost nothing measurable.
func GRPCOptions(opts Options) []grpc.ServerOption {
	opts = opts.withDefaults()
	return []grpc.ServerOption{
		grpc.ChainStreamInterceptor(metrics.GRPC.StreamServerInterceptor()),
		grpc.MaxRecvMsgSize(opts.MaxRequestBytes),
		grpc.MaxConcurrentStreams(uint32(min(opts.MaxStreamsPerConnection, math.MaxUint32))),
		grpc.MaxHeaderListSize(uint32(min(opts.MaxHeaderListBytes, math.MaxUint32))),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.ReadBufferSize(0),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: opts.MaxConnectionIdle,
			MaxConnectionAge:  opts.MaxConnectionAge, MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace,
		}),
	}
}

// streamWindow and connWindow are the HTTP/2 receive windows of a stream
// and of a connection: HTTP/2's default for a stream (an ADS request
// beyond it gets its own window as it is read), and sixteen of them for a
// connection, which is credited back as its bytes arrive.
const (
	streamWindow = 64 << 10
	connWindow   = 16 * streamWindow
)

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

// ServeListener is Serve on an existing listener. It paces the connections
// lis accepts (Options.NewConnectionsPerSecond) and can close the
// connection of a stream whose proxy does not read (Options.SendTimeout).
func (s *Server) ServeListener(ctx context.Context, lis net.Listener, extra ...grpc.ServerOption) error {
	g := s.GRPCServer(extra...)
	budget, stop := context.WithCancel(ctx)
	defer stop()
	go s.budget.run(budget, s.ready)
	return ServeUntil(ctx, g, listener{Listener: lis, s: s}, func() {
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
