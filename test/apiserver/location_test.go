package apiserver

import (
	"context"
	"fmt"
	"net"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestProxyLocation places proxies by what is most trusted: a proxy whose
// token the real API server bound to a pod on a zoned Node is in that
// Node's zone whatever its bootstrap declares; one whose token names no pod
// is where its bootstrap says. CSDS shows both, and a NACK carries the zone
// into status.
func TestProxyLocation(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create(t, env,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "envoy"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"app": "web"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
		scope("shop", "s", "web", xdsv1alpha1.ProtocolSotW),
	)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "envoy-1"},
		Spec: corev1.PodSpec{ServiceAccountName: "envoy", NodeName: "node-a", Containers: []corev1.Container{{Name: "envoy", Image: "envoy"}}}}
	create(t, env, pod)
	mint := func(bound *corev1.Pod) string {
		spec := authenticationv1.TokenRequestSpec{Audiences: []string{auth.DefaultAudience}, ExpirationSeconds: ptr.To(int64(600))}
		if bound != nil {
			spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		tr, err := cs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "envoy", &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	a, err := auth.Config{Methods: "token", Audience: auth.DefaultAudience}.Build(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, env, "a", controlplane.Options{Server: server.Options{Authenticator: a}, AdminListener: admin})

	// on-node: bound to the pod on node-a, declaring another zone; declared:
	// a token of no pod, declaring zone-b. on-node rejects the clusters.
	located := func(id, zone string) *corev3.Node {
		n := testkit.Node(id, "shop/s")
		n.Locality = &corev3.Locality{Zone: zone}
		return n
	}
	reject := func(typeURL string, _ []*anypb.Any, _ []string) string {
		if typeURL == xdstype.Cluster.URL() {
			return "refused by the test"
		}
		return ""
	}
	runLocated(t, r.addr, mint(pod), located("on-node", "zone-x"), reject)
	runLocated(t, r.addr, mint(nil), located("declared", "zone-b"), nil)

	conn, err := grpc.NewClient(admin.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	want := map[string]string{
		"on-node":  fmt.Sprintf("zone-a (%s, node-a)", model.LocatedByNode),
		"declared": fmt.Sprintf("zone-b (%s, )", model.LocatedByBootstrap),
	}
	testkit.Eventually(t, "CSDS places both proxies", func() (bool, string) {
		resp, err := statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{})
		if err != nil {
			return false, err.Error()
		}
		got := map[string]string{}
		for _, cc := range resp.GetConfig() {
			if n := cc.GetNode(); n != nil {
				meta := n.GetMetadata().GetFields()
				got[n.GetId()] = fmt.Sprintf("%s (%s, %s)", n.GetLocality().GetZone(), meta[csds.ZoneSourceKey].GetStringValue(), meta[csds.NodeNameKey].GetStringValue())
			}
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	testkit.Eventually(t, "the NACK in status names the Node's zone", func() (bool, string) {
		ps, err := getScope(t, env, "shop", "s")
		if err != nil {
			return false, err.Error()
		}
		for _, n := range ps.Status.RecentNACKs {
			if n.Node == "on-node" {
				return n.Zone == "zone-a", fmt.Sprintf("%+v", n)
			}
		}
		return false, fmt.Sprintf("%+v", ps.Status.RecentNACKs)
	})
}

// runLocated keeps one SotW proxy of node connected to addr with token as its
// credentials for the rest of the test.
func runLocated(t *testing.T, addr, token string, node *corev3.Node, reject func(string, []*anypb.Any, []string) string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testkit.WildcardClient(adsclient.SotW, node)
	cfg.Reject = reject
	c := adsclient.New(cfg)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx, conn)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close()
	})
}
