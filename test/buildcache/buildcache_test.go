// Package buildcache checks that the scripts that build tools into the cache
// shared by every checkout on a machine (hack/envtest.sh,
// hack/cluster/build.sh) never take a complete build away from under a test
// that uses it, with a stand-in for `go` on PATH that writes stub binaries,
// so that it runs in seconds.
package buildcache

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// repoRoot is the checkout, two levels above this package.
const repoRoot = "../.."

// fakeGo stands in for `go build -o <out> ...`: after $FAKE_GO_DELAY seconds
// it writes at <out> an executable stub that prints $FAKE_GO_TAG (which
// build made it), and logs the build.
const fakeGo = `#!/usr/bin/env bash
set -eu
out=
while [[ $# -gt 0 ]]; do
  if [[ $1 == -o ]]; then out=$2; shift; fi
  shift
done
sleep "${FAKE_GO_DELAY:-0}"
printf '#!/bin/sh\necho %s\n' "${FAKE_GO_TAG}" > "${out}"
chmod +x "${out}"
echo "${FAKE_GO_TAG} ${out}" >> "${FAKE_GO_LOG}"
`

type cache struct {
	t         *testing.T
	dir, path string
	log       string
}

func newCache(t *testing.T) *cache {
	if runtime.GOOS != "linux" {
		t.Skip("hack/envtest.sh places its build with GNU mv -T")
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	return &cache{t: t, dir: t.TempDir(), path: bin + string(os.PathListSeparator) + os.Getenv("PATH"), log: filepath.Join(t.TempDir(), "builds")}
}

// envtest runs hack/envtest.sh as the build tag, each build taking delay,
// and returns the directory it printed.
func (c *cache) envtest(tag string, delay time.Duration) (string, error) {
	return c.run(filepath.Join("hack", "envtest.sh"), tag, delay)
}

// run runs a script of hack/ as the build tag, each build taking delay,
// and returns the directory it printed.
func (c *cache) run(script, tag string, delay time.Duration) (string, error) {
	cmd := exec.Command("bash", filepath.Join(repoRoot, script))
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBEBUILDER_ASSETS=") && !strings.HasPrefix(e, "PATH=") {
			env = append(env, e)
		}
	}
	env = append(env, "PATH="+c.path, "SCOPEPLANE_CACHE="+c.dir, "FAKE_GO_LOG="+c.log,
		"FAKE_GO_TAG="+tag, fmt.Sprintf("FAKE_GO_DELAY=%.3f", delay.Seconds()))
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s (%s): %w\n%s", script, tag, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// builds counts the binaries built so far.
func (c *cache) builds() int {
	b, err := os.ReadFile(c.log)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// built returns the directory's binaries' stubs (what each prints), or
// false when one is missing.
func built(dir string) (map[string]string, bool) {
	out := map[string]string{}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		stub, err := os.ReadFile(filepath.Join(dir, b))
		if err != nil {
			return nil, false
		}
		out[b] = string(stub)
	}
	return out, true
}

// twice runs a script of hack/ as the builds "first" and "second" at once,
// each of its builds taking that run's delay, and calls look every
// millisecond until both end; look names a problem, or returns "". It
// fails the test on a run's error or a problem, and returns the directory
// both runs printed.
func (c *cache) twice(script string, delays [2]time.Duration, look func() string) string {
	var (
		wg       sync.WaitGroup
		finished atomic.Int32
		dirs     [2]string
		errs     [2]error
	)
	for i, tag := range []string{"first", "second"} {
		wg.Go(func() {
			defer finished.Add(1)
			dirs[i], errs[i] = c.run(script, tag, delays[i])
		})
	}
	problem := ""
	for finished.Load() < 2 && problem == "" {
		problem = look()
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.t.Fatal(err)
		}
	}
	if problem != "" {
		c.t.Fatal(problem)
	}
	if dirs[0] != dirs[1] {
		c.t.Fatalf("the builds print %q and %q, want one directory", dirs[0], dirs[1])
	}
	return dirs[0]
}

