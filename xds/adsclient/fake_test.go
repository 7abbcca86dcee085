package adsclient

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
)

// wait bounds every blocking step of a test; generous because CI machines are shared and -race
// is slow.
const wait = 10 * time.Second

// fakeADS is a scripted ADS server: each stream is handed to the test, which reads the client's
// requests and writes responses by hand.
type fakeADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	streams chan *fakeStream
}

// fakeStream is one server-side stream under the test's control.
type fakeStream struct {
	sotw  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer
	delta discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	reqs  chan proto.Message
	end   chan error
}

func (f *fakeADS) serve(ctx context.Context, fs *fakeStream, recv func() (proto.Message, error)) error {
	go func() {
		defer close(fs.reqs)
		for {
			req, err := recv()
			if err != nil {
				return
			}
			select {
			case fs.reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	f.streams <- fs
	select {
	case err := <-fs.end:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	fs := &fakeStream{sotw: stream, reqs: make(chan proto.Message, 1000), end: make(chan error, 1)}
	return f.serve(stream.Context(), fs, func() (proto.Message, error) { return stream.Recv() })
}

func (f *fakeADS) DeltaAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	fs := &fakeStream{delta: stream, reqs: make(chan proto.Message, 1000), end: make(chan error, 1)}
	return f.serve(stream.Context(), fs, func() (proto.Message, error) { return stream.Recv() })
}

// startServer serves a fakeADS on loopback TCP and returns it with a client connection to it.
func startServer(t *testing.T) (*fakeADS, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeADS{streams: make(chan *fakeStream, 10)}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return f, conn
}

// running is a client's Run in the background.
type running struct {
	cancel context.CancelFunc
	errc   chan error
}

// start runs c on conn until the test ends or stop is called.
func start(t *testing.T, c *Client, conn *grpc.ClientConn) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.errc; err != nil {
			t.Logf("Run ended: %v", err) // the test has judged it already, if it cared
		}
	})
	return r
}

// result waits for Run to return and gives its error.
func (r *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.errc:
		r.errc <- err // for the cleanup
		return err
	case <-time.After(wait):
		t.Fatal("Run did not return")
		return nil
	}
}

func (f *fakeADS) nextStream(t *testing.T) *fakeStream {
	t.Helper()
	select {
	case fs := <-f.streams:
		return fs
	case <-time.After(wait):
		t.Fatal("no stream opened")
		return nil
	}
}

func (fs *fakeStream) next(t *testing.T) proto.Message {
	t.Helper()
	select {
	case req, ok := <-fs.reqs:
		if !ok {
			t.Fatal("stream ended while waiting for a request")
		}
		return req
	case <-time.After(wait):
		t.Fatal("no request received")
		return nil
	}
}

func (fs *fakeStream) nextSotW(t *testing.T) *discoveryv3.DiscoveryRequest {
	t.Helper()
	return fs.next(t).(*discoveryv3.DiscoveryRequest)
}

func (fs *fakeStream) nextDelta(t *testing.T) *discoveryv3.DeltaDiscoveryRequest {
	t.Helper()
	return fs.next(t).(*discoveryv3.DeltaDiscoveryRequest)
}

// quiet fails if the client sends anything within d: it catches resend loops and spurious
// requests.
func (fs *fakeStream) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case req, ok := <-fs.reqs:
		if ok {
			t.Fatalf("unexpected request: %v", req)
		}
	case <-time.After(d):
	}
}

func (fs *fakeStream) send(t *testing.T, resp proto.Message) {
	t.Helper()
	var err error
	switch r := resp.(type) {
	case *discoveryv3.DiscoveryResponse:
		err = fs.sotw.Send(r)
	case *discoveryv3.DeltaDiscoveryResponse:
		err = fs.delta.Send(r)
	default:
		err = errors.New("not a response")
	}
	if err != nil {
		t.Fatalf("send: %v", err)
	}
}

// wantReq fails the test if got differs from want.
func wantReq(t *testing.T, want, got proto.Message) {
	t.Helper()
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
		t.Fatalf("request mismatch (-want +got):\n%s", d)
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func cluster(t *testing.T, name string) *anypb.Any {
	return mustAny(t, &clusterv3.Cluster{Name: name})
}

// cla builds a ClusterLoadAssignment whose single endpoint address tells versions apart.
func cla(t *testing.T, name, addr string) *anypb.Any {
	return mustAny(t, &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
						SocketAddress: &corev3.SocketAddress{Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 80}},
					}},
				}},
			}},
		}},
	})
}

func listener(t *testing.T, name string) *anypb.Any {
	return mustAny(t, &listenerv3.Listener{Name: name})
}

func route(t *testing.T, name string) *anypb.Any {
	return mustAny(t, &routev3.RouteConfiguration{Name: name})
}

func sotwResp(typeURL, version, nonce string, rs ...*anypb.Any) *discoveryv3.DiscoveryResponse {
	return &discoveryv3.DiscoveryResponse{TypeUrl: typeURL, VersionInfo: version, Nonce: nonce, Resources: rs}
}

func deltaRes(name, version string, a *anypb.Any) *discoveryv3.Resource {
	return &discoveryv3.Resource{Name: name, Version: version, Resource: a}
}

// versions reduces held state to name -> version for comparisons.
func versions(h map[string]Held) map[string]string {
	out := map[string]string{}
	for n, r := range h {
		out[n] = r.Version
	}
	return out
}

// waitState blocks until the client holds exactly want (name -> version) for typeURL.
func waitState(t *testing.T, c *Client, typeURL string, want map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	err := c.WaitFor(ctx, func(c *Client) bool {
		return cmp.Equal(want, versions(c.State(typeURL)))
	})
	if err != nil {
		t.Fatalf("state of %s: want %v, have %v", typeURL, want, versions(c.State(typeURL)))
	}
}

var testNode = &corev3.Node{Id: "proxy-1", Cluster: "test"}
