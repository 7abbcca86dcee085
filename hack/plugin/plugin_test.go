package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestArchivesAndKrewManifest archives a binary for every release platform
// and writes the krew manifest, twice: the bytes are the same (the archives
// are reproducible), each archive holds the binary (executable) and the
// licence at SOURCE_DATE_EPOCH, windows' as a zip with an .exe, and the
// manifest is krew's Plugin with one platform per archive whose sha256 is
// the archive's and whose uri is the release's download URL, with the
// fields krew's validation requires.
func TestArchivesAndKrewManifest(t *testing.T) {
	created := time.Unix(1767225600, 0).UTC()
	r := release{version: "1.2.3", download: "https://github.com/scopeplane/scopeplane/releases/download/v1.2.3"}
	platforms := [][2]string{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"}, {"windows", "arm64"}}
	write := func(dir string) []byte {
		var assets []asset
		for _, p := range platforms {
			a, err := r.archive(dir, p[0], p[1], []byte("binary for "+p[0]+"/"+p[1]), []byte("the licence"), created)
			if err != nil {
				t.Fatal(err)
			}
			assets = append(assets, a)
		}
		m, err := r.manifest(assets)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	dir, again := t.TempDir(), t.TempDir()
	manifest := write(dir)
	if !bytes.Equal(manifest, write(again)) {
		t.Error("two manifests of the same archives differ")
	}

	var p Plugin
	if err := yaml.UnmarshalStrict(manifest, &p); err != nil {
		t.Fatalf("the manifest does not read back as a krew Plugin: %v\n%s", err, manifest)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "scopeplane" ||
		p.Spec.Version != "v1.2.3" || p.Spec.ShortDescription == "" || p.Spec.Homepage == "" {
		t.Errorf("manifest header %+v", p)
	}
	if len(p.Spec.Platforms) != len(platforms) {
		t.Fatalf("%d platforms in the manifest, want %d", len(p.Spec.Platforms), len(platforms))
	}
	hex := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for i, pl := range p.Spec.Platforms {
		goos, goarch := platforms[i][0], platforms[i][1]
		if pl.Selector.MatchLabels["os"] != goos || pl.Selector.MatchLabels["arch"] != goarch || len(pl.Selector.MatchLabels) != 2 {
			t.Errorf("platform %d selects %v, want os %s arch %s", i, pl.Selector.MatchLabels, goos, goarch)
		}
		ext := ".tar.gz"
		if goos == "windows" {
			ext = ".zip"
		}
		name := fmt.Sprintf("kubectl-scopeplane_1.2.3_%s_%s%s", goos, goarch, ext)
		if pl.URI != r.download+"/"+name {
			t.Errorf("%s/%s uri %s, want the release asset %s", goos, goarch, pl.URI, name)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if other, _ := os.ReadFile(filepath.Join(again, name)); !bytes.Equal(data, other) {
			t.Errorf("%s: two archives of the same binary differ", name)
		}
		if !hex.MatchString(pl.SHA256) || pl.SHA256 != fmt.Sprintf("%x", sha256.Sum256(data)) {
			t.Errorf("%s: sha256 %q is not the archive's", name, pl.SHA256)
		}
		files := unpack(t, name, data, created)
		bin := binName(goos)
		if pl.Bin != bin || string(files[bin].data) != "binary for "+goos+"/"+goarch || files[bin].mode&0o111 == 0 {
			t.Errorf("%s: bin %q, archive holds %v", name, pl.Bin, files)
		}
		if string(files["LICENSE"].data) != "the licence" || len(files) != 2 {
			t.Errorf("%s holds %v, want the binary and LICENSE", name, files)
		}
		for n, f := range files {
			if !f.modified.Equal(created) {
				t.Errorf("%s: %s has time %v, want SOURCE_DATE_EPOCH %v", name, n, f.modified, created)
			}
			if !hasCopy(pl.Files, n) {
				t.Errorf("%s: krew's files do not copy %s", name, n)
			}
		}
	}
}

type entry struct {
	data     []byte
	mode     os.FileMode
	modified time.Time
}

func (e entry) String() string { return fmt.Sprintf("%q %v %v", e.data, e.mode, e.modified) }

func hasCopy(files []FileCopy, name string) bool {
	for _, f := range files {
		if f.From == name && f.To == "." {
			return true
		}
	}
	return false
}

// unpack reads a tar.gz or zip archive; a gzip header's time must be
// created too.
func unpack(t *testing.T, name string, data []byte, created time.Time) map[string]entry {
	t.Helper()
	files := map[string]entry{}
	if strings.HasSuffix(name, ".zip") {
		zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			if err != nil {
				t.Fatal(err)
			}
			_ = rc.Close()
			files[f.Name] = entry{data: b, mode: f.Mode(), modified: f.Modified.UTC()}
		}
		return files
	}
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !gz.ModTime.Equal(created) {
		t.Errorf("%s: the gzip header's time is %v, want SOURCE_DATE_EPOCH %v", name, gz.ModTime, created)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = entry{data: b, mode: os.FileMode(h.Mode), modified: h.ModTime.UTC()}
	}
	return files
}
