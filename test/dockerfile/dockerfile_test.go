// Package dockerfile checks, without a container engine, that the
// Dockerfile builds make image's image: its build stage is run offline on
// exactly what its COPY lines copy, its image stage is applied to what the
// build stage wrote, and the files and config that come out are compared
// with those of the image hack/image builds.
package dockerfile

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/scopeplane/scopeplane/hack/ocitest"
)

// repoRoot is the checkout, two levels above this package.
const repoRoot = "../.."

// rootfsDir is where the Dockerfile's build stage writes the image's files
// (hack/image -rootfs); the test maps it to a directory of its own.
const rootfsDir = "/rootfs"

// instruction is one line of the Dockerfile.
type instruction struct {
	line    int
	keyword string // upper case
	args    string
}

// stages parses the Dockerfile into its stages' instructions; comments and
// blank lines are skipped, a line ending in a backslash continues on the next.
func stages(t *testing.T, r io.Reader) [][]instruction {
	t.Helper()
	var out [][]instruction
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		start := n
		for strings.HasSuffix(text, `\`) && sc.Scan() {
			n++
			text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSpace(sc.Text())
		}
		keyword, args, _ := strings.Cut(text, " ")
		in := instruction{line: start, keyword: strings.ToUpper(keyword), args: strings.TrimSpace(args)}
		if in.keyword == "FROM" {
			out = append(out, nil)
		}
		if len(out) == 0 {
			t.Fatalf("Dockerfile:%d: %s before FROM", start, in.keyword)
		}
		out[len(out)-1] = append(out[len(out)-1], in)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// file is what the comparison sees of a file of an image.
type file struct {
	dir      bool
	mode     int64 // permission bits and the sticky bit, as tar writes them
	uid, gid int
	sum      [32]byte
}

func (f file) String() string {
	return fmt.Sprintf("dir=%v mode=%#o owner=%d:%d sha256=%x", f.dir, f.mode, f.uid, f.gid, f.sum[:4])
}

// config is what the comparison sees of an image's config.
type config struct {
	User, WorkingDir string
	Env, Entrypoint  []string
	Cmd, Ports       []string
	Labels           map[string]string
}

// TestDockerfileBuildsMakeImagesImage runs the Dockerfile as a container
// engine would, without one: the build stage's COPY lines copy into an empty
// directory (a directory's contents into the destination, files and glob
// matches into a destination directory), its ARGs become the environment of
// its RUN lines, which run offline (the module cache shared with this
// checkout); the image stage, which must start FROM scratch, copies what the
// build stage wrote (with --chown's owner) and sets the config. The files
// (type, mode, owner, content, the binary's included) and the config must be
// those of the image make image builds (hack/image) for this machine's
// architecture. A package the Dockerfile does not copy fails the build stage;
// a base, a file, a mode, a port or a label that differs fails the
// comparison.
func TestDockerfileBuildsMakeImagesImage(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	st := stages(t, f)
	_ = f.Close()
	if len(st) != 2 {
		t.Fatalf("Dockerfile: %d stages; this test understands a build stage and an image stage", len(st))
	}
	// Before anything runs: a base other than an empty one is not make image's.
	if from := st[1][0]; from.args != "scratch" {
		t.Fatalf("Dockerfile:%d: the image stage is FROM %s; make image's base is its own files on an empty base (FROM scratch)", from.line, from.args)
	}
	const version = "0.0.0-dockerfile"
	buildArgs := map[string]string{"VERSION": version, "TARGETOS": "linux", "TARGETARCH": runtime.GOARCH}
	tmp := t.TempDir()
	rootfs := filepath.Join(tmp, "rootfs")
	runBuildStage(t, st[0], buildArgs, filepath.Join(tmp, "context"), rootfs)
	gotFiles, gotConfig := applyImageStage(t, st[1], buildArgs, rootfs)

	archive := filepath.Join(tmp, "image.tar")
	cmd := exec.Command("go", "run", "./hack/image", "-version", version, "-platforms", "linux/"+runtime.GOARCH, "-out", archive)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/image: %v\n%s", err, out)
	}
	wantFiles, wantConfig := readImage(t, archive, filepath.Join(tmp, "layout"))

	for name, want := range wantFiles {
		got, ok := gotFiles[name]
		switch {
		case !ok:
			t.Errorf("/%s is in make image's image (%v), not in the Dockerfile's", name, want)
		case got != want:
			t.Errorf("/%s: the Dockerfile's %v, make image's %v", name, got, want)
		}
	}
	for name, got := range gotFiles {
		if _, ok := wantFiles[name]; !ok {
			t.Errorf("/%s is in the Dockerfile's image (%v), not in make image's", name, got)
		}
	}
	g, _ := json.Marshal(gotConfig)
	w, _ := json.Marshal(wantConfig)
	if string(g) != string(w) {
		t.Errorf("config:\n the Dockerfile's %s\n make image's     %s", g, w)
	}
}

// runBuildStage copies the build context as the COPY lines say into dir and
// runs the RUN lines there, the build stage's output directory mapped to
// rootfs.
func runBuildStage(t *testing.T, stage []instruction, buildArgs map[string]string, dir, rootfs string) {
	t.Helper()
	// What the stage's go mod download fetches, it fetches for every
	// platform, and a module only Windows builds import (a terminal's, a
	// CLI's) is in no cache a Linux build and test filled: fetch it here,
	// from the module proxy, so that the stage runs offline on a fresh
	// machine too.
	download := exec.Command("go", "mod", "download")
	download.Dir, download.Env = repoRoot, append(os.Environ(), "GOWORK=off")
	if out, err := download.CombinedOutput(); err != nil {
		t.Fatalf("go mod download, to fill the module cache the build stage runs offline from: %v\n%s", err, out)
	}
	env := append(os.Environ(),
		"GOFLAGS=-mod=mod", // go.mod and go.sum as copied, nothing vendored
		"GOPROXY=off",      // offline: everything from the shared module cache
		"GOWORK=off",
		"CGO_ENABLED=0",
	)
	copies := 0
	for _, in := range stage {
		switch in.keyword {
		case "WORKDIR":
			if in.args != "/src" {
				t.Fatalf("Dockerfile:%d: WORKDIR %s: this test resolves COPY destinations against /src", in.line, in.args)
			}
		case "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			v, ok := buildArgs[name]
			if !ok {
				v = def
			}
			env = append(env, name+"="+v)
		case "COPY":
			copies++
			copyContext(t, in, dir)
		case "RUN":
			cmd := exec.Command("sh", "-c", strings.ReplaceAll(in.args, rootfsDir, rootfs))
			cmd.Dir, cmd.Env = dir, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("Dockerfile:%d: RUN %s: %v (add what it needs to the Dockerfile's COPY lines)\n%s", in.line, in.args, err, out)
			}
		}
	}
	if copies == 0 {
		t.Fatal("Dockerfile: no COPY in the build stage")
	}
}

// copyContext carries out a COPY of the build stage from the checkout.
func copyContext(t *testing.T, in instruction, dir string) {
	t.Helper()
	args := strings.Fields(in.args)
	for len(args) > 0 && strings.HasPrefix(args[0], "--") {
		if strings.HasPrefix(args[0], "--from") {
			t.Fatalf("Dockerfile:%d: COPY --from in the build stage is not understood by this test", in.line)
		}
		args = args[1:]
	}
	if len(args) < 2 {
		t.Fatalf("Dockerfile:%d: COPY needs a source and a destination: %q", in.line, in.args)
	}
	sources, dest := args[:len(args)-1], args[len(args)-1]
	multiple := len(sources) > 1
	for _, src := range sources {
		matches, err := filepath.Glob(filepath.Join(repoRoot, filepath.FromSlash(src)))
		if err != nil {
			t.Fatalf("Dockerfile:%d: %v", in.line, err)
		}
		if len(matches) == 0 {
			t.Fatalf("Dockerfile:%d: COPY %s matches nothing in the checkout", in.line, src)
		}
		if len(matches) > 1 || strings.ContainsAny(src, "*?[") {
			multiple = true
		}
		for _, m := range matches {
			to := filepath.Join(dir, filepath.FromSlash(path.Clean(dest)))
			info, err := os.Stat(m)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case info.IsDir():
				copyTree(t, m, to)
			case multiple || strings.HasSuffix(dest, "/"):
				copyFile(t, m, filepath.Join(to, filepath.Base(m)))
			default:
				copyFile(t, m, to)
			}
		}
	}
}

// applyImageStage returns the files and config of the image stage, which
// copies from the build stage's output (rootfs) onto an empty base.
func applyImageStage(t *testing.T, stage []instruction, buildArgs map[string]string, rootfs string) (map[string]file, config) {
	t.Helper()
	files := map[string]file{}
	c := config{Labels: map[string]string{}}
	args := map[string]string{}
	expand := func(s string) string { return os.Expand(s, func(k string) string { return args[k] }) }
	for _, in := range stage[1:] {
		switch in.keyword {
		case "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			args[name] = def
			if v, ok := buildArgs[name]; ok {
				args[name] = v
			}
		case "COPY":
			f := strings.Fields(in.args)
			uid, gid := -1, -1
			if !strings.HasPrefix(f[0], "--from=build") || len(f) < 3 {
				t.Fatalf("Dockerfile:%d: the image stage copies from the build stage only: %s", in.line, in.args)
			}
			f = f[1:]
			if o, ok := strings.CutPrefix(f[0], "--chown="); ok {
				u, g, _ := strings.Cut(o, ":")
				uid, _ = strconv.Atoi(u)
				gid, _ = strconv.Atoi(g)
				f = f[1:]
			}
			if len(f) != 2 {
				t.Fatalf("Dockerfile:%d: COPY with one source and a destination expected: %s", in.line, in.args)
			}
			copyStage(t, strings.Replace(f[0], rootfsDir, rootfs, 1), f[1], uid, gid, files)
		case "ENV":
			c.Env = append(c.Env, expand(in.args))
		case "USER":
			c.User = in.args
		case "WORKDIR":
			c.WorkingDir = in.args
		case "EXPOSE":
			c.Ports = strings.Fields(in.args)
		case "LABEL":
			k, v, _ := strings.Cut(in.args, "=")
			uq, err := strconv.Unquote(v)
			if err != nil {
				t.Fatalf("Dockerfile:%d: LABEL value %s: %v", in.line, v, err)
			}
			c.Labels[k] = expand(uq)
		case "ENTRYPOINT", "CMD":
			var l []string
			if err := json.Unmarshal([]byte(in.args), &l); err != nil {
				t.Fatalf("Dockerfile:%d: %s is not in exec form: %v", in.line, in.keyword, err)
			}
			if in.keyword == "CMD" {
				c.Cmd = l
			} else {
				c.Entrypoint = l
			}
		default:
			t.Fatalf("Dockerfile:%d: %s in the image stage is not understood by this test", in.line, in.keyword)
		}
	}
	return files, c
}

// copyStage copies the directory src (its contents) to dest as COPY --from
// does: modes kept, the owner --chown's or root.
func copyStage(t *testing.T, src, dest string, uid, gid int, files map[string]file) {
	t.Helper()
	if uid < 0 {
		uid, gid = 0, 0
	}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Join(dest, filepath.ToSlash(rel)), "/")
		if name == "" {
			return nil // the root exists
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f := file{dir: d.IsDir(), mode: int64(info.Mode().Perm()), uid: uid, gid: gid}
		if info.Mode()&os.ModeSticky != 0 {
			f.mode |= 0o1000
		}
		if !f.dir {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f.sum = sha256.Sum256(b)
		}
		files[name] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readImage returns the files (its layers applied in order) and config of
// the one platform of the OCI archive.
func readImage(t *testing.T, archive, dir string) (map[string]file, config) {
	t.Helper()
	ocitest.Untar(t, archive, dir)
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	om, err := outer.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := outer.ImageIndex(om.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("the archive holds %d platforms, want 1", len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := config{User: cf.Config.User, WorkingDir: cf.Config.WorkingDir, Env: cf.Config.Env,
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Labels: cf.Config.Labels}
	for p := range cf.Config.ExposedPorts {
		c.Ports = append(c.Ports, p)
	}
	slices.Sort(c.Ports)
	files := map[string]file{}
	for name, f := range ocitest.Flatten(t, img) {
		h := f.Header
		files[name] = file{dir: h.Typeflag == tar.TypeDir, mode: h.Mode & 0o7777, uid: h.Uid, gid: h.Gid}
		if h.Typeflag == tar.TypeReg {
			files[name] = file{mode: h.Mode & 0o7777, uid: h.Uid, gid: h.Gid, sum: sha256.Sum256(f.Data)}
		}
	}
	return files, c
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
	copyBytes(t, b, dst)
}

func copyBytes(t *testing.T, b []byte, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
