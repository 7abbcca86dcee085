// Command image builds scopeplane's container images without a container
// engine: a multi-arch OCI image index (linux/amd64 and linux/arm64 by
// default) of one static binary on a scratch-style base — a CA bundle, a
// passwd and group entry for the non-root user 65532, a writable /tmp — and
// writes it as an OCI layout archive that `docker load` (Docker 25+),
// `kind load image-archive` and `ctr images import` read. It builds the
// operator's image (-image scopeplane) and the quickstart's workload
// (-image scopeplane-demo, cmd/scopeplane-demo) the same way, so that the
// quickstart runs on a cluster that pulls nothing but what it is given.
//
// The build is reproducible: the binaries are built with -trimpath, every
// file and the image config carry the same timestamp (SOURCE_DATE_EPOCH, or
// the Unix epoch), and the CA bundle is Mozilla's, from the Go module
// golang.org/x/crypto/x509roots/fallback pinned in go.mod.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"

	"github.com/scopeplane/scopeplane/hack/sbom"
	"github.com/scopeplane/scopeplane/hack/sourcedate"
)

// User is the image's non-root user and group.
const User = 65532

// An artifact is one image this command builds: the package of its binary,
// and what the image's config says to a runtime.
type artifact struct {
	// pkg is the binary's package, relative to -src; the binary is /<name>.
	pkg string
	// cmd is the default arguments to the binary.
	cmd []string
	// ports are the ports the binary serves on, with what they are for.
	ports []string
}

// artifacts are the images, by name: the name is the repository's last
// element and the binary's name in the image.
var artifacts = map[string]artifact{
	// 18000: xDS (ADS gRPC); 8080: metrics; 8081: /healthz and /readyz.
	"scopeplane": {pkg: ".", ports: []string{"18000/tcp", "8080/tcp", "8081/tcp"}},
	// 50051: whoami's gRPC; 8080: the xDS client's /counts and /ready.
	// "pause" by default, so the image can be a node's Pod sandbox.
	"scopeplane-demo": {pkg: "./cmd/scopeplane-demo", cmd: []string{"pause"}, ports: []string{"50051/tcp", "8080/tcp"}},
}

