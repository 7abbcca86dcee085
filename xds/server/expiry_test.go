package server_test

import (
	"context"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestStreamEndsWhenItsTokenExpires opens a stream with a token that
// expires two seconds later: the stream is served, and ends with
// Unauthenticated when the token expires, so that the proxy reconnects
// with the token the kubelet renewed (before, it lasted until the
// connection's age).
func TestStreamEndsWhenItsTokenExpires(t *testing.T) {
	ap := startAuthnPlane(t)
	now := time.Now()
	token := ap.iss.Sign(authtest.SAClaims("shop", "envoy", "scopeplane", now.Add(-time.Minute), now.Add(2*time.Second)))
	conn, err := grpc.NewClient(ap.addr, grpc.WithTransportCredentials(credentials.NewTLS(ap.ca.ClientTLS(nil, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token), testkit.Timeout)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", "shop/open"), TypeUrl: xdstype.Cluster.URL()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("the stream was not served before its token expired: %v", err)
	}
	for {
		_, err := s.Recv()
		if err == nil {
			continue
		}
		if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != "the token of system:serviceaccount:shop:envoy (pod envoy-7f9) expired: reconnect with the token the kubelet renewed" {
			t.Fatalf("the stream ended with %v, want Unauthenticated at the token's expiry", err)
		}
		return
	}
}
