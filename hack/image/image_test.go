package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/scopeplane/scopeplane/hack/ocitest"
)

// TestImage builds each image as make image does, unpacks the archive and
// checks what a container runtime would use: the index names the tag, each
// platform's config (entrypoint, default arguments, user, architecture),
// the binary's ELF machine, the base files, and that the binary for this
// machine runs. The operator's image is built twice: it is reproducible.
func TestImage(t *testing.T) {
	const version = "0.0.0-test"
	for _, c := range []struct {
		name      string
		platforms []string
		cmd       string
		// probe runs the binary; want is what its output starts with.
		probe, want string
	}{
		{name: "scopeplane", platforms: []string{"linux/amd64", "linux/arm64"}, probe: "--version", want: "scopeplane " + version + " "},
		// The quickstart's workload is built for this machine only here:
		// its path to an image is the operator's, tested above.
		{name: "scopeplane-demo", platforms: []string{"linux/" + runtime.GOARCH}, cmd: "pause", probe: "nope", want: `unknown command "nope"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			archive := filepath.Join(dir, "image.tar")
			o := options{artifact: artifacts[c.name], name: c.name, version: version, repository: "example.test/" + c.name,
				out: archive, platforms: c.platforms, src: "../.."}
			if c.name == "scopeplane" {
				o.sbom = filepath.Join(dir, "sbom.json")
			}
			if err := build(o); err != nil {
				t.Fatal(err)
			}
			bins := check(t, o, dir, archive, c.cmd, c.probe, c.want)
			var got []string
			for _, p := range c.platforms {
				if _, ok := bins[p]; ok {
					got = append(got, p)
				}
			}
			if len(bins) != len(c.platforms) || strings.Join(got, ",") != strings.Join(c.platforms, ",") {
				t.Errorf("platforms %v, want %v", bins, c.platforms)
			}
			if c.name != "scopeplane" {
				return
			}
			checkSBOM(t, o, filepath.Join(dir, "unpacked"), bins)
			// The same inputs make the same archive, byte for byte.
			again := filepath.Join(dir, "again.tar")
			o.out, o.sbom = again, filepath.Join(dir, "again.json")
			if err := build(o); err != nil {
				t.Fatal(err)
			}
			a, _ := os.ReadFile(archive)
			b, _ := os.ReadFile(again)
			if !bytes.Equal(a, b) {
				t.Error("two builds of the same source differ: the image is not reproducible")
			}
		})
	}
}

// check unpacks the archive of o and checks it; it returns the SHA-256 of
// the binary of each platform the archive holds.
func check(t *testing.T, o options, dir, archive, cmd, probe, want string) map[string]string {
	t.Helper()
	root := filepath.Join(dir, "unpacked")
	ocitest.Untar(t, archive, root)

	var index struct {
		Manifests []struct {
			MediaType   string            `json:"mediaType"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	readJSON(t, filepath.Join(root, "index.json"), &index)
	entries := 1 // the image index; and its SBOM, when one is attached
	if o.sbom != "" {
		entries = 2
	}
	if len(index.Manifests) != entries || index.Manifests[0].MediaType != string(types.OCIImageIndex) ||
		index.Manifests[0].Annotations["io.containerd.image.name"] != o.Ref() ||
		index.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != o.version {
		t.Fatalf("index.json does not name one image index with the tag: %+v", index)
	}

	lp, err := layout.FromPath(root)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, _ := outer.IndexManifest()
	idx, err := outer.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	list, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range list.Manifests {
		arch := m.Platform.Architecture
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != arch || cf.OS != "linux" || cf.Config.User != "65532:65532" ||
			strings.Join(cf.Config.Entrypoint, " ") != "/"+o.name || strings.Join(cf.Config.Cmd, " ") != cmd ||
			cf.Config.Labels["org.opencontainers.image.version"] != o.version {
			t.Errorf("%s config: arch %s, os %s, user %q, entrypoint %q, cmd %q, labels %v", arch, cf.Architecture, cf.OS,
				cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Labels)
		}
		files := map[string][]byte{}
		for name, f := range ocitest.Flatten(t, img) {
			files[name] = f.Data
		}
		checkBase(t, arch, files)
		bin := files[o.name]
		got[m.Platform.OS+"/"+arch] = fmt.Sprintf("%x", sha256.Sum256(bin))
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s /%s: %v", arch, o.name, err)
		}
		if want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]; f.Machine != want {
			t.Errorf("%s /%s is built for %v", arch, o.name, f.Machine)
		}
		if arch == runtime.GOARCH {
			path := filepath.Join(dir, o.name+"-"+arch)
			if err := os.WriteFile(path, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			out, _ := exec.Command(path, probe).CombinedOutput()
			if !strings.Contains(string(out), want) {
				t.Errorf("/%s %s: %q, want it to say %q", o.name, probe, out, want)
			}
		}
	}
	return got
}

func checkBase(t *testing.T, arch string, files map[string][]byte) {
	t.Helper()
	if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") || !strings.Contains(string(files["etc/group"]), "nonroot:x:65532:") {
		t.Errorf("%s: no passwd or group entry for 65532", arch)
	}
	n := 0
	for rest := files["etc/ssl/certs/ca-certificates.crt"]; ; n++ {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			t.Fatalf("%s CA bundle: %v", arch, err)
		}
	}
	if n < 100 {
		t.Errorf("%s CA bundle holds %d certificates", arch, n)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
