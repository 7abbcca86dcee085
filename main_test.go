package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// TestBinaryServesProbesMetricsAndXDS builds the real binary and runs it
// against the test API server, as a Deployment would: /readyz passes once
// the first build is done, the metrics endpoint serves scopeplane's
// metrics, and the xDS port accepts connections.
func TestBinaryServesProbesMetricsAndXDS(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "scopeplane")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=test-1", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	metrics, probes, xds, admin := freePort(t), freePort(t), freePort(t), freePort(t)
	cmd := exec.Command(bin, "--metrics-bind-address="+metrics, "--health-probe-bind-address="+probes,
		"--xds-bind-address="+xds, "--xds-server-address=scopeplane.test.svc:18000", "--admin-bind-address="+admin)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})

	get := func(url string) (int, string) {
		resp, err := http.Get(url) //nolint:gosec // a loopback URL the test built
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("http://" + probes + "/readyz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never passed: %d %s\nlogs:\n%s", code, body, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := get("http://" + probes + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	_, body := get("http://" + metrics + "/metrics")
	if !strings.Contains(body, "scopeplane_snapshot_build_duration_seconds") {
		t.Errorf("the metrics endpoint does not serve scopeplane's metrics:\n%.2000s", body)
	}
	if !strings.Contains(body, `grpc_server_started_total{grpc_method="StreamAggregatedResources",grpc_service="envoy.service.discovery.v3.AggregatedDiscoveryService",grpc_type="bidi_stream"}`) {
		t.Errorf("the metrics endpoint does not serve the ADS server's gRPC metrics:\n%.2000s", body)
	}
	if !strings.Contains(body, `scopeplane_build_info{goversion="`+runtime.Version()+`",version="test-1"} 1`) {
		t.Errorf("the metrics endpoint does not serve scopeplane_build_info for version test-1:\n%.2000s", body)
	}
	conn, err := net.DialTimeout("tcp", xds, 5*time.Second)
	if err != nil {
		t.Fatalf("the xDS port does not accept connections: %v", err)
	}
	_ = conn.Close()
	cc, err := grpc.NewClient(admin, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close() }()
	if _, err := statusv3.NewClientStatusDiscoveryServiceClient(cc).FetchClientStatus(context.Background(), &statusv3.ClientStatusRequest{}); err != nil {
		t.Errorf("the admin port does not serve CSDS: %v", err)
	}
	// The admin service is unauthenticated: the binary refuses to expose it.
	out, err := exec.Command(bin, "--admin-bind-address=0.0.0.0:18001").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not a loopback address") {
		t.Errorf("--admin-bind-address=0.0.0.0:18001: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err != nil || string(out) != "scopeplane test-1 "+runtime.Version()+"\n" {
		t.Errorf("scopeplane --version: %q, %v", out, err)
	}
	if !strings.Contains(logs.String(), `"version": "test-1"`) && !strings.Contains(logs.String(), `"version":"test-1"`) {
		t.Errorf("the binary did not log its version:\n%s", logs.String())
	}
}

var update = flag.Bool("update", false, "rewrite docs/flags.md from the binary's flags")

// TestFlagsReference keeps docs/flags.md equal to the flags the binary
// defines (run go test . -update after changing one).
func TestFlagsReference(t *testing.T) {
	fs := flag.NewFlagSet("scopeplane", flag.ContinueOnError)
	bindFlags(fs)
	var b strings.Builder
	b.WriteString(flagsHeader)
	fs.VisitAll(func(f *flag.Flag) {
		def := "`" + f.DefValue + "`"
		if f.DefValue == "" {
			def = "(empty)"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, def, strings.ReplaceAll(strings.ReplaceAll(f.Usage, "|", `\|`), "\n", " "))
	})
	path := filepath.Join("docs", "flags.md")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != b.String() {
		t.Errorf("docs/flags.md is stale: run go test . -run TestFlagsReference -update\nwant:\n%s", b.String())
	}
}

const flagsHeader = `# Command-line flags

Every flag of the scopeplane binary (` + "`scopeplane --help`" + `), generated from the binary's own
flag definitions by ` + "`go test . -run TestFlagsReference -update`" + `; the test fails when this page is stale.
The Helm chart sets the addresses and ` + "`--leader-elect`" + ` (see [install.md](install.md));
` + "`extraArgs`" + ` passes any other.

| Flag | Default | Description |
|---|---|---|
`
