package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/scopeplane/scopeplane/hack/sbom"
)

const (
	// SBOMType is the media type of a CycloneDX JSON document, the artifact
	// type of the SBOM's manifest and the media type of its one layer.
	SBOMType = "application/vnd.cyclonedx+json"
	// emptyConfig is the OCI 1.1 empty descriptor's media type, the config
	// of an artifact that has none.
	emptyConfig = "application/vnd.oci.empty.v1+json"
)

// attachSBOM writes the SBOM of the image index idx (its binaries bins,
// built from o) to o.sbom, and adds it to the layout as an OCI 1.1 referrer
// of idx: a manifest of artifact type CycloneDX whose subject is idx and
// whose one layer is the SBOM, listed in the layout's index.json (without a
// name, so that importers take only the image), where oras and crane find
// referrers in a layout and copy them with the image.
func attachSBOM(lp layout.Path, idx v1.ImageIndex, o options, bins []sbom.Binary, created time.Time) error {
	subject, err := descriptor(idx)
	if err != nil {
		return err
	}
	doc, err := sbomOf(o, subject.Digest.String(), bins, created)
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.sbom, doc, 0o644); err != nil {
		return err
	}
	config := []byte("{}")
	configDesc, err := blob(lp, config, emptyConfig)
	if err != nil {
		return err
	}
	layerDesc, err := blob(lp, doc, SBOMType)
	if err != nil {
		return err
	}
	layerDesc.Annotations = map[string]string{"org.opencontainers.image.title": o.name + "-" + o.version + ".cdx.json"}
	annotations := map[string]string{"org.opencontainers.image.created": created.Format(time.RFC3339)}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  SBOMType,
		Config:        configDesc,
		Layers:        []v1.Descriptor{layerDesc},
		Subject:       &subject,
		Annotations:   annotations,
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	desc, err := blob(lp, raw, string(types.OCIManifestSchema1))
	if err != nil {
		return err
	}
	desc.ArtifactType, desc.Annotations = SBOMType, annotations
	return lp.AppendDescriptor(desc)
}

// sbomOf is the CycloneDX JSON of the image whose index has the digest.
func sbomOf(o options, digest string, bins []sbom.Binary, created time.Time) ([]byte, error) {
	graph := exec.Command("go", "mod", "graph")
	graph.Dir = o.src
	graph.Stderr = os.Stderr
	g, err := graph.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod graph in %s: %w", o.src, err)
	}
	lic, err := sbom.DefaultLicenses(o.src)
	if err != nil {
		return nil, err
	}
	ca, tool, err := bundleModule()
	if err != nil {
		return nil, err
	}
	bom, err := sbom.Build(sbom.Image{
		Repository: o.repository, Tag: o.version, Digest: digest,
		Binaries: bins,
		Shipped:  []sbom.Shipped{{Module: ca, Path: "/etc/ssl/certs/ca-certificates.crt"}},
		Graph:    bytes.NewReader(g),
		Created:  created,
		Tool:     tool,
	}, "v"+o.version, lic)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// bundleModule is the module of the CA bundle the base ships, at the
// version linked into this command (the one go.mod pins), and this
// command's build information, which names it as the SBOM's tool.
func bundleModule() (debug.Module, *debug.BuildInfo, error) {
	const path = "golang.org/x/crypto/x509roots/fallback"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return debug.Module{}, nil, fmt.Errorf("no build information to name the version of %s", path)
	}
	for _, d := range info.Deps {
		if d.Path == path {
			return *d, info, nil
		}
	}
	return debug.Module{}, nil, fmt.Errorf("%s is not linked into this command", path)
}

// descriptor is the descriptor of an index, as a subject names it.
func descriptor(idx v1.ImageIndex) (v1.Descriptor, error) {
	d, err := idx.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	size, err := idx.Size()
	if err != nil {
		return v1.Descriptor{}, err
	}
	mt, err := idx.MediaType()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: mt, Digest: d, Size: size}, nil
}

// blob writes data into the layout's blobs and returns its descriptor.
func blob(lp layout.Path, data []byte, mediaType string) (v1.Descriptor, error) {
	h, size, err := v1.SHA256(bytes.NewReader(data))
	if err != nil {
		return v1.Descriptor{}, err
	}
	if err := lp.WriteBlob(h, io.NopCloser(bytes.NewReader(data))); err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: types.MediaType(mediaType), Digest: h, Size: size}, nil
}
