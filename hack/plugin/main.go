// Command plugin writes the kubectl plugin kubectl-scopeplane as release
// assets: for each platform (linux, darwin, windows × amd64, arm64 by
// default) a static binary, built one after the other, in an archive with
// the licence — tar.gz, or zip for windows, as krew unpacks them — and a
// krew plugin manifest (krew's Plugin kind) naming each archive's download
// URL on the release page and its SHA-256.
//
// The archives are reproducible: the binaries are built with -trimpath and
// without VCS stamps, and every entry, and the gzip header, carries
// SOURCE_DATE_EPOCH (or the Unix epoch) as its time.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/scopeplane/scopeplane/hack/sourcedate"
)

func main() {
	var (
		version   = flag.String("version", "", "The release version x.y.z (without v).")
		out       = flag.String("out", "", "Directory to write the archives and the krew manifest into.")
		platforms = flag.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64,windows/arm64", "Comma-separated platforms to build.")
		download  = flag.String("download", "https://github.com/scopeplane/scopeplane/releases/download/v{{version}}", "The URL of the release's assets; {{version}} stands for -version.")
		src       = flag.String("src", ".", "The module to build (the repository root).")
	)
	flag.Parse()
	if *version == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "plugin: -version and -out are required")
		os.Exit(2)
	}
	r := release{version: *version, download: strings.ReplaceAll(*download, "{{version}}", *version)}
	if err := run(r, *src, *out, strings.Split(*platforms, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "plugin:", err)
		os.Exit(1)
	}
}

// run builds the plugin for each platform, archives it with the licence into
// out and writes the krew manifest there.
func run(r release, src, out string, platforms []string) error {
	created, err := sourcedate.Time()
	if err != nil {
		return err
	}
	licence, err := os.ReadFile(filepath.Join(src, "LICENSE"))
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "scopeplane-plugin-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var assets []asset
	for _, p := range platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("platform %q is not os/arch", p)
		}
		bin := filepath.Join(tmp, goos+"-"+goarch, binName(goos))
		if err := goBuild(src, goos, goarch, bin); err != nil {
			return err
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			return err
		}
		a, err := r.archive(out, goos, goarch, data, licence, created)
		if err != nil {
			return err
		}
		assets = append(assets, a)
	}
	manifest, err := r.manifest(assets)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, manifestName), manifest, 0o644)
}

// goBuild builds the plugin's static binary for one platform.
func goBuild(src, goos, goarch, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -buildid=", "-o", out, "./cmd/kubectl-scopeplane")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build of the plugin for %s/%s: %w", goos, goarch, err)
	}
	return nil
}
