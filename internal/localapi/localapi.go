// Package localapi starts a real kube-apiserver and etcd on this machine
// (the envtest binaries that hack/envtest.sh builds) with the project's CRDs
// installed. The tests and `make demo` run against it.
package localapi

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/scopeplane/scopeplane/internal/scheme"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	env    *envtest.Environment
	Config *rest.Config
	Client client.Client
}

// RepoRoot is the checkout's top directory, found from this file's path so
// that tests in any package can read config/ and charts/.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start starts kube-apiserver and etcd from KUBEBUILDER_ASSETS and installs
// the CRDs of config/crd/bases. It fails, rather than skips, when the
// binaries are missing: `make test` and `make demo` provide them.
func Start() (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or export KUBEBUILDER_ASSETS=$(hack/envtest.sh)")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme.Scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the test API server: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Env{env: env, Config: cfg, Client: c}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// WriteKubeconfig writes a kubeconfig for an administrator of the API server
// to path, so that kubectl can be pointed at it.
func (e *Env) WriteKubeconfig(path string) error {
	user, err := e.env.AddUser(envtest.User{Name: "scopeplane-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding a kubeconfig user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	return os.WriteFile(path, data, 0o600)
}
