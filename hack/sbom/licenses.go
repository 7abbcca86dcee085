package sbom

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/github/go-spdx/v2/spdxexp"
	"github.com/google/licensecheck"
)

// minCoverage is how much of a licence file, in percent, the licences found
// in it must cover for the file to count as read: below it, the file holds
// terms licensecheck does not know, and the SBOM would understate them.
const minCoverage = 75

// licenceFile matches the names Go's module tooling (pkg.go.dev) reads as a
// module's licence files.
var licenceFile = regexp.MustCompile(`(?i)^(copying|licen[cs]e|unlicense)(-[a-z0-9.-]+)?(\.(txt|md|markdown|rst))?$`)

// Licenses finds the licences of modules from their licence files.
type Licenses struct {
	// ModRoot is the directory of the main module, whose licence files are
	// the main module's.
	ModRoot string
	// ModCache is the module cache (go env GOMODCACHE); a module not in it
	// is downloaded there with go mod download.
	ModCache string
	// GOROOT is the toolchain whose LICENSE is the standard library's.
	GOROOT string
	// GoVersion is that toolchain's version (go1.x.y).
	GoVersion string
}

// DefaultLicenses reads the main module at modRoot, the module cache of the
// go command and the toolchain running this program.
func DefaultLicenses(modRoot string) (*Licenses, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE", "GOROOT", "GOVERSION").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 3 {
		return nil, fmt.Errorf("go env GOMODCACHE GOROOT GOVERSION: %q", out)
	}
	return &Licenses{ModRoot: modRoot, ModCache: f[0], GOROOT: f[1], GoVersion: f[2]}, nil
}

// Module returns the licences of the module at version; version "" is the
// main module.
func (l *Licenses) Module(path, version string) (*cdx.Licenses, error) {
	dir := l.ModRoot
	if version != "" {
		var err error
		if dir, err = l.moduleDir(path, version); err != nil {
			return nil, err
		}
	}
	ids, err := scanDir(dir)
	if err != nil {
		return nil, fmt.Errorf("licence of %s@%s: %w", path, version, err)
	}
	return choices(ids), nil
}

// Stdlib returns the licences of the Go standard library at goVersion, read
// from the toolchain, which must be that version.
func (l *Licenses) Stdlib(goVersion string) (*cdx.Licenses, error) {
	if l.GoVersion != goVersion {
		return nil, fmt.Errorf("the binaries are built with %s, the toolchain here is %s: its licence is not theirs to report", goVersion, l.GoVersion)
	}
	ids, err := scanDir(l.GOROOT)
	if err != nil {
		return nil, fmt.Errorf("licence of the Go standard library in %s: %w", l.GOROOT, err)
	}
	return choices(ids), nil
}

// moduleDir is the module's directory in the module cache, downloaded there
// if it is not yet.
func (l *Licenses) moduleDir(path, version string) (string, error) {
	dir := filepath.Join(l.ModCache, escape(path)+"@"+escape(version))
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	cmd := exec.Command("go", "mod", "download", "-json", path+"@"+version)
	cmd.Dir = l.ModRoot
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w", path, version, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no directory (%s)", path, version, m.Error)
	}
	return m.Dir, nil
}

// escape is a module path or version as the module cache spells it: an
// upper-case letter as ! and the letter in lower case.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// scanDir returns the SPDX ids of the licences in the licence files at the
// top of dir, sorted; it fails when there are none, or a file's text is not
// mostly covered by licences licensecheck knows.
func scanDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var ids []string
	files := 0
	for _, e := range entries {
		if e.IsDir() || !licenceFile.MatchString(e.Name()) {
			continue
		}
		files++
		text, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		cov := licensecheck.Scan(text)
		if cov.Percent < minCoverage {
			return nil, fmt.Errorf("%s: %.0f%% of it is licences known by SPDX id (%v), under %d%%", e.Name(), cov.Percent, matchIDs(cov), minCoverage)
		}
		ids = append(ids, matchIDs(cov)...)
	}
	if files == 0 {
		return nil, fmt.Errorf("no licence file in %s", dir)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

func matchIDs(cov licensecheck.Coverage) []string {
	var ids []string
	for _, m := range cov.Match {
		ids = append(ids, m.ID)
	}
	return ids
}

// choices are the licences by SPDX id; ids licensecheck names outside the
// SPDX licence list (it knows a few more) are licence names instead.
func choices(ids []string) *cdx.Licenses {
	var l cdx.Licenses
	for _, id := range ids {
		if ok, _ := spdxexp.ValidateLicenses([]string{id}); ok {
			l = append(l, cdx.LicenseChoice{License: &cdx.License{ID: id}})
		} else {
			l = append(l, cdx.LicenseChoice{License: &cdx.License{Name: id}})
		}
	}
	return &l
}
