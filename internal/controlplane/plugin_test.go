package controlplane_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/plugin"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestKubectlPlugin builds kubectl-scopeplane, puts it on PATH and runs it
// as kubectl does, against the operator's admin port and the API server.
func TestKubectlPlugin(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "kubectl-scopeplane"), "./cmd/kubectl-scopeplane")
	build.Dir = localapi.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubectl-scopeplane: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	plugin := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("kubectl", append([]string{"scopeplane"}, append(args, "--address", adminAddr, "--kubeconfig", kubeconfig)...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl scopeplane %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("kubectl scopeplane %s\n%s", strings.Join(args, " "), out)
		return string(out)
	}

	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shelf"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shelf", Name: "books", Labels: map[string]string{"app": "shelf"}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shelf", Name: "ledger"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shelf", Name: "gw"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Protocol: xdsv1alpha1.ProtocolSotW,
				Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shelf"}}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To(int32(10080))},
			},
		},
	)
	expectCondition(t, "shelf", "gw", "Accepted", "True", xdsv1alpha1.ReasonResolved)
	c, _ := proxy(t, dialXDS(t), adsclient.SotW, testkit.Node("shelf-edge", "shelf/gw"), nil)
	testkit.Eventually(t, "the proxy holds books", func() (bool, string) {
		held := c.State(xdstype.Cluster.URL())
		_, ok := held["shelf/books:80"]
		return ok, fmt.Sprintf("clusters %v, stream error %v", slices.Sorted(maps.Keys(held)), c.Err())
	})
	expectCondition(t, "shelf", "gw", "Ready", "True", xdsv1alpha1.ReasonSynced)

	out := plugin("proxy-status", "shelf/gw")
	if !regexp.MustCompile(`(?m)^shelf-edge\s+127\.0\.0\.1:\d+\s+-\s+-\s+shelf/gw\s+SotW\s+SYNCED\s+SYNCED\s+SYNCED\s+SYNCED\s`).MatchString(out) {
		t.Errorf("proxy-status does not show shelf-edge (anonymous, no zone) in sync:\n%s", out)
	}
	// With a second replica down (an address that refuses connections, as a
	// killed leader's port-forward does), the live replica's rows stay, the
	// one down is named on stderr, and the command succeeds.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	_ = lis.Close()
	cmd := exec.Command("kubectl", "scopeplane", "proxy-status", "shelf/gw", "--address", adminAddr+","+down, "--kubeconfig", kubeconfig)
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || !strings.Contains(stdout.String(), "shelf-edge") ||
		!strings.Contains(stderr.String(), "replica "+down+" did not answer, so its proxies are missing") {
		t.Errorf("proxy-status with replica %s down: %v\nstdout:\n%s\nstderr:\n%s", down, err, stdout.String(), stderr.String())
	}
	out = plugin("explain", "shelf-edge", "shelf/books")
	for _, want := range []string{
		`Proxy "shelf-edge" speaks SotW to replica ` + adminAddr + ` and joins ProxyScope shelf/gw.`,
		"Service shelf/books is selected by spec.services[0].",
		"CDS shelf/books:80: served at version ",
		"RDS http-10080, virtual host http-10080/books.shelf:80: served at version ",
		"; the proxy asked for it and is in sync on this type, so it holds this version",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain books lacks %q", want)
		}
	}
	out = plugin("explain", "shelf-edge", "shelf/ledger")
	if want := "Service shelf/ledger is not selected by ProxyScope shelf/gw, so no proxy of the scope receives it:\n  spec.services[0]: the Service's labels {} do not match selector {app=shelf}"; !strings.Contains(out, want) {
		t.Errorf("explain ledger lacks %q", want)
	}
	out = plugin("explain", "shelf-edge", "shelf/nothing")
	if !strings.Contains(out, "Service shelf/nothing does not exist") {
		t.Errorf("explain of a missing Service says nothing useful")
	}

	// A Delta scope's proxy holds the Service's virtual host as a VHDS
	// resource, not inside the route configuration.
	create(t, &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shelf", Name: "gwd"},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolDelta,
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "shelf"}}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To(int32(10080))},
		},
	})
	expectCondition(t, "shelf", "gwd", "Accepted", "True", xdsv1alpha1.ReasonResolved)
	d, _ := proxy(t, dialXDS(t), adsclient.Delta, testkit.Node("shelf-delta", "shelf/gwd"), nil)
	testkit.Eventually(t, "the delta proxy holds books' virtual host", func() (bool, string) {
		held := d.State(xdstype.VirtualHost.URL())
		_, ok := held["http-10080/books.shelf:80"]
		return ok, fmt.Sprintf("virtual hosts %v, stream error %v", slices.Sorted(maps.Keys(held)), d.Err())
	})
	expectCondition(t, "shelf", "gwd", "Ready", "True", xdsv1alpha1.ReasonSynced)
	out = plugin("explain", "shelf-delta", "shelf/books")
	for _, want := range []string{
		"VHDS http-10080/books.shelf:80: served at version ",
		"; the proxy asked for it and is in sync on this type, so it holds this version",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain books for a delta proxy lacks %q", want)
		}
	}
}

