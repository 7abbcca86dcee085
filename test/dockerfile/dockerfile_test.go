// Package dockerfile checks that the Dockerfile's build stage copies every
// file the scopeplane binary needs, without a container engine: the binary is
// built from exactly what the COPY lines copy.
package dockerfile

import (
	"bufio"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the checkout, two levels above this package.
const repoRoot = "../.."

// copyLine is one COPY instruction of the build stage: its sources, relative
// to the build context, and its destination, relative to the WORKDIR.
type copyLine struct {
	line    int
	sources []string
	dest    string
}

// parseCopies returns the COPY instructions of the Dockerfile's first stage
// (the build); COPY --from copies between stages and is skipped. It fails on
// a WORKDIR other than the one the destinations are resolved against, so a
// change of layout is noticed here rather than passing by accident.
func parseCopies(t *testing.T, r io.Reader) []copyLine {
	t.Helper()
	var copies []copyLine
	stages := 0
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			stages++
		case "WORKDIR":
			if stages == 1 && fields[1] != "/src" {
				t.Fatalf("Dockerfile:%d: WORKDIR %s: this test resolves COPY destinations against /src", n, fields[1])
			}
		case "COPY":
			if stages != 1 {
				continue
			}
			args := fields[1:]
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				if strings.HasPrefix(args[0], "--from") {
					t.Fatalf("Dockerfile:%d: COPY --from in the build stage is not understood by this test", n)
				}
				args = args[1:]
			}
			if len(args) < 2 {
				t.Fatalf("Dockerfile:%d: COPY needs a source and a destination: %q", n, sc.Text())
			}
			copies = append(copies, copyLine{line: n, sources: args[:len(args)-1], dest: args[len(args)-1]})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return copies
}

// TestDockerfileCopiesWhatTheBinaryNeeds copies into an empty directory
// exactly what the build stage's COPY lines copy, as a container engine would
// (a directory's contents into the destination, files and glob matches into a
// destination directory), and builds the binary there offline, the module
// cache shared with this checkout. A Go file of package main or a package the
// Dockerfile does not copy fails the build, as it would fail docker build.
func TestDockerfileCopiesWhatTheBinaryNeeds(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	copies := parseCopies(t, f)
	f.Close()
	if len(copies) == 0 {
		t.Fatal("Dockerfile: no COPY in the build stage")
	}

	dir := t.TempDir()
	for _, c := range copies {
		multiple := len(c.sources) > 1
		for _, src := range c.sources {
			matches, err := filepath.Glob(filepath.Join(repoRoot, filepath.FromSlash(src)))
			if err != nil {
				t.Fatalf("Dockerfile:%d: %v", c.line, err)
			}
			if len(matches) == 0 {
				t.Fatalf("Dockerfile:%d: COPY %s matches nothing in the checkout", c.line, src)
			}
			if len(matches) > 1 || strings.ContainsAny(src, "*?[") {
				multiple = true
			}
			for _, m := range matches {
				dest := filepath.Join(dir, filepath.FromSlash(path.Clean(c.dest)))
				info, err := os.Stat(m)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case info.IsDir():
					copyTree(t, m, dest)
				case multiple || strings.HasSuffix(c.dest, "/"):
					copyFile(t, m, filepath.Join(dest, filepath.Base(m)))
				default:
					copyFile(t, m, dest)
				}
			}
		}
	}

	cmd := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "scopeplane"), ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GOFLAGS=-mod=mod", // go.mod and go.sum as copied, nothing vendored
		"GOPROXY=off",      // offline: everything from the shared module cache
		"GOWORK=off",
		"CGO_ENABLED=0",
	)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of what the Dockerfile copies failed (add what it needs to the Dockerfile's COPY lines): %v\n%s", err, out)
	}
}

// copyTree copies the directory src into dst, as COPY does with a directory:
// its contents, not the directory itself.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		copyFile(t, p, filepath.Join(dst, rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
