package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
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
// metrics, and the xDS port serves TLS from the CA the binary created.
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
	// xDS over TLS from the self-managed CA, as a default install: the
	// binary creates its Secret in its namespace before /readyz passes.
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scopeplane-test"}}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--metrics-bind-address="+metrics, "--health-probe-bind-address="+probes,
		"--xds-bind-address="+xds, "--xds-server-address=scopeplane.test.svc:18000", "--admin-bind-address="+admin,
		"--xds-tls-secret-namespace=scopeplane-test")
	// The chart passes the container's memory limit (512Mi) this way.
	cmd.Env = append(withoutEnv(os.Environ(), "GOMEMLIMIT"), "KUBECONFIG="+kubeconfig, memoryLimitEnv+"=536870912")
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
	body := scrapeAuthorized(t, env, metrics)
	if !strings.Contains(body, "scopeplane_snapshot_build_duration_seconds") {
		t.Errorf("the metrics endpoint does not serve scopeplane's metrics:\n%.2000s", body)
	}
	if !strings.Contains(body, `grpc_server_started_total{grpc_method="StreamAggregatedResources",grpc_service="envoy.service.discovery.v3.AggregatedDiscoveryService",grpc_type="bidi_stream"}`) {
		t.Errorf("the metrics endpoint does not serve the ADS server's gRPC metrics:\n%.2000s", body)
	}
	if !strings.Contains(body, `scopeplane_build_info{goversion="`+runtime.Version()+`",version="test-1"} 1`) {
		t.Errorf("the metrics endpoint does not serve scopeplane_build_info for version test-1:\n%.2000s", body)
	}
	// The xDS port completes a TLS handshake whose certificate the CA in
	// the self-managed Secret verifies for the advertised name.
	sec := &corev1.Secret{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "scopeplane-test", Name: "scopeplane-xds-tls"}, sec); err != nil {
		t.Fatalf("the self-managed CA's Secret: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		t.Fatalf("the Secret's ca.crt holds no certificate")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", xds,
		&tls.Config{RootCAs: roots, ServerName: "scopeplane.test.svc", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("the xDS port does not complete a verified TLS handshake: %v", err)
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
	if !strings.Contains(logs.String(), `"bytes":483183820`) {
		t.Errorf("the binary did not set the Go memory limit to 90%% of its container's 512Mi:\n%s", logs.String())
	}
}

// withoutEnv returns environ without the variable name.
func withoutEnv(environ []string, name string) []string {
	var out []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// scrapeAuthorized checks that the metrics endpoint, secure by default,
// answers only callers the API server vouches for: 401 without a token, 403 for a ServiceAccount not allowed get on /metrics, and
// the metrics for one bound to a ClusterRole like the chart's
// metrics-reader. Tokens come from the API server's TokenRequest API, as
// Prometheus's ServiceAccount token does in a cluster. It returns the body.
func scrapeAuthorized(t *testing.T, env *localapi.Env, addr string) string {
	t.Helper()
	ctx := context.Background()
	reader := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "scopeplane-metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "prometheus"}},
	}
	token := map[string]string{}
	for _, name := range []string{"prometheus", "stranger"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
		if err := env.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
		if err := env.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
			t.Fatalf("a token for ServiceAccount %s: %v", name, err)
		}
		token[name] = tr.Status.Token
	}
	for _, o := range []client.Object{reader, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// The certificate is self-signed: the test, like the chart's
	// ServiceMonitor, authenticates itself, not the server.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the self-signed certificate of the metrics endpoint
	scrape := func(bearer string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("scraping %s: %v", addr, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil { //nolint:gosec // a loopback URL the test built
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("the metrics endpoint answered plain HTTP")
		}
	}
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a ServiceAccount without the binding", token["stranger"], http.StatusForbidden},
	} {
		if code, body := scrape(c.token); code != c.want {
			t.Errorf("%s: %d, want %d: %.300s", c.who, code, c.want, body)
		}
	}
	// The binding may take a moment to reach the API server's authorizer.
	var body string
	testkit.Eventually(t, "the bound ServiceAccount scrapes the metrics", func() (bool, string) {
		var code int
		code, body = scrape(token["prometheus"])
		return code == http.StatusOK, fmt.Sprintf("%d %.300s", code, body)
	})
	return body
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
The Helm chart ([install.md](install.md)) sets these from its values: the addresses
(` + "`--metrics-bind-address`, `--health-probe-bind-address`, `--xds-bind-address`," + `
` + "`--xds-server-address`, `--admin-bind-address`, `--pprof-bind-address`" + `), ` + "`--leader-elect`, `--shards`, `--shard`" + `,
` + "`--metrics-secure`, `--metrics-scope-labels`, `--bootstrap-configmaps`, `--bootstrap-configmap-namespaces`," + `
` + "`--cross-namespace`, `--route-controller-name`, `--status-writes-per-second`, `--status-writes-burst`, `--kube-api-qps`," + `
` + "`--kube-api-burst`" + `; TLS (` + "`--xds-insecure`" + `,
` + "`--xds-tls-dir`, `--xds-tls-secret`, `--xds-tls-secret-namespace`" + `); authentication
(` + "`--xds-auth`, `--xds-token-audience`, `--xds-spiffe-trust-domain`," + `
` + "`--xds-spiffe-trust-bundle`, `--xds-allow-anonymous`" + `); and the per-client limits
(` + "`--xds-max-request-bytes`, `--xds-max-names-per-request`, `--xds-extra-names-per-type`," + `
` + "`--xds-max-streams-per-connection`, `--xds-max-streams-per-client`, `--xds-first-request-timeout`, `--xds-max-node-bytes`," + `
` + "`--xds-max-node-id-bytes`, `--xds-new-streams-per-second`, `--xds-new-streams-burst`," + `
` + "`--xds-new-connections-per-second`, `--xds-new-connections-burst`," + `
` + "`--xds-new-connections-per-peer-per-second`, `--xds-new-connections-per-peer-burst`," + `
` + "`--xds-max-connections`, `--xds-max-connections-per-peer`, `--xds-ipv6-prefix-length`," + `
` + "`--xds-max-connection-idle`," + `
` + "`--xds-handshake-timeout`, `--xds-max-header-list-bytes`," + `
` + "`--xds-unauthenticated-streams-per-peer-per-second`," + `
` + "`--xds-unauthenticated-streams-per-peer-burst`, `--xds-send-timeout`, `--xds-memory-budget`," + `
` + "`--xds-nacks-per-second`, `--xds-nack-burst`, `--xds-max-connection-age`," + `
` + "`--xds-max-connection-age-grace`" + `). ` + "`extraArgs`" + ` passes any other; test/docs checks this list
against the chart's Deployment template.

| Flag | Default | Description |
|---|---|---|
`

// A replica is named by --replica-name, else by its Pod (the chart's
// downward API), and its feedback ConfigMap is owned by the Pod's UID.
func TestReplicaName(t *testing.T) {
	env := map[string]string{"POD_NAME": "scopeplane-7d9f-abcde", "POD_UID": "1234"}
	c := &config{leaderNS: "scopeplane-system"}
	r, err := c.replica(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "scopeplane-7d9f-abcde" || r.Namespace != "scopeplane-system" || r.PodUID != "1234" {
		t.Errorf("from the Pod: %+v", r)
	}
	c.replicaName = "a"
	if r, err := c.replica(func(k string) string { return env[k] }); err != nil || r.Name != "a" {
		t.Errorf("--replica-name a: %+v, %v", r, err)
	}
	c.replicaName = ""
	host, _ := os.Hostname()
	if r, err := c.replica(func(string) string { return "" }); err != nil || r.Name != strings.ToLower(host) {
		t.Errorf("outside a pod: %+v, %v; want the host name %q", r, err, host)
	}
}

// TestAPILimits checks the API client limits the flags set: by default a
// pace above the status writes' (where controller-runtime's GetConfig
// leaves client-side limiting off), a negative pace turning it off, and a
// clear refusal of a pace that would undercut the status writes or that
// client-go would read as its default of 5 a second.
func TestAPILimits(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		qps       float32
		burst     int
		wantError string
	}{
		{nil, 500, 1000, ""},
		{[]string{"--kube-api-qps=-1"}, -1, 1000, ""},
		{[]string{"--status-writes-per-second=1000", "--status-writes-burst=1000", "--kube-api-qps=1200", "--kube-api-burst=1500"}, 1200, 1500, ""},
		{[]string{"--kube-api-qps=0"}, 0, 0, "--kube-api-qps=0"},
		{[]string{"--kube-api-qps=100"}, 0, 0, "--kube-api-qps=100 is below --status-writes-per-second=250"},
		{[]string{"--kube-api-burst=100"}, 0, 0, "--kube-api-burst=100 is below --status-writes-burst=500"},
	} {
		fs := flag.NewFlagSet("scopeplane", flag.ContinueOnError)
		c := bindFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := &rest.Config{QPS: -1}
		err := c.limitAPI(cfg)
		switch {
		case tc.wantError != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantError)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case cfg.QPS != tc.qps || cfg.Burst != tc.burst:
			t.Errorf("%v: QPS %v burst %d, want %v and %d", tc.args, cfg.QPS, cfg.Burst, tc.qps, tc.burst)
		}
	}
}

// --xds-ipv6-prefix-length defaults to 64 and takes 1 to 128 bits; any
// other value is refused with the range.
func TestIPv6PrefixLengthFlag(t *testing.T) {
	fs := flag.NewFlagSet("scopeplane", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o server.Options
	bindLimits(fs, &o)
	if o.IPv6PrefixLength != 64 {
		t.Errorf("the default is %d, want 64", o.IPv6PrefixLength)
	}
	if err := fs.Parse([]string{"--xds-ipv6-prefix-length=56"}); err != nil || o.IPv6PrefixLength != 56 {
		t.Errorf("56: %d, %v", o.IPv6PrefixLength, err)
	}
	for _, bad := range []string{"0", "129", "-1", "sixty-four"} {
		if err := fs.Parse([]string{"--xds-ipv6-prefix-length=" + bad}); err == nil || !strings.Contains(err.Error(), "1 to 128") {
			t.Errorf("%s was not refused with the range: %v", bad, err)
		}
	}
}

// --shards above 1 takes one address per slot, at least one per shard, in
// --xds-server-address; the count, the index and the addresses are checked
// before the start.
func TestShardFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want      shard.Shards
		wantError string
	}{
		{args: nil},
		{args: []string{"--shards=1", "--xds-server-address=xds.system.svc:18000"}},
		{args: []string{"--shards=2", "--shard=1", "--xds-server-address=a.system.svc:18000,b.system.svc:18000"},
			want: shard.Shards{Index: 1, N: 2, Addresses: []string{"a.system.svc:18000", "b.system.svc:18000"}}},
		{args: []string{"--shards=2", "--xds-server-address=s0:1,s1:1,s2:1,s3:1"},
			want: shard.Shards{N: 2, Addresses: []string{"s0:1", "s1:1", "s2:1", "s3:1"}}},
		{args: []string{"--shards=0"}, wantError: "--shards=0"},
		{args: []string{"--shard=1"}, wantError: "--shard=1 with one shard"},
		{args: []string{"--xds-server-address=a:1,b:1"}, wantError: "names several addresses with one shard"},
		{args: []string{"--shards=3", "--xds-server-address=a:1,b:1"}, wantError: "names 2 address(es) for --shards=3"},
		{args: []string{"--shards=2", "--shard=2", "--xds-server-address=a:1,b:1"}, wantError: "shard 2 is not one of the 2 shards"},
		{args: []string{"--shards=2", "--xds-server-address=a:1,b"}, wantError: `slot 1's xDS address "b"`},
		{args: []string{"--shards=2", "--shard=1", "--xds-server-address=a.system.svc:18000, b.system.svc:18000"},
			want: shard.Shards{Index: 1, N: 2, Addresses: []string{"a.system.svc:18000", "b.system.svc:18000"}}},
	} {
		fs := flag.NewFlagSet("scopeplane", flag.ContinueOnError)
		c := bindFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got, err := c.sharding()
		switch {
		case tc.wantError != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.wantError)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case got.Index != tc.want.Index || got.Count() != tc.want.Count() || !slices.Equal(got.Addresses, tc.want.Addresses):
			t.Errorf("%v: %+v, want %+v", tc.args, got, tc.want)
		}
	}
}
