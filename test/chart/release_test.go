package chart_test

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

// TestRelease runs hack/release.sh (make release) for a version the checkout
// does not carry and checks each file a release publishes: the chart package
// and install.yaml stamped with that version, the image archive, the
// CycloneDX SBOM of the image at that version, the plugin's archive (for this
// machine only: hack/plugin's test covers the six platforms) and its krew
// manifest, and SHA256SUMS that match them all.
func TestRelease(t *testing.T) {
	helm := helmPath(t)
	const version = "0.0.7-rc.1"
	out := t.TempDir()
	plugin := "kubectl-scopeplane_" + version + "_linux_" + runtime.GOARCH + ".tar.gz"
	cmd := exec.Command(filepath.Join(localapi.RepoRoot(), "hack", "release.sh"), version, out)
	cmd.Env = append(cmd.Environ(), "HELM="+helm, "RELEASE_PLUGIN_PLATFORMS=linux/"+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh: %v\n%s", err, b)
	}

	want := []string{"scopeplane-" + version + ".oci.tar", "scopeplane-" + version + ".tgz", "install.yaml", "scopeplane-" + version + ".cdx.json",
		plugin, "kubectl-scopeplane.krew.yaml"}
	sums := map[string]string{}
	f, err := os.Open(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's", sc.Text())
		}
		sums[name] = sum
	}
	f.Close()
	for _, name := range want {
		data, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Errorf("the release lacks %s: %v", name, err)
			continue
		}
		h := sha256.Sum256(data)
		if got := hex.EncodeToString(h[:]); sums[name] != got {
			t.Errorf("SHA256SUMS says %s is %q, it is %s", name, sums[name], got)
		}
	}
	if len(sums) != len(want) {
		t.Errorf("SHA256SUMS lists %d files, want %d: %v", len(sums), len(want), sums)
	}

	shown, stderr, err := runHelm(t, "show", "chart", filepath.Join(out, "scopeplane-"+version+".tgz"))
	if err != nil {
		t.Fatalf("helm show chart: %v %s", err, stderr)
	}
	for _, line := range []string{"version: " + version, "appVersion: " + version} {
		if !strings.Contains(shown, line) {
			t.Errorf("the chart package lacks %q:\n%s", line, shown)
		}
	}
	install := string(mustRead(t, filepath.Join(out, "install.yaml")))
	if !strings.Contains(install, "image: \"ghcr.io/scopeplane/scopeplane:"+version+"\"") {
		t.Errorf("install.yaml does not run the image of %s", version)
	}
	if findOptional(decode(t, install), "CustomResourceDefinition") == nil {
		t.Error("install.yaml holds no CRD")
	}

	index := false
	tf, err := os.Open(filepath.Join(out, "scopeplane-"+version+".oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	tr := tar.NewReader(tf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("the image archive: %v", err)
		}
		index = index || h.Name == "index.json"
	}
	if !index {
		t.Error("the image archive is no OCI layout (no index.json)")
	}

	sf, err := os.Open(filepath.Join(out, "scopeplane-"+version+".cdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(sf, cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatalf("the SBOM does not decode as CycloneDX: %v", err)
	}
	if c := bom.Metadata.Component; c.Type != cdx.ComponentTypeContainer || c.Version != version {
		t.Errorf("the SBOM describes %s %s at %s, want the image at %s", c.Type, c.Name, c.Version, version)
	}
	var names, apps []string
	for _, c := range *bom.Components {
		names = append(names, c.Name)
		if c.Type == cdx.ComponentTypeApplication {
			apps = append(apps, c.PackageURL)
		}
	}
	if len(apps) != 2 || !strings.HasPrefix(apps[0], "pkg:golang/github.com/scopeplane/scopeplane@v"+version+"?") {
		t.Errorf("the SBOM's binaries %q, want scopeplane at v%s for two platforms", apps, version)
	}
	krew := string(mustRead(t, filepath.Join(out, "kubectl-scopeplane.krew.yaml")))
	if !strings.Contains(krew, "sha256: "+sums[plugin]) || !strings.Contains(krew, "/v"+version+"/"+plugin) {
		t.Errorf("the krew manifest does not name %s with its sum %s:\n%s", plugin, sums[plugin], krew)
	}
	for _, m := range []string{"github.com/envoyproxy/go-control-plane", "sigs.k8s.io/controller-runtime", "google.golang.org/grpc"} {
		if !slices.Contains(names, m) {
			t.Errorf("the SBOM lacks %s, which the binary links", m)
		}
	}
	if slices.Contains(names, "github.com/CycloneDX/cyclonedx-go") {
		t.Error("the SBOM lists cyclonedx-go, which only the SBOM tool links: it describes the wrong binary")
	}
}
