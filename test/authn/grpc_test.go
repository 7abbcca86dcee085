// Package authn_test runs a real grpc-go xDS client against the xDS server
// with the bootstrap scopeplane writes: its call_creds send the projected
// token file, and the server authenticates the client by it.
package authn_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpcinsecure "google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver
	"k8s.io/apimachinery/pkg/labels"

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
	key := model.Key{Namespace: "shop", Name: "payments"}
	p := pipeline.New(pipeline.Options{Server: server.Options{Authenticator: &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", iss, nil)}}})
	p.Catalog.UpsertService(testkit.Service("shop", "one", "10.0.0.1"))
	p.Catalog.UpsertScope(&model.Scope{
		Key: key, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: "shop", Selector: labels.Everything()}},
	})
	p.Sync()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Server.ServeListener(ctx, lis, grpc.Creds(credentials.NewTLS(ca.ServerTLS()))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	now := time.Now()
	if err := os.WriteFile(tokenFile, []byte(iss.Sign(authtest.SAClaims("shop", "payments-app", "scopeplane", now.Add(-time.Minute), now.Add(time.Hour)))), 0o600); err != nil {
		t.Fatal(err)
	}
	// scopeplane's bootstrap with the paths of this test: the CA file and
	// the token where the ConfigMap and the projected volume would put them.
	raw, err := bootstrap.GRPC(key, lis.Addr().String(), &bootstrap.TLS{CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	var b map[string]any
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	srv := b["xds_servers"].([]any)[0].(map[string]any)
	cc := srv["call_creds"].([]any)[0].(map[string]any)
	if got := cc["config"].(map[string]any)["jwt_token_file"]; got != bootstrap.TokenPath {
		t.Fatalf("the bootstrap's token file is %v, want %s", got, bootstrap.TokenPath)
	}
	cc["config"].(map[string]any)["jwt_token_file"] = tokenFile
	raw, err = json.Marshal(b)
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
	testkit.Eventually(t, "the gRPC client bound to its scope as its token's ServiceAccount", func() (bool, string) {
		var ids []string
		for _, px := range p.Feedback.Get(key).Proxies {
			ids = append(ids, px.Identity)
		}
		return len(ids) == 1 && ids[0] == "system:serviceaccount:shop:payments-app (pod envoy-7f9)", fmt.Sprintf("identities %q", ids)
	})
}
