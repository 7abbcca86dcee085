package hostile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// podTable is the Pod index as the informer would fill it, for a server
// without an API server: the index itself runs against a real one in
// internal/controlplane. Changed's channels close when a Pod is removed.
type podTable struct {
	mu    sync.Mutex
	pods  map[netip.Addr][]auth.Pod
	nodes map[netip.Addr]bool
	gone  map[string]chan struct{}
}

func (p *podTable) Holders(addr netip.Addr) ([]auth.Pod, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[addr], p.nodes[addr], nil
}

func (p *podTable) Changed(uid string, _ netip.Addr) (<-chan struct{}, func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone[uid] == nil {
		p.gone[uid] = make(chan struct{})
	}
	return p.gone[uid], func() {}
}

// remove deletes the Pod at addr, as its deletion would.
func (p *podTable) remove(addr netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range p.pods[addr] {
		if ch := p.gone[pod.UID]; ch != nil {
			close(ch)
			delete(p.gone, pod.UID)
		}
	}
	delete(p.pods, addr)
}

// peerPlane is a pipeline whose server authenticates tokens and, for a
// stream without a credential, the peer address by pods, serving one
// Service in scope default/opted, which admits by peer address.
func peerPlane(t *testing.T, pods auth.PodIndex) *pipeline.Pipeline {
	a := &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), nil), PeerAddress: true, Pods: pods}
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("default", "one", "10.0.0.1"))
	opted := scope("opted", model.SotW)
	opted.AdmitByPeerAddress = true
	p.Catalog.UpsertScope(opted)
	p.Sync()
	return p
}

// TestPeerAddressAttacks is the peer-address method's hostile rows: a
// client without credentials from an address no Pod holds (a spoofed or
// foreign source), from an address two Pods claim, from a Node's address,
// and a client whose Pod the scope would admit but which does not opt in;
// each is refused exactly as a scope that does not exist, naming only the
// address, with or without the published key's JWT. An admitted client's
// stream ends when its Pod goes.
func TestPeerAddressAttacks(t *testing.T) {
	const (
		client  = "127.0.0.4" // one Running Pod, ServiceAccount grpc
		shared  = "127.0.0.5" // two Pods
		node    = "127.0.0.6" // a Node's address
		unknown = "127.0.0.7" // no Pod
	)
	pod := func(name string) auth.Pod {
		return auth.Pod{Namespace: "default", Name: name, UID: name + "-uid", ServiceAccount: "grpc", Running: true}
	}
	pods := &podTable{
		pods: map[netip.Addr][]auth.Pod{
			netip.MustParseAddr(client): {pod("client")},
			netip.MustParseAddr(shared): {pod("twin-a"), pod("twin-b")},
			netip.MustParseAddr(node):   {pod("on-node")},
		},
		nodes: map[netip.Addr]bool{netip.MustParseAddr(node): true},
		gone:  map[string]chan struct{}{},
	}
	p := peerPlane(t, pods)
	p.Catalog.UpsertScope(scope("closed", model.SotW))
	p.Sync()
	addr := serve(t, p)
	now := time.Now()
	published := authtest.NewRSAIssuer(t, auth.PublishedKeyID).Sign(authtest.SAClaims("default", "grpc", "https://"+addr+"/x", now, now.Add(time.Hour)))

	// open opens a stream from ip naming scope, with the published key's
	// JWT when withKey, and returns it once answered, or how it ended.
	open := func(ctx context.Context, ip, scope string, withKey bool) (grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(ip)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if withKey {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+published)
		}
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", scope), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_, err = s.Recv()
		return s, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	refusal := func(scope, ip string) string {
		return "ProxyScope \"" + scope + "\" does not exist or does not admit the client at " + ip +
			", which presented no credential: a scope admits the ServiceAccounts of its own namespace, narrowed by its spec.proxies; a proxy without a credential only when the scope sets spec.admitByPeerAddress and one Running Pod of that namespace holds its address"
	}
	// An address that stands for no Pod is refused before its first
	// request is read, the same way whichever of these it is.
	nowhere := func(_, ip string) string {
		return "no ProxyScope admits the client at " + ip + ", which presented no credential: a proxy without a credential is admitted only by a scope of its own namespace that sets spec.admitByPeerAddress, when one Running Pod of that namespace holds its address; give the proxy a ServiceAccount token or a SPIFFE certificate otherwise"
	}
	for _, tc := range []struct {
		name, ip, scope string
		refusal         func(scope, ip string) string
	}{
		{"spoofed or foreign address, no Pod holds it", unknown, "default/opted", nowhere},
		{"address two Pods hold", shared, "default/opted", nowhere},
		{"a Node's address", node, "default/opted", nowhere},
		{"a Pod the scope would admit, scope not opted in", client, "default/closed", refusal},
		{"a Pod the scope would admit, scope does not exist", client, "default/nope", refusal},
	} {
		for _, withKey := range []bool{false, true} {
			name := tc.name
			if withKey {
				name += ", published key"
			}
			t.Run(name, func(t *testing.T) {
				_, err := open(ctx, tc.ip, tc.scope, withKey)
				if st := status.Convert(err); st.Code() != codes.PermissionDenied || st.Message() != tc.refusal(tc.scope, tc.ip) {
					t.Fatalf("ended with %v %q,\nwant %v %q", st.Code(), st.Message(), codes.PermissionDenied, tc.refusal(tc.scope, tc.ip))
				}
			})
		}
	}
	if r := p.Feedback.Get(model.Key{}).Refused[server.RefusedNotAdmitted]; r != 10 {
		t.Errorf("%v NotAdmitted refusals counted, want 10", r)
	}

	// The admitted client's stream ends when its Pod is deleted.
	s, err := open(ctx, client, "default/opted", true)
	if err != nil {
		t.Fatalf("the client of the one Running Pod, in a scope that opts in: %v", err)
	}
	pods.remove(netip.MustParseAddr(client))
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	if st := status.Convert(err); st.Code() != codes.Unauthenticated ||
		st.Message() != "system:serviceaccount:default:grpc (pod client, by peer address 127.0.0.4) no longer holds its address (deleted, readdressed or no longer Running): reconnect" {
		t.Fatalf("the stream of a deleted Pod ended with %v %q", st.Code(), st.Message())
	}
	if _, err := open(ctx, client, "default/opted", false); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a new stream from the deleted Pod's address: %v, want PermissionDenied", err)
	}
}

