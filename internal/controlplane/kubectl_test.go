package controlplane_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// kubectl runs the real kubectl against the test API server.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestKubectlWorkflow is what a user does: apply the samples, connect a
// proxy, wait for Ready, read the scopes, and find a proxy's NACK on the CRD.
func TestKubectlWorkflow(t *testing.T) {
	kubectl(t, "apply", "-f", filepath.Join(localapi.RepoRoot(), "config", "samples"))
	create(t,
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ledger"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051, AppProtocol: ptr.To("grpc")}}},
		},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Labels: map[string]string{"app.kubernetes.io/part-of": "storefront"}},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
	)

	conn := dialXDS(t)
	proxy(t, conn, adsclient.SotW, testkit.Node("payments-1", "default/payments"), nil)
	kubectl(t, "wait", "--for=condition=Ready", "proxyscope/payments", "--timeout=30s")
	// A correct scope is Ready before any proxy connects: waiting on it in CI
	// or GitOps returns.
	kubectl(t, "wait", "--for=condition=Ready", "proxyscope/storefront", "--timeout=30s")

	out := kubectl(t, "get", "ps")
	header := regexp.MustCompile(`NAME\s+PROTOCOL\s+MODE\s+ACCEPTED\s+SERVICES\s+PROXIES\s+READY\s+AGE`)
	row := regexp.MustCompile(`payments\s+SotW\s+ProxylessGRPC\s+True\s+1\s+1\s+True\s+\S+`)
	idle := regexp.MustCompile(`storefront\s+SotW\s+Envoy\s+True\s+1\s+0\s+True\s+\S+`)
	if !header.MatchString(out) || !row.MatchString(out) || !idle.MatchString(out) {
		t.Errorf("kubectl get ps does not show the printcolumns:\n%s", out)
	}

	picky := func(typeURL string, _ []*anypb.Any, _ []string) string {
		if typeURL == xdstype.Listener.URL() {
			return "listener http-10080: address already in use"
		}
		return ""
	}
	proxy(t, conn, adsclient.SotW, testkit.Node("edge-7", "default/storefront"), picky)
	expectCondition(t, "default", "storefront", "Degraded", "True", "ProxyNACKed")
	yaml := kubectl(t, "get", "ps", "storefront", "-o", "yaml")
	t.Logf("kubectl get ps storefront -o yaml:\n%s", yaml)
	for _, want := range []string{"reason: ProxyNACKed", "node: edge-7", "peer: 127.0.0.1:", "detail: 'listener http-10080: address already in use'", "typeURL: " + xdstype.Listener.URL()} {
		if !strings.Contains(yaml, want) {
			t.Errorf("kubectl get ps storefront -o yaml lacks %q:\n%s", want, yaml)
		}
	}
	testkit.Eventually(t, "kubectl describe shows the conditions and the NACK event", func() (bool, string) {
		out := kubectl(t, "describe", "ps", "storefront")
		return strings.Contains(out, "Conditions:") && regexp.MustCompile(`Warning\s+ProxyNACKed`).MatchString(out), out
	})
}