func main() {
	var (
		name       = flag.String("image", "scopeplane", "The image to build: scopeplane (the operator) or scopeplane-demo (the quickstart's backend and client).")
		version    = flag.String("version", "", "The binary's version and the image tag (the chart's appVersion).")
		repo       = flag.String("repository", "", "The image repository the archive names (default ghcr.io/scopeplane/<image>).")
		out        = flag.String("out", "", "Path of the OCI layout archive to write.")
		platforms  = flag.String("platforms", "linux/amd64,linux/arm64", "Comma-separated platforms to build.")
		src        = flag.String("src", ".", "The module to build (the repository root).")
		sbomOut    = flag.String("sbom", "", "Also write the image's CycloneDX SBOM to this file, and attach it to the archive as a referrer of the image.")
		rootfs     = flag.String("rootfs", "", "Instead of an archive, write the root file system of the image for the one platform of -platforms into this directory, as the Dockerfile copies it.")
		dockerfile = flag.Bool("dockerfile", false, "Instead of building, print the Dockerfile that builds the image with a container engine.")
	)
	flag.Parse()
	a, ok := artifacts[*name]
	if !ok {
		fmt.Fprintf(os.Stderr, "image: -image %q is none of scopeplane, scopeplane-demo\n", *name)
		os.Exit(2)
	}
	if *repo == "" {
		*repo = "ghcr.io/scopeplane/" + *name
	}
	o := options{name: *name, artifact: a, version: *version, repository: *repo, out: *out, sbom: *sbomOut,
		platforms: strings.Split(*platforms, ","), src: *src}
	var err error
	switch {
	case *dockerfile:
		var text string
		if text, err = dockerfileOf(o); err == nil {
			_, err = os.Stdout.WriteString(text)
		}
	case *version == "":
		err = errors.New("-version is required")
	case *rootfs != "":
		err = writeRootfs(o, *rootfs)
	case *out == "":
		err = errors.New("-out or -rootfs is required")
	default:
		err = build(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type options struct {
	artifact
	name, version, repository, out, sbom, src string
	platforms                                 []string
}

// Ref is the image reference the archive names.
func (o options) Ref() string { return o.repository + ":" + o.version }

func build(o options) error {
	created, err := sourcedate.Time()
	if err != nil {
		return err
	}
	base, err := baseLayer(created)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "scopeplane-image-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var bins []sbom.Binary
	for _, p := range o.platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return err
		}
		bin := filepath.Join(tmp, o.name+"-"+plat.OS+"-"+plat.Architecture)
		if err := goBuild(o.src, o.pkg, plat, o.version, bin); err != nil {
			return err
		}
		img, err := image(plat, o, base, bin, created)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
		bins = append(bins, sbom.Binary{File: bin, Path: "/" + o.name})
	}
	dir := filepath.Join(tmp, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// The index is the layout's one image, named as containerd and Docker
	// look for it when they import an archive.
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          o.Ref(),
		"org.opencontainers.image.ref.name": o.version,
	})); err != nil {
		return err
	}
	if o.sbom != "" {
		if err := attachSBOM(lp, idx, o, bins, created); err != nil {
			return fmt.Errorf("SBOM: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	return tarDir(dir, o.out, created)
}

// goBuild builds the static binary of pkg for one platform. Without VCS
// stamps: the version is -X main.version, and a build from a copy of the
// sources (the Dockerfile's, a tarball's) makes the same binary as one from
// the checkout.
func goBuild(src, pkg string, p *v1.Platform, version, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -buildid= -X main.version="+version, "-o", out, pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if p.Variant != "" && p.Architecture == "arm" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w", p.OS, p.Architecture, err)
	}
	return nil
}

// image is one platform's image: the base layer, then the binary.
func image(p *v1.Platform, o options, base v1.Layer, bin string, created time.Time) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	app, err := layer(created, []entry{{name: o.name, mode: 0o755, data: data}})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, base, app); err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: created}
	ports := map[string]struct{}{}
	for _, port := range o.ports {
		ports[port] = struct{}{}
	}
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", User, User),
		Entrypoint:   []string{"/" + o.name},
		Cmd:          o.cmd,
		WorkingDir:   "/",
		Env:          env,
		ExposedPorts: ports,
		Labels:       labels(o.name, o.version),
	}
	return mutate.ConfigFile(img, cf)
}

// env is the images' environment. PATH is the one a container engine sets
// when an image names none, so that the Dockerfile's image says the same.
var env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
}

// labels are the OCI annotations of an image's config.
func labels(name, version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    name,
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.source":   "https://github.com/scopeplane/scopeplane",
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
}

// baseLayer is the scratch-style base (baseEntries) as a layer.
func baseLayer(created time.Time) (v1.Layer, error) {
	entries, err := baseEntries()
	if err != nil {
		return nil, err
	}
	return layer(created, entries)
}

// baseEntries are the scratch-style base: what a static Go binary needs of a
// root file system to run as a non-root user and verify TLS peers.
func baseEntries() ([]entry, error) {
	var certs bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue // a PEM bundle cannot carry the root's extra constraint
		}
		if err := pem.Encode(&certs, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	u := strconv.Itoa(User)
	return []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + u + ":" + u + ":nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:" + u + ":\n")},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: certs.Bytes()},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, uid: User},
		{name: "tmp/", mode: 0o1777, dir: true},
	}, nil
}

type entry struct {
	name string
	mode int64
	dir  bool
	uid  int
	data []byte
}

// layer is a gzip layer of the entries, in order, with fixed timestamps.
func layer(created time.Time, entries []entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// tarDir writes the layout directory as a tar archive, in name order.
func tarDir(dir, out string, created time.Time) error {
	var names []string
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			names = append(names, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, path := range names {
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: created, Format: tar.FormatPAX}
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.IsDir() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
