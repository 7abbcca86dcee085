// Package sbom describes a container image of Go binaries as a CycloneDX
// SBOM: the image, each platform's binary, every module linked into the
// binaries with its licence, the Go standard library at the toolchain's
// version, and the other modules the image ships files of (the CA bundle's).
// The modules come from the binaries' own build information (exact versions
// and go.sum hashes, replacements applied), so the SBOM lists what ships, not
// what go.mod might allow; the edges between them come from go mod graph,
// restricted to the versions the build selected. The licences are read from
// each module's licence files in the module cache and named by SPDX id
// (github.com/google/licensecheck), so an unknown licence fails the SBOM
// rather than passing unlisted.
package sbom

import (
	"bufio"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// Image is what an SBOM describes: an image of one Go program built for
// several platforms.
type Image struct {
	// Repository and Tag name the image (ghcr.io/scopeplane/scopeplane, 0.1.0).
	Repository, Tag string
	// Digest is the digest of the image (its index), sha256:….
	Digest string
	// Binaries are the program's binary for each platform in the image.
	Binaries []Binary
	// Shipped are modules the image ships files of beyond the binaries.
	Shipped []Shipped
	// Graph is go mod graph's output for the main module, or nil for no
	// edges beyond the binaries' own.
	Graph io.Reader
	// Created is the SBOM's timestamp; zero for none.
	Created time.Time
	// Tool is the build information of the program writing the SBOM,
	// named as its tool with the libraries it writes with; nil for none.
	Tool *debug.BuildInfo
}

// Binary is one platform's binary of the image.
type Binary struct {
	// File is the binary on this machine, read for its build information.
	File string
	// Path is where the image holds it (/scopeplane).
	Path string
}

// Shipped is a module whose files the image ships (not linked code), and
// which file it ships.
type Shipped struct {
	Module debug.Module
	Path   string
}

// Build returns the SBOM of the image; version names the main module's
// version (the binaries' build information says (devel) when built from a
// checkout). Licences are looked up through lic.
func Build(img Image, version string, lic *Licenses) (*cdx.BOM, error) {
	if len(img.Binaries) == 0 {
		return nil, errors.New("an image with no binaries")
	}
	if version == "" {
		return nil, errors.New("no version of the main module")
	}
	// The image's package URL, as purl's oci type spells it.
	imagePURL := "pkg:oci/" + lastElem(img.Repository) + "@" + strings.ReplaceAll(img.Digest, ":", "%3A") +
		"?repository_url=" + img.Repository + "&tag=" + img.Tag
	root := cdx.Component{
		BOMRef:     imagePURL,
		Type:       cdx.ComponentTypeContainer,
		Name:       img.Repository,
		Version:    img.Tag,
		Hashes:     digestHash(img.Digest),
		PackageURL: imagePURL,
	}

	var (
		components []cdx.Component
		// ref is, by module path, the bom-ref of the version the build
		// selected; selected, that version (as go mod graph names it).
		ref      = map[string]string{}
		selected = map[string]string{}
		mainRefs []string
		stdRef   string
		edges    = map[string][]string{}
		mainPath string
	)
	for _, b := range img.Binaries {
		info, err := buildinfo.ReadFile(b.File)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (is it a Go binary?)", b.File, err)
		}
		if mainPath != "" && info.Main.Path != mainPath {
			return nil, fmt.Errorf("%s is a build of %s, the others of %s", b.File, info.Main.Path, mainPath)
		}
		mainPath = info.Main.Path
		sum, err := fileSHA256(b.File)
		if err != nil {
			return nil, err
		}
		goos, goarch := setting(info, "GOOS"), setting(info, "GOARCH")
		binRef := purl(info.Main.Path, version) + "?goarch=" + goarch + "&goos=" + goos
		licences, err := lic.Module(info.Main.Path, "")
		if err != nil {
			return nil, err
		}
		props := buildProperties(info)
		props = append(props, cdx.Property{Name: "oci:image:path", Value: b.Path})
		components = append(components, cdx.Component{
			BOMRef:     binRef,
			Type:       cdx.ComponentTypeApplication,
			Name:       info.Main.Path,
			Version:    version,
			PackageURL: binRef,
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}},
			Licenses:   licences,
			Properties: &props,
		})
		edges[root.BOMRef] = append(edges[root.BOMRef], binRef)
		mainRefs = append(mainRefs, binRef)

		if stdRef == "" {
			c, err := stdlib(info.GoVersion, lic)
			if err != nil {
				return nil, err
			}
			components = append(components, c)
			stdRef = c.BOMRef
		} else if want := "pkg:golang/stdlib@" + info.GoVersion; want != stdRef {
			return nil, fmt.Errorf("%s is built with %s, the others with %s", b.File, info.GoVersion, stdRef)
		}
		edges[binRef] = append(edges[binRef], stdRef)

		for _, d := range info.Deps {
			if _, seen := ref[d.Path]; seen {
				continue
			}
			c, err := module(d, lic)
			if err != nil {
				return nil, err
			}
			components = append(components, c)
			ref[d.Path], selected[d.Path] = c.BOMRef, d.Version
			edges[c.BOMRef] = nil
		}
	}
	for _, s := range img.Shipped {
		c, err := module(&s.Module, lic)
		if err != nil {
			return nil, err
		}
		// A module both linked in and shipped is one component, which says both.
		i := slices.IndexFunc(components, func(l cdx.Component) bool { return l.BOMRef == c.BOMRef })
		if i < 0 {
			components, i = append(components, c), len(components)
		}
		*components[i].Properties = append(*components[i].Properties, cdx.Property{Name: "oci:image:path", Value: s.Path})
		edges[root.BOMRef] = append(edges[root.BOMRef], c.BOMRef)
	}
	if img.Graph != nil {
		if err := addEdges(edges, img.Graph, mainPath, mainRefs, selected, ref); err != nil {
			return nil, err
		}
	}
	var deps []cdx.Dependency
	for from, on := range edges {
		slices.Sort(on)
		d := cdx.Dependency{Ref: from}
		if on = slices.Compact(on); len(on) > 0 {
			d.Dependencies = &on
		}
		deps = append(deps, d)
	}
	slices.SortFunc(deps, func(a, b cdx.Dependency) int { return strings.Compare(a.Ref, b.Ref) })

	bom := cdx.NewBOM()
	bom.SerialNumber = "" // random; the SBOM of the same inputs is the same bytes
	bom.Metadata = &cdx.Metadata{Component: &root, Tools: tools(img.Tool)}
	if !img.Created.IsZero() {
		bom.Metadata.Timestamp = img.Created.Format(time.RFC3339)
	}
	bom.Components = &components
	bom.Dependencies = &deps
	return bom, nil
}

