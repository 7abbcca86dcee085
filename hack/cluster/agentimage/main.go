// Command agentimage writes the end-to-end test's workload image, the static
// test/e2e/agent binary on an empty base, as an OCI layout archive that
// `ctr images import` reads. Its default command is "pause", so that the
// same image is the node's Pod sandbox: the node has no registry to pull
// Kubernetes' own pause image from.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Ref is the image reference the archive names; the node's containerd
// configuration names it as the sandbox image.
const Ref = "scopeplane.test/e2e-agent:e2e"

func main() {
	out := flag.String("out", "", "Path of the OCI layout archive to write.")
	src := flag.String("src", ".", "The repository root.")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "agentimage: -out is required")
		os.Exit(2)
	}
	if err := build(*src, *out); err != nil {
		fmt.Fprintln(os.Stderr, "agentimage:", err)
		os.Exit(1)
	}
}

func build(src, out string) error {
	tmp, err := os.MkdirTemp("", "e2e-agent-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	bin := filepath.Join(tmp, "e2e-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./test/e2e/agent")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./test/e2e/agent: %w", err)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	created := time.Unix(0, 0).UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct {
		name string
		mode int64
		data []byte
		dir  bool
	}{{name: "tmp/", mode: 0o1777, dir: true}, {name: "e2e-agent", mode: 0o755, data: data}} {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: created, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, l); err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: created}
	cf.Config = v1.Config{Entrypoint: []string{"/e2e-agent"}, Cmd: []string{"pause"}, WorkingDir: "/"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	dir := filepath.Join(tmp, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          Ref,
		"org.opencontainers.image.ref.name": "e2e",
	})); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return tarDir(dir, out)
}

// tarDir writes the layout directory as a tar archive.
func tarDir(dir, out string) error {
	var names []string
	if err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err == nil && path != dir {
			names = append(names, path)
		}
		return err
	}); err != nil {
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
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: info.Size()}
		if info.IsDir() {
			h.Typeflag, h.Name, h.Mode, h.Size = tar.TypeDir, h.Name+"/", 0o755, 0
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
