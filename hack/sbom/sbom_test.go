package sbom

import (
	"bytes"
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// TestSBOMOfAnImage describes an image holding a binary of hack/image (a
// Go binary that links cyclonedx-go and licensecheck), written by that
// binary as the tool, with the module graph of this module, writes it as CycloneDX JSON and reads it back: the image is
// the root, the binary an application at the version given with its hash,
// every linked module a component with its purl, go.sum hash and a licence
// by SPDX id, the standard library a component at the toolchain's version,
// the tools that wrote it are named, and every edge joins components of the
// SBOM.
func TestSBOMOfAnImage(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "image")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", exe, "../image").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tool, err := buildinfo.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	graph, err := exec.Command("go", "mod", "graph").Output()
	if err != nil {
		t.Fatalf("go mod graph: %v", err)
	}
	lic, err := DefaultLicenses("../..")
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	bom, err := Build(Image{Repository: "example.test/scopeplane", Tag: "9.9.9", Digest: digest,
		Binaries: []Binary{{File: exe, Path: "/scopeplane"}}, Graph: bytes.NewReader(graph), Tool: tool}, "v9.9.9", lic)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).Encode(bom); err != nil {
		t.Fatal(err)
	}
	var got cdx.BOM
	if err := cdx.NewBOMDecoder(&buf, cdx.BOMFileFormatJSON).Decode(&got); err != nil {
		t.Fatalf("the SBOM does not decode as CycloneDX: %v", err)
	}
	root := got.Metadata.Component
	if root.Type != cdx.ComponentTypeContainer || root.Name != "example.test/scopeplane" || root.Version != "9.9.9" ||
		!strings.Contains(root.PackageURL, "sha256%3A0123") {
		t.Errorf("root component %+v, want the image", root)
	}
	var tools []string
	if got.Metadata.Tools != nil && got.Metadata.Tools.Components != nil {
		for _, c := range *got.Metadata.Tools.Components {
			tools = append(tools, c.Name+"@"+c.Version)
		}
	}
	if !slices.ContainsFunc(tools, func(s string) bool { return strings.HasPrefix(s, "github.com/CycloneDX/cyclonedx-go@v") }) {
		t.Errorf("tools %q do not name cyclonedx-go at a version", tools)
	}

	refs := map[string]bool{root.BOMRef: true}
	byName := map[string]cdx.Component{}
	for _, c := range *got.Components {
		refs[c.BOMRef] = true
		byName[c.Name] = c
		if c.Licenses == nil || len(*c.Licenses) == 0 {
			t.Errorf("component %s@%s has no licence", c.Name, c.Version)
			continue
		}
		for _, l := range *c.Licenses {
			if l.License == nil || l.License.ID == "" && l.License.Name == "" {
				t.Errorf("component %s has an empty licence %+v", c.Name, l)
			}
		}
	}
	app := byName["github.com/scopeplane/scopeplane"]
	if app.Type != cdx.ComponentTypeApplication || app.Version != "v9.9.9" || app.Hashes == nil || ids(app) != "Apache-2.0" {
		t.Errorf("the binary's component %+v, want the application at v9.9.9 with its hash and Apache-2.0", app)
	}
	std := byName["stdlib"]
	if std.Version != runtime.Version() || std.PackageURL != "pkg:golang/stdlib@"+runtime.Version() || ids(std) != "BSD-3-Clause" {
		t.Errorf("standard library %+v (licences %s), want %s under BSD-3-Clause", std, ids(std), runtime.Version())
	}
	lib, ok := byName["github.com/CycloneDX/cyclonedx-go"]
	if !ok {
		t.Fatal("cyclonedx-go, linked into this binary, is not a component")
	}
	if ids(lib) != "Apache-2.0" || lib.Properties == nil || !slices.ContainsFunc(*lib.Properties, func(p cdx.Property) bool {
		return p.Name == "go:module:sum" && strings.HasPrefix(p.Value, "h1:")
	}) {
		t.Errorf("cyclonedx-go: licences %s, properties %+v; want Apache-2.0 and a go.sum hash", ids(lib), lib.Properties)
	}
	if ids(byName["github.com/google/licensecheck"]) != "BSD-3-Clause" {
		t.Errorf("licensecheck's licences %s, want BSD-3-Clause", ids(byName["github.com/google/licensecheck"]))
	}
	edges := map[string][]string{}
	for _, d := range *got.Dependencies {
		if !refs[d.Ref] {
			t.Errorf("dependency entry for %s, which is no component", d.Ref)
		}
		if d.Dependencies == nil {
			continue
		}
		for _, on := range *d.Dependencies {
			if !refs[on] {
				t.Errorf("%s depends on %s, which is no component", d.Ref, on)
			}
		}
		edges[d.Ref] = *d.Dependencies
	}
	if !slices.Contains(edges[root.BOMRef], app.BOMRef) || !slices.Contains(edges[app.BOMRef], lib.BOMRef) ||
		!slices.Contains(edges[app.BOMRef], std.BOMRef) {
		t.Errorf("edges: image %q, binary %q; want image → binary → cyclonedx-go and the standard library", edges[root.BOMRef], edges[app.BOMRef])
	}
}

// ids is a component's licence ids, joined by commas.
func ids(c cdx.Component) string {
	var s []string
	if c.Licenses != nil {
		for _, l := range *c.Licenses {
			if l.License != nil {
				s = append(s, l.License.ID)
			}
		}
	}
	return strings.Join(s, ",")
}

// A file that is not a Go binary is refused with a clear error.
func TestSBOMRefusesANonBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-a-binary")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Build(Image{Binaries: []Binary{{File: path}}}, "v1.0.0", &Licenses{})
	if err == nil || !strings.Contains(err.Error(), "is it a Go binary") {
		t.Errorf("Build of a shell script: %v, want an error saying it is not a Go binary", err)
	}
}

// A module whose licence is missing or unknown fails the SBOM: it says
// every module's licence, or it is not written.
func TestLicenceScan(t *testing.T) {
	mit := "MIT License\n\nCopyright (c) 2026 Someone\n\n" +
		"Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the \"Software\"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions:\n\n" +
		"The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software.\n\n" +
		"THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.\n"
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string // ids, or the error's words
	}{
		{"mit", map[string]string{"LICENSE": mit, "README.md": "# x"}, "MIT"},
		{"none", map[string]string{"README.md": "# x"}, "no licence file"},
		{"unknown", map[string]string{"COPYING": "All rights reserved. Ask us before you use this."}, "under 75%"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, text := range c.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := scanDir(dir)
			if err != nil {
				if !strings.Contains(err.Error(), c.want) {
					t.Errorf("scan: %v, want %q", err, c.want)
				}
				return
			}
			if strings.Join(got, ",") != c.want {
				t.Errorf("scan: %q, want %q", got, c.want)
			}
		})
	}
}
