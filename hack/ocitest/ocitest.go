// Package ocitest reads, for tests, the OCI layout archives hack/image
// writes: it unpacks an archive into a directory that
// go-containerregistry's layout package opens, and applies an image's layers
// to see the files a container would.
package ocitest

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// File is a file of an image: its tar header (type, mode, owner) and, for a
// regular file, its contents.
type File struct {
	Header *tar.Header
	Data   []byte
}

// Untar unpacks the archive into dir.
func Untar(t testing.TB, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Flatten applies the image's layers in order and returns its files by
// name, without a leading or trailing slash (etc/passwd, tmp).
func Flatten(t testing.TB, img v1.Image) map[string]File {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]File{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			f := File{Header: h}
			if h.Typeflag == tar.TypeReg {
				if f.Data, err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
			files[strings.Trim(h.Name, "/")] = f
		}
		_ = rc.Close()
	}
	return files
}
