package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// checkSBOM reads the SBOM back from the unpacked archive of o, as oras or
// crane find it in a layout: a manifest listed in index.json of artifact
// type CycloneDX whose subject is the image index, its one layer the SBOM
// written beside the archive. The SBOM describes this image: the index's
// digest, each platform's binary by the SHA-256 of the file in the image
// (bins), every module with a licence, and the Go standard library.
func checkSBOM(t *testing.T, o options, root string, bins map[string]string) {
	t.Helper()
	lp, err := layout.FromPath(root)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := outer.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 2 {
		t.Fatalf("index.json lists %d manifests, want the image index and its SBOM", len(im.Manifests))
	}
	image, ref := im.Manifests[0], im.Manifests[1]
	if ref.ArtifactType != SBOMType || ref.MediaType != types.OCIManifestSchema1 || ref.Annotations["io.containerd.image.name"] != "" {
		t.Fatalf("index.json's second entry %+v: want an unnamed manifest of artifact type %s", ref, SBOMType)
	}
	raw := readBlob(t, lp, ref.Digest)
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != SBOMType || m.Subject == nil || m.Subject.Digest != image.Digest ||
		m.Subject.MediaType != types.OCIImageIndex || m.Subject.Size != image.Size {
		t.Fatalf("the SBOM's manifest: artifactType %q, subject %+v; want %s and the image index %s", m.ArtifactType, m.Subject, SBOMType, image.Digest)
	}
	if m.Config.MediaType != emptyConfig || string(readBlob(t, lp, m.Config.Digest)) != "{}" {
		t.Errorf("the SBOM's config %+v, want the OCI empty descriptor", m.Config)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != SBOMType {
		t.Fatalf("the SBOM's layers %+v, want one of %s", m.Layers, SBOMType)
	}
	doc := readBlob(t, lp, m.Layers[0].Digest)
	if file, err := os.ReadFile(o.sbom); err != nil || !bytes.Equal(file, doc) {
		t.Errorf("the SBOM in the archive is not the file %s (%v)", o.sbom, err)
	}

	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(doc), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatalf("the SBOM does not decode as CycloneDX: %v", err)
	}
	root0 := bom.Metadata.Component
	if root0 == nil || root0.Type != cdx.ComponentTypeContainer || root0.Name != o.repository || root0.Version != o.version ||
		!strings.Contains(root0.PackageURL, strings.Replace(image.Digest.String(), ":", "%3A", 1)) {
		t.Errorf("the SBOM's subject component %+v, want the image %s at %s", root0, o.Ref(), image.Digest)
	}
	if bom.Metadata.Tools == nil || bom.Metadata.Tools.Components == nil || !strings.Contains(toolNames(bom), "github.com/CycloneDX/cyclonedx-go@v") {
		t.Errorf("the SBOM's tools %q do not name cyclonedx-go at a version", toolNames(bom))
	}
	hashes := map[string]bool{}
	stdlib, modules := false, 0
	for _, c := range *bom.Components {
		if c.Licenses == nil || len(*c.Licenses) == 0 || (*c.Licenses)[0].License == nil || (*c.Licenses)[0].License.ID == "" {
			t.Errorf("component %s@%s has no licence by SPDX id: %+v", c.Name, c.Version, c.Licenses)
		}
		switch {
		case c.Type == cdx.ComponentTypeApplication:
			if c.Hashes != nil {
				for _, h := range *c.Hashes {
					hashes[h.Value] = true
				}
			}
		case c.Name == "stdlib":
			stdlib = c.Version == runtime.Version() && c.PackageURL == "pkg:golang/stdlib@"+runtime.Version()
		case strings.HasPrefix(c.PackageURL, "pkg:golang/"):
			modules++
		}
	}
	for p, sum := range bins {
		if !hashes[sum] {
			t.Errorf("the SBOM has no application component with the SHA-256 of the %s binary in the image", p)
		}
	}
	if !stdlib {
		t.Errorf("the SBOM has no component for the Go standard library at %s", runtime.Version())
	}
	if modules < 50 {
		t.Errorf("the SBOM lists %d modules; the operator links about 100", modules)
	}
}

func toolNames(bom cdx.BOM) string {
	var s []string
	if bom.Metadata.Tools != nil && bom.Metadata.Tools.Components != nil {
		for _, c := range *bom.Metadata.Tools.Components {
			s = append(s, c.Name+"@"+c.Version)
		}
	}
	return strings.Join(s, " ")
}

func readBlob(t *testing.T, lp layout.Path, h v1.Hash) []byte {
	t.Helper()
	rc, err := lp.Blob(h)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
