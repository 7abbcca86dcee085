package apiserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/controllers/tokenbindings"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestRevokedTokensAreRefused mints tokens with the real API server's
// TokenRequest and revokes them as Kubernetes does: a token bound to a Pod
// whose Pod is deleted (its open stream ends with Unauthenticated, and it
// cannot reconnect), a token of a deleted ServiceAccount, and one of a
// ServiceAccount deleted and created again under the same name (another
// UID). Each is verified locally against the issuer's keys, which say
// nothing of revocation: the informer cache of the objects' metadata does.
func TestRevokedTokensAreRefused(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newSA := func() *corev1.ServiceAccount {
		sa, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "envoy"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sa
	}
	newSA()
	pod, err := cs.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "envoy-1"},
		Spec:       corev1.PodSpec{ServiceAccountName: "envoy", Containers: []corev1.Container{{Name: "envoy", Image: "envoy"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(bound *corev1.Pod) string {
		spec := authenticationv1.TokenRequestSpec{Audiences: []string{"scopeplane"}, ExpirationSeconds: ptr.To(int64(3600))}
		if bound != nil {
			spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		tr, err := cs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "envoy", &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	a, err := auth.Config{Methods: "token", Audience: "scopeplane"}.Build(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(env.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if a.Bindings, err = tokenbindings.New(ctx, c); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}

	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(&model.Scope{
		Key: model.Key{Namespace: "shop", Name: "s"}, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 10080},
		Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}},
	})
	p.Sync()
	addr := serveXDS(t, p)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	// open opens a stream with token and returns it once served, or the
	// status it was refused with.
	open := func(token string) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
		sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(&discoveryv3.DiscoveryRequest{Node: testkit.Node("n", "shop/s"), TypeUrl: xdstype.Cluster.URL()}); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		_, err = s.Recv()
		return s, err
	}
	refused := func(what, token, says string) {
		t.Helper()
		testkit.Eventually(t, what+" refused", func() (bool, string) {
			_, err := open(token)
			st := status.Convert(err)
			return st.Code() == codes.Unauthenticated && strings.Contains(st.Message(), says), st.String()
		})
	}

	// A Pod-bound token: served, then ended and refused once the Pod goes.
	podToken := mint(pod)
	s, err := open(podToken)
	if err != nil {
		t.Fatalf("a token bound to a Pod that exists: %v", err)
	}
	if err := cs.CoreV1().Pods("shop").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the Pod gone from the cache", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: pod.Name}, &corev1.Pod{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err = <-ended:
	case <-time.After(testkit.Timeout):
		t.Fatal("the open stream of a deleted Pod's token goes on")
	}
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "were revoked") {
		t.Errorf("the open stream of a deleted Pod's token ended with %v, want Unauthenticated (revoked)", err)
	}
	refused("the token of a deleted Pod", podToken, "the Pod shop/envoy-1 it is bound to no longer exists")

	// A ServiceAccount token: refused once the ServiceAccount is deleted,
	// and still refused when one of the same name is created again.
	saToken := mint(nil)
	if _, err := open(saToken); err != nil {
		t.Fatalf("a token of a ServiceAccount that exists: %v", err)
	}
	if err := cs.CoreV1().ServiceAccounts("shop").Delete(ctx, "envoy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("the token of a deleted ServiceAccount", saToken, "its ServiceAccount shop/envoy no longer exists")
	newSA()
	refused("the token of a re-created ServiceAccount", saToken, "its ServiceAccount shop/envoy was deleted and created again")
	fresh := mint(nil)
	testkit.Eventually(t, "a token of the new ServiceAccount served", func() (bool, string) {
		_, err := open(fresh)
		return err == nil, status.Convert(err).String()
	})
}

// serveXDS serves p's ADS on a loopback port (plaintext) until the test
// ends and returns its address.
func serveXDS(t *testing.T, p *pipeline.Pipeline) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Server.ServeListener(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}