// module is the component of one module version, with its licences.
func module(d *debug.Module, lic *Licenses) (cdx.Component, error) {
	m := d
	if d.Replace != nil {
		m = d.Replace
	}
	licences, err := lic.Module(m.Path, m.Version)
	if err != nil {
		return cdx.Component{}, err
	}
	c := cdx.Component{
		BOMRef:     purl(d.Path, m.Version),
		Type:       cdx.ComponentTypeLibrary,
		Name:       d.Path,
		Version:    m.Version,
		PackageURL: purl(d.Path, m.Version),
		Licenses:   licences,
	}
	props := []cdx.Property{}
	if m.Sum != "" {
		props = append(props, cdx.Property{Name: "go:module:sum", Value: m.Sum})
	}
	if d.Replace != nil {
		props = append(props, cdx.Property{Name: "go:module:replaced-by", Value: d.Replace.Path + "@" + d.Replace.Version})
	}
	c.Properties = &props
	return c, nil
}

// stdlib is the component of the Go standard library linked in, at the
// version of the toolchain that built the binaries; its licence is the one
// of the toolchain on this machine, which must be that version.
func stdlib(goVersion string, lic *Licenses) (cdx.Component, error) {
	licences, err := lic.Stdlib(goVersion)
	if err != nil {
		return cdx.Component{}, err
	}
	p := "pkg:golang/stdlib@" + goVersion
	return cdx.Component{
		BOMRef:     p,
		Type:       cdx.ComponentTypeLibrary,
		Name:       "stdlib",
		Version:    goVersion,
		PackageURL: p,
		Licenses:   licences,
		Properties: &[]cdx.Property{{Name: "go:stdlib", Value: "the Go standard library, linked into the binaries"}},
	}, nil
}

// tools names what wrote the SBOM: the program, at its main module's
// version, and the libraries it writes with (CycloneDX, licence scanning).
func tools(info *debug.BuildInfo) *cdx.ToolsChoice {
	if info == nil {
		return nil
	}
	tools := []cdx.Component{{Type: cdx.ComponentTypeApplication, Name: info.Path, Version: info.Main.Version}}
	for _, d := range info.Deps {
		if d.Path == "github.com/CycloneDX/cyclonedx-go" || d.Path == "github.com/google/licensecheck" {
			tools = append(tools, cdx.Component{Type: cdx.ComponentTypeLibrary, Name: d.Path, Version: d.Version, PackageURL: purl(d.Path, d.Version)})
		}
	}
	return &cdx.ToolsChoice{Components: &tools}
}

// addEdges adds go mod graph's edges between linked modules: from a module
// at the version the build selected (or the main module, whose edges go
// from each binary) to the version of the required module the build
// selected, when it is linked in.
func addEdges(edges map[string][]string, graph io.Reader, mainPath string, mainRefs []string, selected, ref map[string]string) error {
	sc := bufio.NewScanner(graph)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		fromPath, fromVersion, _ := strings.Cut(from, "@")
		toPath, _, _ := strings.Cut(to, "@")
		toRef, linked := ref[toPath]
		if !linked {
			continue // a module not linked in
		}
		if fromPath == mainPath {
			for _, r := range mainRefs {
				edges[r] = append(edges[r], toRef)
			}
			continue
		}
		if fv, linked := selected[fromPath]; linked && fromVersion == fv {
			edges[ref[fromPath]] = append(edges[ref[fromPath]], toRef)
		}
	}
	return sc.Err()
}

// buildProperties records how the binary was built (Go version, target,
// flags), from its build information.
func buildProperties(info *buildinfo.BuildInfo) []cdx.Property {
	props := []cdx.Property{{Name: "go:version", Value: info.GoVersion}}
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS", "GOARCH", "GOAMD64", "GOARM64", "CGO_ENABLED", "-trimpath", "-ldflags", "-tags":
			props = append(props, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
		}
	}
	return props
}

func setting(info *buildinfo.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// purl is the package URL of a Go module version.
func purl(path, version string) string {
	return "pkg:golang/" + path + "@" + version
}

func lastElem(repository string) string {
	return repository[strings.LastIndex(repository, "/")+1:]
}

// digestHash is the image digest as a CycloneDX hash.
func digestHash(digest string) *[]cdx.Hash {
	alg, sum, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" {
		return nil
	}
	return &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: sum}}
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
