// Package authn_test runs a real grpc-go xDS client against the xDS server
// with the bootstrap scopeplane writes, authenticated either way a proxy
// can be: its call_creds send the projected token file, or its TLS channel
// credentials present a SPIFFE client certificate. The token is signed by a
// local issuer, or issued by the real API server (TokenRequest).
package authn_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	grpcinsecure "google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
)

// clientEnv makes the test binary, run again with it set, the gRPC client:
// grpc-go reads GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS when it starts,
// so the client needs a process of its own.
const clientEnv = "SCOPEPLANE_AUTHN_GRPC_CLIENT"

func TestMain(m *testing.M) {
	if target := os.Getenv(clientEnv); target != "" {
		os.Exit(runClient(target))
	}
	os.Exit(m.Run())
}

// runClient dials target through the xDS resolver and keeps the channel
// connecting until it is killed: the xDS client's ADS stream is what the
// test observes.
func runClient(target string) int {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(grpcinsecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conn.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	<-ctx.Done()
	return 0
}

// TestGRPCClientSendsToken starts a grpc-go xDS client whose bootstrap is
// scopeplane's, with TLS channel credentials and the token file at the
// bootstrap's path, and checks that the server bound it to its scope as
// the token's ServiceAccount.
func TestGRPCClientSendsToken(t *testing.T) {
	ca := authtest.NewCA(t, "xds")
	iss := authtest.NewIssuer(t, "k1")
	p, addr := serve(t, ca, &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", iss, nil)})

	dir := t.TempDir()
	caFile := writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Cert.Raw)
	tokenFile := filepath.Join(dir, "token")
	now := time.Now()
	if err := os.WriteFile(tokenFile, []byte(iss.Sign(authtest.SAClaims("shop", "payments-app", "scopeplane", now.Add(-time.Minute), now.Add(time.Hour)))), 0o600); err != nil {
		t.Fatal(err)
	}
	// scopeplane's bootstrap with the paths of this test: the CA file and
	// the token where the ConfigMap and the projected volume would put them.
	b := scopeBootstrap(t, addr, &bootstrap.TLS{CAFile: caFile, Token: true})
	srv := b["xds_servers"].([]any)[0].(map[string]any)
	cc := srv["call_creds"].([]any)[0].(map[string]any)
	if got := cc["config"].(map[string]any)["jwt_token_file"]; got != bootstrap.TokenPath {
		t.Fatalf("the bootstrap's token file is %v, want %s", got, bootstrap.TokenPath)
	}
	cc["config"].(map[string]any)["jwt_token_file"] = tokenFile
	startClient(t, b)
	waitForIdentity(t, p, "system:serviceaccount:shop:payments-app (pod envoy-7f9)")
}

// TestGRPCClientSendsTokenRequestToken is TestGRPCClientSendsToken with a
// token the real API server issued (TokenRequest, as the kubelet asks for a
// projected volume), verified through the API server's issuer keys.
func TestGRPCClientSendsTokenRequestToken(t *testing.T) {
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
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "payments-app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "payments-app", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"scopeplane"}, ExpirationSeconds: ptr.To(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.Config{Methods: "token", Audience: "scopeplane"}.Build(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ca := authtest.NewCA(t, "xds")
	p, addr := serve(t, ca, a)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	b := scopeBootstrap(t, addr, &bootstrap.TLS{CAFile: writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Cert.Raw), Token: true})
	b["xds_servers"].([]any)[0].(map[string]any)["call_creds"].([]any)[0].(map[string]any)["config"].(map[string]any)["jwt_token_file"] = tokenFile
	startClient(t, b)
	waitForIdentity(t, p, "system:serviceaccount:shop:payments-app")
}

// TestGRPCClientPresentsSPIFFECertificate starts a grpc-go xDS client with
// scopeplane's bootstrap for SPIFFE certificates, whose TLS channel
// credentials present the certificate files where cert-manager's SPIFFE CSI
// driver or SPIRE mount them, and checks that the
// server bound it to its scope as the certificate's ServiceAccount.
func TestGRPCClientPresentsSPIFFECertificate(t *testing.T) {
	ca := authtest.NewCA(t, "xds")
	workloads := authtest.NewCA(t, "workloads")
	dir := t.TempDir()
	spiffe, err := auth.NewSPIFFEVerifier("cluster.local", authtest.BundleFile(t, dir, workloads))
	if err != nil {
		t.Fatal(err)
	}
	p, addr := serve(t, ca, &auth.Authenticator{SPIFFE: spiffe})

	der, key := workloads.Leaf("spiffe://cluster.local/ns/shop/sa/payments-app")
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The files as the CSI driver mounts them, in the directory the
	// bootstrap names.
	writePEM(t, dir, "tls.crt", "CERTIFICATE", der)
	writePEM(t, dir, "tls.key", "PRIVATE KEY", keyDER)
	b := scopeBootstrap(t, addr, &bootstrap.TLS{CAFile: writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Cert.Raw), SPIFFEDir: dir})
	if _, ok := b["xds_servers"].([]any)[0].(map[string]any)["call_creds"]; ok {
		t.Fatal("a bootstrap for SPIFFE certificates sends call credentials")
	}
	startClient(t, b)
	waitForIdentity(t, p, "system:serviceaccount:shop:payments-app")
}

// serve runs an xDS server over TLS with a certificate of ca, authenticating
// with a, for one ProxylessGRPC scope shop/payments of Service shop/one; it
// returns the pipeline and the server's address.
func serve(t *testing.T, ca *authtest.CA, a *auth.Authenticator) (*pipeline.Pipeline, string) {
	t.Helper()
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: a}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(&model.Scope{
		Key: scopeKey, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}},
	})
	p.Sync()
	return p, testkit.ServeTLS(t, p.Server.ServeListener, ca.ServerTLS())
}

// scopeKey is the scope every test's client joins.
var scopeKey = model.Key{Namespace: "shop", Name: "payments"}

// scopeBootstrap is scopeplane's gRPC bootstrap of scopeKey for a server at
// addr over tls, decoded so that a test can put its own paths in.
func scopeBootstrap(t *testing.T, addr string, tls *bootstrap.TLS) map[string]any {
	t.Helper()
	raw, err := bootstrap.GRPC(scopeKey, addr, tls)
	if err != nil {
		t.Fatal(err)
	}
	var b map[string]any
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// writePEM writes one PEM block into dir/name and returns its path.
func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startClient runs the gRPC client (this test binary again) with bootstrap
// b, dialing Service shop/one through the xDS resolver.
func startClient(t *testing.T, b map[string]any) {
	t.Helper()
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clientEnv+"=xds:///one.shop.svc.cluster.local:80",
		"GRPC_XDS_BOOTSTRAP_CONFIG="+string(raw), "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

// waitForIdentity waits until the scope's one connected proxy is identity.
func waitForIdentity(t *testing.T, p *pipeline.Pipeline, identity string) {
	t.Helper()
	testkit.Eventually(t, "the gRPC client bound to its scope as "+identity, func() (bool, string) {
		var ids []string
		for _, px := range p.Feedback.Get(scopeKey).Proxies {
			ids = append(ids, px.Identity)
		}
		return len(ids) == 1 && ids[0] == identity, fmt.Sprintf("identities %q", ids)
	})
}
