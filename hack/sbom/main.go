// Command sbom writes a CycloneDX SBOM (JSON) of a Go binary: the main module
// and every module linked into it, as the binary's own build information
// records them (exact versions and go.sum hashes, replacements applied), and
// the edges between them from the module graph (go mod graph), restricted to
// the versions the build selected. make release runs it on the release's
// binary, so the SBOM lists what ships, not what go.mod might allow.
package main

import (
	"bufio"
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

func main() {
	binary := flag.String("binary", "", "the Go binary to describe")
	version := flag.String("version", "", "the release version of the main module (its build information says (devel) when built from a checkout)")
	modroot := flag.String("modroot", "", "directory of the main module, where go mod graph runs for the dependency edges (empty: no edges beyond the main module's)")
	out := flag.String("out", "", "file to write the SBOM to (default: standard output)")
	flag.Parse()
	if *binary == "" {
		fmt.Fprintln(os.Stderr, "sbom: -binary is required")
		os.Exit(2)
	}
	var graph io.Reader
	if *modroot != "" {
		cmd := exec.Command("go", "mod", "graph")
		cmd.Dir = *modroot
		cmd.Stderr = os.Stderr
		b, err := cmd.Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "sbom: go mod graph in %s: %v\n", *modroot, err)
			os.Exit(1)
		}
		graph = bytes.NewReader(b)
	}
	bom, err := Build(*binary, *version, graph, sourceDate())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
	if err := write(bom, *out); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

// write encodes bom as JSON to the file out, or to standard output when out
// is empty; a file that cannot be closed is an error too, since its last
// bytes may not have been written.
func write(bom *cdx.BOM, out string) error {
	if out == "" {
		return cdx.NewBOMEncoder(os.Stdout, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom)
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := cdx.NewBOMEncoder(f, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// sourceDate is SOURCE_DATE_EPOCH, so that a rebuild of the same release
// writes the same SBOM; zero (no timestamp) without it.
func sourceDate() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Time{}
}

// purl is the package URL of a Go module version.
func purl(path, version string) string {
	return "pkg:golang/" + path + "@" + version
}

// Build returns the SBOM of the binary at path. version names the main
// module's version when its build information has none; graph, when not
// nil, is go mod graph's output, from which the edges between the linked
// modules are taken.
func Build(path, version string, graph io.Reader, when time.Time) (*cdx.BOM, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (is it a Go binary?)", path, err)
	}
	mainVersion := info.Main.Version
	if version != "" {
		mainVersion = version
	}
	if mainVersion == "" || mainVersion == "(devel)" {
		return nil, errors.New("the binary's build information names no version of its main module: pass -version")
	}
	root := cdx.Component{
		BOMRef:     purl(info.Main.Path, mainVersion),
		Type:       cdx.ComponentTypeApplication,
		Name:       info.Main.Path,
		Version:    mainVersion,
		PackageURL: purl(info.Main.Path, mainVersion),
		Properties: buildProperties(info),
	}
	// selected is, by module path, the version the build selected (as go
	// mod graph names it); ref, the component that stands for it.
	selected := map[string]string{info.Main.Path: ""}
	ref := map[string]string{info.Main.Path: root.BOMRef}
	var components []cdx.Component
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		c := cdx.Component{
			BOMRef:     purl(d.Path, m.Version),
			Type:       cdx.ComponentTypeLibrary,
			Name:       d.Path,
			Version:    m.Version,
			PackageURL: purl(d.Path, m.Version),
		}
		var props []cdx.Property
		if m.Sum != "" {
			props = append(props, cdx.Property{Name: "go:module:sum", Value: m.Sum})
		}
		if d.Replace != nil {
			props = append(props, cdx.Property{Name: "go:module:replaced-by", Value: d.Replace.Path + "@" + d.Replace.Version})
		}
		if len(props) > 0 {
			c.Properties = &props
		}
		components = append(components, c)
		selected[d.Path] = d.Version
		ref[d.Path] = c.BOMRef
	}
	edges := map[string][]string{}
	for _, r := range ref {
		edges[r] = nil
	}
	if graph != nil {
		if err := addEdges(edges, graph, info.Main.Path, selected, ref); err != nil {
			return nil, err
		}
	}
	var deps []cdx.Dependency
	for ref, on := range edges {
		slices.Sort(on)
		d := cdx.Dependency{Ref: ref}
		if on = slices.Compact(on); len(on) > 0 {
			d.Dependencies = &on
		}
		deps = append(deps, d)
	}
	slices.SortFunc(deps, func(a, b cdx.Dependency) int { return strings.Compare(a.Ref, b.Ref) })

	bom := cdx.NewBOM()
	bom.SerialNumber = ""
	bom.Metadata = &cdx.Metadata{Component: &root}
	if !when.IsZero() {
		bom.Metadata.Timestamp = when.Format(time.RFC3339)
	}
	bom.Components = &components
	bom.Dependencies = &deps
	return bom, nil
}

// addEdges adds go mod graph's edges between linked modules: from a module
// at the version the build selected (or the main module) to the version of
// the required module the build selected, when it is linked in.
func addEdges(edges map[string][]string, graph io.Reader, mainPath string, selected, ref map[string]string) error {
	sc := bufio.NewScanner(graph)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		fromPath, fromVersion, _ := strings.Cut(from, "@")
		toPath, _, _ := strings.Cut(to, "@")
		fv, linked := selected[fromPath]
		if !linked || fromPath != mainPath && fromVersion != fv {
			continue // a version the build did not select, or a module not linked in
		}
		if _, linked := selected[toPath]; !linked || toPath == mainPath {
			continue
		}
		edges[ref[fromPath]] = append(edges[ref[fromPath]], ref[toPath])
	}
	return sc.Err()
}

// buildProperties records how the binary was built (Go version, target,
// flags), from its build information.
func buildProperties(info *buildinfo.BuildInfo) *[]cdx.Property {
	props := []cdx.Property{{Name: "go:version", Value: info.GoVersion}}
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS", "GOARCH", "CGO_ENABLED", "-trimpath", "-ldflags", "-tags":
			props = append(props, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
		}
	}
	return &props
}
