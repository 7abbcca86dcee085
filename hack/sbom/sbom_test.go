package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// TestSBOMOfABinary describes this test's own binary (a Go binary that links
// cyclonedx-go) with the module graph of this module, writes it as CycloneDX
// JSON and reads it back: the main module is the root at the version given,
// every linked module is a component with its purl and go.sum hash, and every
// edge joins components of the SBOM, including the main module's edge to
// cyclonedx-go.
func TestSBOMOfABinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	graph, err := exec.Command("go", "mod", "graph").Output()
	if err != nil {
		t.Fatalf("go mod graph: %v", err)
	}
	bom, err := Build(exe, "v9.9.9", bytes.NewReader(graph), time.Time{})
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
	if root.PackageURL != "pkg:golang/github.com/scopeplane/scopeplane@v9.9.9" || root.Type != cdx.ComponentTypeApplication {
		t.Errorf("root component %+v, want the main module at v9.9.9", root)
	}
	refs := map[string]bool{root.BOMRef: true}
	var lib *cdx.Component
	for i, c := range *got.Components {
		refs[c.BOMRef] = true
		if c.Name == "github.com/CycloneDX/cyclonedx-go" {
			lib = &(*got.Components)[i]
		}
		if !strings.HasPrefix(c.PackageURL, "pkg:golang/"+c.Name+"@v") {
			t.Errorf("component %s has purl %q", c.Name, c.PackageURL)
		}
	}
	if lib == nil {
		t.Fatal("cyclonedx-go, linked into this binary, is not a component")
	}
	if lib.Properties == nil || !slices.ContainsFunc(*lib.Properties, func(p cdx.Property) bool {
		return p.Name == "go:module:sum" && strings.HasPrefix(p.Value, "h1:")
	}) {
		t.Errorf("cyclonedx-go carries no go.sum hash: %+v", lib.Properties)
	}
	var rootEdges []string
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
		if d.Ref == root.BOMRef {
			rootEdges = *d.Dependencies
		}
	}
	if !slices.Contains(rootEdges, lib.BOMRef) {
		t.Errorf("the main module's edges %q miss %s", rootEdges, lib.BOMRef)
	}
}

// A file that is not a Go binary is refused with a clear error.
func TestSBOMRefusesANonBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-a-binary")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(path, "v1.0.0", nil, time.Time{}); err == nil || !strings.Contains(err.Error(), "is it a Go binary") {
		t.Errorf("Build of a shell script: %v, want an error saying it is not a Go binary", err)
	}
}
