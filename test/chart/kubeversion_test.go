package chart_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

// The chart's kubeVersion starts at the Kubernetes it is tested against:
// the kube-apiserver of the server-side dry runs and of `make e2e`, pinned
// in hack/tools/apiserver. The install guide and the chart's README say the
// same, so that none of the three is left behind when the pin moves.
func TestKubeVersion(t *testing.T) {
	root := localapi.RepoRoot()
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes v1\.(\d+)\.\d+`).FindSubmatch(mustRead(t, filepath.Join(root, "hack", "tools", "apiserver", "go.mod")))
	if m == nil {
		t.Fatal("hack/tools/apiserver/go.mod pins no k8s.io/kubernetes")
	}
	minor := string(m[1])
	var chart struct {
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(chartDir, "Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(">=1.%s.0-0", minor); chart.KubeVersion != want {
		t.Errorf("Chart.yaml kubeVersion %q, want %q: the tests run Kubernetes v1.%s", chart.KubeVersion, want, minor)
	}
	for page, says := range map[string]string{
		filepath.Join("docs", "install.md"):                "tested against the API of Kubernetes v1." + minor + ")",
		filepath.Join("charts", "scopeplane", "README.md"): fmt.Sprintf("Kubernetes 1.%s or later (`kubeVersion: \"%s\"`", minor, chart.KubeVersion),
	} {
		if !strings.Contains(string(mustRead(t, filepath.Join(root, page))), says) {
			t.Errorf("%s does not say %q", page, says)
		}
	}
}
