package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	// pluginName is the plugin's name in krew's index: kubectl scopeplane.
	pluginName = "scopeplane"
	// manifestName is the file of the krew manifest.
	manifestName = "kubectl-scopeplane.krew.yaml"
)

// release is what the archives and the manifest are of.
type release struct {
	// version is x.y.z, without v.
	version string
	// download is the URL the release's assets are downloaded from.
	download string
}

// asset is one platform's archive.
type asset struct {
	goos, goarch, name, sha256 string
}

// binName is the plugin's file name on goos.
func binName(goos string) string {
	if goos == "windows" {
		return "kubectl-scopeplane.exe"
	}
	return "kubectl-scopeplane"
}

// archive writes one platform's archive of the binary and the licence into
// dir: kubectl-scopeplane_<version>_<os>_<arch>.tar.gz, or .zip on windows.
func (r release) archive(dir, goos, goarch string, bin, licence []byte, created time.Time) (asset, error) {
	files := []struct {
		name string
		mode int64
		data []byte
	}{{binName(goos), 0o755, bin}, {"LICENSE", 0o644, licence}}
	var buf bytes.Buffer
	ext := ".tar.gz"
	if goos == "windows" {
		ext = ".zip"
		zw := zip.NewWriter(&buf)
		for _, f := range files {
			h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: created}
			h.SetMode(os.FileMode(f.mode))
			w, err := zw.CreateHeader(h)
			if err != nil {
				return asset{}, err
			}
			if _, err := w.Write(f.data); err != nil {
				return asset{}, err
			}
		}
		if err := zw.Close(); err != nil {
			return asset{}, err
		}
	} else {
		gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		if err != nil {
			return asset{}, err
		}
		gz.ModTime = created
		tw := tar.NewWriter(gz)
		for _, f := range files {
			h := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
			if err := tw.WriteHeader(h); err != nil {
				return asset{}, err
			}
			if _, err := tw.Write(f.data); err != nil {
				return asset{}, err
			}
		}
		if err := tw.Close(); err != nil {
			return asset{}, err
		}
		if err := gz.Close(); err != nil {
			return asset{}, err
		}
	}
	name := "kubectl-scopeplane_" + r.version + "_" + goos + "_" + goarch + ext
	if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
		return asset{}, err
	}
	return asset{goos: goos, goarch: goarch, name: name, sha256: fmt.Sprintf("%x", sha256.Sum256(buf.Bytes()))}, nil
}

// Plugin is krew's plugin manifest (apiVersion
// krew.googlecontainertools.github.com/v1alpha2, kind Plugin), the fields
// this plugin uses.
type Plugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec PluginSpec `json:"spec"`
}

// PluginSpec is a krew plugin's spec.
type PluginSpec struct {
	Version          string     `json:"version"`
	Homepage         string     `json:"homepage"`
	ShortDescription string     `json:"shortDescription"`
	Description      string     `json:"description"`
	Platforms        []Platform `json:"platforms"`
}

// Platform is one platform's archive in a krew manifest: krew installs the
// first whose selector matches the machine.
type Platform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string     `json:"uri"`
	SHA256 string     `json:"sha256"`
	Files  []FileCopy `json:"files"`
	Bin    string     `json:"bin"`
}

// FileCopy is a file krew copies out of the archive.
type FileCopy struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// manifest is the krew manifest of the assets.
func (r release) manifest(assets []asset) ([]byte, error) {
	var p Plugin
	p.APIVersion = "krew.googlecontainertools.github.com/v1alpha2"
	p.Kind = "Plugin"
	p.Metadata.Name = pluginName
	p.Spec = PluginSpec{
		Version:          "v" + r.version,
		Homepage:         "https://github.com/scopeplane/scopeplane",
		ShortDescription: "Show what scopeplane's xDS proxies hold, and why",
		Description: "kubectl scopeplane reads what the scopeplane operator serves to its xDS clients:\n" +
			"proxy-status lists which proxies each replica serves and whether they are at the\n" +
			"current version, config-dump prints every resource a ProxyScope serves, and explain\n" +
			"says why a proxy holds, or lacks, what it does for a Service.\n",
	}
	for _, a := range assets {
		var pl Platform
		pl.Selector.MatchLabels = map[string]string{"os": a.goos, "arch": a.goarch}
		pl.URI = r.download + "/" + a.name
		pl.SHA256 = a.sha256
		pl.Bin = binName(a.goos)
		pl.Files = []FileCopy{{From: pl.Bin, To: "."}, {From: "LICENSE", To: "."}}
		p.Spec.Platforms = append(p.Spec.Platforms, pl)
	}
	return yaml.Marshal(p)
}
