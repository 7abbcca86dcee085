// Package tls_test runs the control plane with its default, secure xDS
// port against a real kube-apiserver: the control plane creates its own CA
// Secret, writes the CA bundle into the bootstrap ConfigMap, and grpc-go's
// xDS client joins a scope over TLS with that bootstrap; a plaintext client
// gets nothing.
package tls_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/internal/xdstls"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/server"
)

func TestGRPCClientOverTLSFromTheSelfManagedCA(t *testing.T) {
	// The pod's mount of the bootstrap ConfigMap.
	mount := t.TempDir()
	env, addr := startControlPlane(t, controlplane.Options{
		BootstrapMountPath: mount,
		// This test is about the transport; proxy authentication is
		// test/authn's and test/apiserver's.
		Server: server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}},
	}, "app")
	ctx := t.Context()
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := env.Client.Create(ctx, o); err != nil {
				t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
			}
		}
	}

	backend, err := whoami.Start("backend")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Stop()
	create(
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "whoami"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051, AppProtocol: ptr.To("grpc")}}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "app", Name: "whoami-1", Labels: map[string]string{discoveryv1.LabelServiceName: "whoami"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(backend.Port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{whoami.SliceAddress}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "grpc"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
			},
		},
	)

	// The control plane made its CA Secret, and the bootstrap ConfigMap
	// carries its bundle.
	cm := &corev1.ConfigMap{}
	testkit.Eventually(t, "the bootstrap ConfigMap with the CA bundle", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "app", Name: bootstrap.ConfigMapName("grpc")}, cm)
		return err == nil && cm.Data[bootstrap.CAKey] != "", fmt.Sprint(err)
	})
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, caSecret, sec); err != nil {
		t.Fatalf("the self-managed CA Secret: %v", err)
	}
	if string(sec.Data[xdstls.CAFile]) != cm.Data[bootstrap.CAKey] || sec.Type != corev1.SecretTypeTLS {
		t.Errorf("the ConfigMap's ca.crt is not the Secret's (type %s)", sec.Type)
	}
	// It publishes the identity-less key grpc-js-xds and C-core need for
	// TLS, and the environment gRPC clients set.
	publishedKey := cm.Data[bootstrap.TLSOnlyKeyKey]
	if err := bootstrap.CheckTLSOnlyKey([]byte(publishedKey)); err != nil {
		t.Errorf("the ConfigMap's %s: %v", bootstrap.TLSOnlyKeyKey, err)
	}
	if env := cm.Data[bootstrap.GRPCEnvKey]; !strings.Contains(env, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH="+filepath.Join(mount, bootstrap.CAKey)+"\n") ||
		!strings.Contains(env, "GOOGLE_APPLICATION_CREDENTIALS="+filepath.Join(mount, bootstrap.TLSOnlyKeyKey)+"\n") {
		t.Errorf("the ConfigMap's %s does not name the mounted files:\n%s", bootstrap.GRPCEnvKey, env)
	}
	// What the kubelet does with the ConfigMap volume.
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(mount, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(cm.Data[bootstrap.GRPCKey]))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///whoami.app.svc.cluster.local:50051",
		grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	testkit.Eventually(t, "an RPC routed through the scope learnt over TLS", func() (bool, string) {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		got, err := whoami.Call(cctx, conn)
		return got == "backend", fmt.Sprintf("%q, %v", got, err)
	})

	// A new CA (here: the Secret deleted, so the leader makes another)
	// reaches the bootstrap ConfigMap, and new connections get a
	// certificate of it, while the client's open xDS stream goes on.
	oldCA := cm.Data[bootstrap.CAKey]
	if err := env.Client.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the new CA in the bootstrap ConfigMap", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "app", Name: bootstrap.ConfigMapName("grpc")}, cm)
		fresh := &corev1.Secret{}
		if err == nil {
			err = env.Client.Get(ctx, caSecret, fresh)
		}
		return err == nil && cm.Data[bootstrap.CAKey] != oldCA && cm.Data[bootstrap.CAKey] == string(fresh.Data[xdstls.CAFile]), fmt.Sprint(err)
	})
	// The published key stays the install's through the rewrite, and a
	// reconciler of a new term (a new leader) adopts it from the
	// ConfigMaps rather than making another.
	if cm.Data[bootstrap.TLSOnlyKeyKey] != publishedKey {
		t.Error("the published key changed with the CA: it is made once per install")
	}
	newTerm := &bootstrapconfig.Reconciler{Client: env.Client, XDSServer: addr, Conflicts: bootstrapconfig.NewConflicts(),
		CA: staticCA(cm.Data[bootstrap.CAKey]), MountPath: mount}
	create(&xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "second"},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		},
	})
	if _, err := newTerm.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "app", Name: "second"}}); err != nil {
		t.Fatal(err)
	}
	second := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "app", Name: bootstrap.ConfigMapName("second")}, second); err != nil {
		t.Fatal(err)
	}
	if second.Data[bootstrap.TLSOnlyKeyKey] != publishedKey {
		t.Error("a new term's reconciler published another key than the one the ConfigMaps carry")
	}
	// A new handshake gets the new CA's certificate (grpc-go's own xDS
	// client would see the new bundle when it next reads ca.crt, every 10
	// minutes, so a TLS client stands in for it).
	handshake := func(ca string) error {
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM([]byte(ca))
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	testkit.Eventually(t, "a new handshake verified by the new CA", func() (bool, string) {
		err := handshake(cm.Data[bootstrap.CAKey])
		return err == nil, fmt.Sprint(err)
	})
	if err := handshake(oldCA); err == nil {
		t.Error("a new handshake still verified by the deleted CA")
	}
	testkit.Eventually(t, "an RPC routed for the client connected before", func() (bool, string) {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		got, err := whoami.Call(cctx, conn)
		return got == "backend", fmt.Sprintf("%q, %v", got, err)
	})

	// A plaintext ADS client gets no answer from the TLS port.
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Close() }()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(plain).StreamAggregatedResources(sctx)
	if err == nil {
		_, err = stream.Recv()
	}
	if err == nil {
		t.Fatal("a plaintext ADS stream was answered by the TLS port")
	}
	t.Logf("plaintext client: %v", err)
}

// staticCA is a CA bundle that does not change.
type staticCA string

func (c staticCA) CABundle() []byte         { return []byte(c) }
func (c staticCA) Changed() <-chan struct{} { return nil }