// TestPeerAddressAfterJobs has a tenant's completed and failed Job Pods,
// in a namespace of their own, still list the address the kubelet has
// since given a Running Pod of namespace default (a Job's Pods stay until
// deleted): they hold no address, and that Pod's proxy, presenting no
// credential, must join its scope as the Pod, every time it tries.
func TestPeerAddressAfterJobs(t *testing.T) {
	const reused = "127.0.0.8"
	job := func(name string) auth.Pod {
		return auth.Pod{Namespace: "batch", Name: name, UID: name + "-uid", ServiceAccount: "job", Terminal: true}
	}
	pods := &podTable{
		pods: map[netip.Addr][]auth.Pod{netip.MustParseAddr(reused): {
			job("job-done"), job("job-failed"),
			{Namespace: "default", Name: "client", UID: "client-uid", ServiceAccount: "grpc", Running: true},
		}},
		gone: map[string]chan struct{}{},
	}
	p := peerPlane(t, pods)
	addr := serve(t, p)
	joined, slowest := joins(t, "a reused address", 5, func() (time.Duration, error) {
		start := time.Now()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(from(reused)))
		if err != nil {
			return 0, err
		}
		defer func() { _ = conn.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			return 0, err
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("client", "default/opted"), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		r, err := s.Recv()
		if err != nil {
			return 0, err
		}
		if len(r.GetResources()) != 1 {
			return 0, fmt.Errorf("%d clusters, want 1", len(r.GetResources()))
		}
		return time.Since(start), nil
	})
	t.Logf("\n| a Running Pod's address still listed by a Succeeded and a Failed Pod of another namespace | %d of 5 joined, slowest %s |", joined, slowest.Round(time.Millisecond))
	if r := p.Feedback.Get(model.Key{}).Refused[server.RefusedNotAdmitted]; r != 0 {
		t.Errorf("%v NotAdmitted refusals counted, want none", r)
	}
}
