package gamma_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The Gateway API conformance module whose mesh tests are read, and its
// go.sum hash: a module that differs from the one these expectations were
// checked against fails the test instead of changing what it claims.
const (
	conformanceModule = "sigs.k8s.io/gateway-api/conformance@v1.6.3"
	conformanceSum    = "h1:UxhSb1GrDsyl+PdKe3g8a/BFWgP6hzy2PPFmZRgqeMQ="
)

// conformanceDir returns the directory of the conformance module, which
// `go mod download` fetches from the Go module proxy unless the module
// cache holds it already. It runs outside this module so that go.mod and
// go.sum stay as they are: the module is an input of the test, not a
// dependency of the project.
func conformanceDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", conformanceModule)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var mod struct{ Dir, Sum, Error string }
	if err := json.Unmarshal(out, &mod); err != nil && runErr == nil {
		t.Fatalf("go mod download -json %s printed no module: %v\n%s", conformanceModule, err, out)
	}
	if runErr != nil || mod.Error != "" {
		why := errors.Join(runErr, errorText(mod.Error), errorText(strings.TrimSpace(stderr.String())))
		t.Fatalf("cannot fetch %s: go mod download: %v\n"+
			"The test reads the mesh tests of that module: it needs the Go module proxy (GOPROXY) or a module cache that holds the module.",
			conformanceModule, why)
	}
	if mod.Sum != conformanceSum {
		t.Fatalf("%s has the hash %s, want %s: the module is not the one these expectations were checked against", conformanceModule, mod.Sum, conformanceSum)
	}
	if fi, err := os.Stat(mod.Dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s: go mod download named the directory %q, which is not one: %v", conformanceModule, mod.Dir, err)
	}
	return mod.Dir
}

// errorText is an error with the text s, or nil for an empty s.
func errorText(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}