// TestExplainByNameClient runs explain on grpc-go's xDS client, which
// subscribes by name to what it dials: of two Services its scope selects,
// it holds the one it dials, and is not sent the other.
func TestExplainByNameClient(t *testing.T) {
	backend, err := whoami.Start("wanted")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Stop()
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "asks"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "asks", Name: "wanted"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "asks", Name: "unwanted"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
		},
		loopbackSlice("asks", "wanted-1", "wanted", backend.Port),
		loopbackSlice("asks", "unwanted-1", "unwanted", backend.Port),
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "asks", Name: "by-name"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"wanted", "unwanted"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
			},
		},
	)
	resolver, err := xds.NewXDSResolverWithConfigForTesting(bootstrapOf(t, "asks", "by-name", bootstrap.GRPCKey))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///wanted.asks.svc.cluster.local:50051",
		grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(whoami.Dialer))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	testkit.Eventually(t, "an RPC to wanted", func() (bool, string) {
		got, err := call(conn)
		return got == "wanted", fmt.Sprintf("%q, %v", got, err)
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	explain := func(svc string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := plugin.Main(context.Background(), []string{"explain", "by-name-grpc", svc, "--address", adminAddr, "--kubeconfig", kubeconfig}, &out, &errOut); code != 0 {
			t.Fatalf("kubectl scopeplane explain %s: exit %d: %s", svc, code, errOut.String())
		}
		return out.String()
	}

	const uid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
	const holds = ": served at version [0-9a-f]+; the proxy asked for it and is in sync on this type, so it holds this version"
	const notSent = ": served at version [0-9a-f]+; not sent to this proxy, which did not ask for it\n"
	want := []string{
		`LDS wanted.asks.svc.cluster.local:50051` + holds,
		// gRPC-mode route, cluster and assignment names end in the Service's UID.
		`RDS wanted.asks.svc.cluster.local:50051@` + uid + holds,
		`CDS asks/wanted:50051@` + uid + holds,
		`EDS asks/wanted:50051@` + uid + holds,
		// The short name is served too, but the client dialled the long one.
		`LDS wanted.asks:50051` + notSent,
	}
	var out string
	testkit.Eventually(t, "explain: the client holds what it dialled", func() (bool, string) {
		out = explain("asks/wanted")
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(out) {
				return false, fmt.Sprintf("lacks %s:\n%s", w, out)
			}
		}
		return true, ""
	})
	t.Logf("explain asks/wanted:\n%s", out)

	out = explain("asks/unwanted")
	t.Logf("explain asks/unwanted:\n%s", out)
	for _, w := range []string{
		`LDS unwanted.asks.svc.cluster.local:50051` + notSent,
		`CDS asks/unwanted:50051@` + uid + notSent,
		`EDS asks/unwanted:50051@` + uid + notSent,
		`Proxy "by-name-grpc" asked for none of these resources, so it is sent none of them`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("explain asks/unwanted lacks %s", w)
		}
	}
	if strings.Contains(out, "holds this version") {
		t.Error("explain says the client holds a Service it never asked for")
	}
}
