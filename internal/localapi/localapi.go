// Package localapi starts a real kube-apiserver and etcd on this machine
// (the envtest binaries that hack/envtest.sh builds) with the project's CRDs
// installed. The tests and `make demo` run against it.
package localapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/scopeplane/scopeplane/internal/scheme"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	env     *envtest.Environment
	certDir string
	Config  *rest.Config
	Client  client.Client
}

// RepoRoot is the checkout's top directory, found from this file's path so
// that tests in any package can read config/ and charts/.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Start starts kube-apiserver and etcd from KUBEBUILDER_ASSETS and installs
// the CRDs of config/crd/bases and Gateway API's (gatewayCRDs). It
// fails, rather than skips, when the binaries are missing: `make test` and
// `make demo` provide them.
func Start() (*Env, error) { return start(gatewayCRDs) }

// StartWithoutReferenceGrants is Start on a cluster that does not serve
// ReferenceGrants, where no namespace can consent to another's scopes; it
// serves HTTPRoutes and GRPCRoutes.
func StartWithoutReferenceGrants() (*Env, error) { return start(gatewayCRDs[1:]) }

// StartWithoutRoutes is Start on a cluster that serves ReferenceGrants but
// neither HTTPRoutes nor GRPCRoutes.
func StartWithoutRoutes() (*Env, error) { return start(gatewayCRDs[:1]) }

// StartOn is Start with etcd keeping its data in dataDir, which outlives
// the Env: a world of a hundred thousand objects, loaded once, is served
// again from a copy of its directory in seconds (the world-scale
// benchmark). etcd syncs nothing to disk (--unsafe-no-fsync), since such
// data is rebuilt rather than recovered, and may hold 8 GiB; the servers
// may take minutes to start. What etcd and kube-apiserver print goes to
// logs.
func StartOn(dataDir string, logs io.Writer) (*Env, error) {
	return start(gatewayCRDs, &onDisk{dir: dataDir, logs: logs})
}

// onDisk is where etcd keeps its data, and where both servers log.
type onDisk struct {
	dir  string
	logs io.Writer
}

// start installs the Gateway API CRDs named (gatewayCRDs or a part).
func start(crds []string, disk ...*onDisk) (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or export KUBEBUILDER_ASSETS=$(hack/envtest.sh)")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme.Scheme,
	}
	if len(disk) > 0 {
		etcd := &envtest.Etcd{DataDir: disk[0].dir, Out: disk[0].logs, Err: disk[0].logs}
		etcd.Configure().Set("unsafe-no-fsync", "true").Set("quota-backend-bytes", strconv.Itoa(8<<30))
		env.ControlPlane.Etcd = etcd
		api := env.ControlPlane.GetAPIServer()
		api.Out, api.Err = disk[0].logs, disk[0].logs
		// Before it serves, kube-apiserver lists what etcd holds into its
		// watch cache: at two hundred thousand objects, for well over
		// envtest's default 20 s.
		env.ControlPlaneStartTimeout = 5 * time.Minute
	}
	paths, err := GatewayAPICRDs(crds...)
	if err != nil {
		return nil, err
	}
	env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, paths...)
	// A certificate directory of its own, which envtest then keeps across
	// a restart of the API server (StartAPIServer), so that the serving
	// certificate and the client CA, and so Config, stay valid.
	certDir, err := os.MkdirTemp("", "scopeplane-apiserver-")
	if err != nil {
		return nil, err
	}
	env.ControlPlane.GetAPIServer().CertDir = certDir
	// kube-apiserver drains open connections when asked to stop, which
	// the clients of a running control plane keep busy: past this it is
	// killed (StopAPIServer), as is etcd.
	env.ControlPlaneStopTimeout = stopTimeout
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("starting the test API server: %w", err)
	}
	e := &Env{env: env, certDir: certDir, Config: cfg}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// gatewayCRDs are the Gateway API CRDs installed, by their path under the
// module's config/crd: the ReferenceGrant through which namespaces consent
// (first), and the mesh routes of the experimental channel, whose
// HTTPRoute has retry.
var gatewayCRDs = []string{
	"standard/gateway.networking.k8s.io_referencegrants.yaml",
	"experimental/gateway.networking.k8s.io_httproutes.yaml",
	"experimental/gateway.networking.k8s.io_grpcroutes.yaml",
}

// GatewayAPICRDs are the paths of CRDs of the sigs.k8s.io/gateway-api
// module go.mod requires, each named by its path under the module's
// config/crd (as "standard/gateway.networking.k8s.io_referencegrants.yaml"),
// as the go command finds the module (downloading it when it is not in the
// module cache), so that the CRDs installed are those of the Go types
// compiled in.
func GatewayAPICRDs(rels ...string) ([]string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api")
	cmd.Dir = RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(exit.Stderr))
		}
		return nil, fmt.Errorf("locating the sigs.k8s.io/gateway-api module: %w", err)
	}
	paths := make([]string, len(rels))
	for i, rel := range rels {
		paths[i] = filepath.Join(string(bytes.TrimSpace(out)), "config", "crd", filepath.FromSlash(rel))
		if _, err := os.Stat(paths[i]); err != nil {
			return nil, fmt.Errorf("the Gateway API CRD %s: %w", rel, err)
		}
	}
	return paths, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	err := e.env.Stop()
	if rmErr := os.RemoveAll(e.certDir); err == nil {
		err = rmErr
	}
	return err
}

// stopTimeout is how long kube-apiserver may take to stop before it is killed.
const stopTimeout = 3 * time.Second

// StopAPIServer stops kube-apiserver and leaves etcd running: an API
// server outage, for as long as the caller likes. A server that does not
// stop within stopTimeout is killed, as a crash would end it; either way
// this returns once nothing listens on its port any more.
func (e *Env) StopAPIServer() error {
	api := e.env.ControlPlane.GetAPIServer()
	stopErr := api.Stop()
	addr := net.JoinHostPort(api.Address, api.Port)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		_ = conn.Close()
	}
	return fmt.Errorf("kube-apiserver still listens on %s after stopping it: %w", addr, stopErr)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address, with the same certificates and the same etcd, so that
// clients of Config reconnect to the same cluster.
func (e *Env) StartAPIServer() error { return e.env.ControlPlane.GetAPIServer().Start() }

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