// Two checkouts build the envtest binaries at once; the second ends after
// the first has placed its directory and tests have started from it. From
// the moment the directory is complete to the end, both binaries are there
// at every look and are the first build's: the second build is thrown away,
// not swapped in (the old recipe removed the directory and renamed its own
// in its place).
func TestEnvtestNeverReplacesACompleteBuild(t *testing.T) {
	c := newCache(t)
	var (
		first map[string]string
		looks int
	)
	dir := c.twice(filepath.Join("hack", "envtest.sh"), [2]time.Duration{100 * time.Millisecond, time.Second}, func() string {
		matches, _ := filepath.Glob(filepath.Join(c.dir, "envtest", "kube-apiserver-*"))
		if len(matches) > 1 {
			return fmt.Sprintf("more than one build directory: %v", matches)
		}
		for _, m := range matches {
			stubs, ok := built(m)
			switch {
			case first == nil && ok:
				first = stubs
			case first != nil && !ok:
				return fmt.Sprintf("after %d looks at the complete directory, a binary of it went missing", looks)
			case first != nil && (stubs["kube-apiserver"] != first["kube-apiserver"] || stubs["etcd"] != first["etcd"]):
				return fmt.Sprintf("after %d looks at the complete directory, it was replaced: %q, then %q", looks, first, stubs)
			}
		}
		if first != nil {
			looks++
		}
		return ""
	})
	stubs, ok := built(dir)
	if !ok || !strings.Contains(stubs["kube-apiserver"], "first") || !strings.Contains(stubs["etcd"], "first") {
		t.Fatalf("the directory holds %q, want the first build's binaries", stubs)
	}
	if looks < 100 {
		t.Errorf("the complete directory was looked at only %d times while the second build ran", looks)
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, "envtest", ".*")); len(left) != 0 {
		t.Errorf("the builds left behind %v", left)
	}

	// A complete directory is used as it is: nothing is built.
	n := c.builds()
	if again, err := c.envtest("third", 0); err != nil || again != dir {
		t.Fatalf("a run with the cache complete prints %q, %v", again, err)
	}
	if c.builds() != n {
		t.Errorf("a run with the cache complete built %d binaries", c.builds()-n)
	}
}

// A directory the old recipe left incomplete (it removed the directory, then
// renamed the build in its place, and could be cut short between the two)
// is completed: the binaries are renamed into it.
func TestEnvtestCompletesAnIncompleteDirectory(t *testing.T) {
	c := newCache(t)
	dir, err := c.envtest("whole", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "kube-apiserver")); err != nil {
		t.Fatal(err)
	}
	again, err := c.envtest("again", 0)
	if err != nil {
		t.Fatal(err)
	}
	if stubs, ok := built(again); again != dir || !ok || !strings.Contains(stubs["kube-apiserver"], "again") {
		t.Errorf("after a run over an incomplete %s: %s holds %q", dir, again, stubs)
	}
}

// Two checkouts build the binaries of make e2e's node at once
// (hack/cluster/build.sh, one binary after another into one directory).
// Both succeed and print the same directory, and a binary or link there,
// once present, is there at every look after (the old recipe built every
// binary into one shared <name>.tmp, which the two builds wrote and renamed
// away from under each other).
func TestClusterBuildsShareTheirDirectory(t *testing.T) {
	c := newCache(t)
	seen := map[string]bool{}
	dir := c.twice(filepath.Join("hack", "cluster", "build.sh"), [2]time.Duration{50 * time.Millisecond, 70 * time.Millisecond}, func() string {
		matches, _ := filepath.Glob(filepath.Join(c.dir, "cluster", "*", "*"))
		present := map[string]bool{}
		for _, m := range matches {
			if _, err := os.Stat(m); err == nil && !strings.Contains(filepath.Base(m), ".") {
				present[m] = true
			}
		}
		for m := range seen {
			if !present[m] {
				return filepath.Base(m) + " went missing"
			}
		}
		for m := range present {
			seen[m] = true
		}
		return ""
	})
	for _, b := range []string{"kube-apiserver", "etcd", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr", "coredns"} {
		if out, err := exec.Command(filepath.Join(dir, b)).Output(); err != nil || len(out) == 0 {
			t.Errorf("%s does not run: %v", b, err)
		}
	}
	hidden, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if temps, _ := filepath.Glob(filepath.Join(dir, "*.*")); len(hidden)+len(temps) != 0 {
		t.Errorf("the builds left behind %v", append(hidden, temps...))
	}
}
