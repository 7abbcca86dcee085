package testkit

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ServeTLS runs serve (an xDS server's ServeListener) over TLS with cfg on a
// loopback port until the test ends, fails the test if serving ends with an
// error, and returns the port's address.
func ServeTLS(t testing.TB, serve func(context.Context, net.Listener, ...grpc.ServerOption) error, cfg *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, lis, grpc.Creds(credentials.NewTLS(cfg))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}
