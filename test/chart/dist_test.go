package chart_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

// TestDist runs hack/dist.sh (make dist) and installs its install.yaml on a
// real API server as a user would, with kubectl apply --server-side: every
// object is created, and the Deployment runs the chart's image.
func TestDist(t *testing.T) {
	helm := helmPath(t)
	root := localapi.RepoRoot()
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "dist.sh"), out)
	cmd.Env = append(cmd.Environ(), "HELM="+helm)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/dist.sh: %v\n%s", err, b)
	}
	var chart struct{ Version, AppVersion string }
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(root, "charts", "scopeplane", "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	shown, stderr, err := runHelm(t, "show", "chart", filepath.Join(out, "scopeplane-"+chart.Version+".tgz"))
	if err != nil || !strings.Contains(shown, "version: "+chart.Version) {
		t.Fatalf("helm show chart of the package: %v %s\n%s", err, stderr, shown)
	}

	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		c := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		if err := c.Run(); err != nil || strings.TrimSpace(stderr.String()) != "" {
			t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	applied := kubectl("apply", "--server-side", "--field-manager=scopeplane-dist-test", "-f", filepath.Join(out, "install.yaml"))
	for _, want := range []string{
		"namespace/scopeplane-system serverside-applied",
		"customresourcedefinition.apiextensions.k8s.io/proxyscopes.xds.scopeplane.dev serverside-applied",
		"deployment.apps/scopeplane serverside-applied",
	} {
		if !strings.Contains(applied, want) {
			t.Errorf("kubectl apply -f install.yaml did not report %q:\n%s", want, applied)
		}
	}
	image := kubectl("-n", "scopeplane-system", "get", "deployment", "scopeplane", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if image != "ghcr.io/scopeplane/scopeplane:"+chart.AppVersion {
		t.Errorf("the Deployment runs %q, want the chart's image at appVersion %s", image, chart.AppVersion)
	}
	kubectl("wait", "--for=condition=Established", "crd/proxyscopes.xds.scopeplane.dev", "--timeout=30s")
}
