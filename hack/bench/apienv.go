package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/xds/model"
)

// worldEnv is the API server of one world cell, serving a copy of the
// cached etcd data of its size, so that what the cell changes never reaches
// the cache.
type worldEnv struct {
	*localapi.Env
	dir        string
	kubeconfig string
	// fast is a client of the API server without client-side rate limit,
	// speaking protobuf where it can: the driver's own writes must not be
	// what a figure measures.
	fast client.Client
	logs *os.File
}

// worldCache is where the built worlds are kept: one etcd data directory
// per size and shape, made once (minutes at S=100,000) and copied for each
// cell (seconds).
func worldCache(services int) (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "scopeplane", "bench-world", fmt.Sprintf("shape%d-S%d", worldShape, services)), nil
}

// openWorld starts an API server on a copy of the world of the given size,
// building and caching that world first when there is none.
func openWorld(services int, o RunOptions) (*worldEnv, error) {
	cache, err := worldCache(services)
	if err != nil {
		return nil, err
	}
	pristine := filepath.Join(cache, "etcd")
	if _, err := os.Stat(filepath.Join(cache, "complete")); err != nil {
		if err := buildWorld(cache, services, o); err != nil {
			return nil, fmt.Errorf("building the world of %d Services: %w", services, err)
		}
	}
	dir, err := os.MkdirTemp("", "scopeplane-bench-world-")
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := copyTree(pristine, filepath.Join(dir, "etcd")); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e, err := startWorldEnv(dir)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(dir, "servers.log")); rerr == nil {
			kept := dir + ".servers.log"
			_ = os.WriteFile(kept, b, 0o644)
			err = fmt.Errorf("%w; the servers said (all of it in %s): %s", err, kept, tail(b, 2000))
		}
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logf(o, "  world of %d Services: copied and served in %s", services, time.Since(t0).Round(time.Millisecond))
	return e, nil
}

// startWorldEnv serves the etcd data of dir/etcd; etcd and kube-apiserver
// log to dir/servers.log.
func startWorldEnv(dir string) (*worldEnv, error) {
	ctrllog.SetLogger(logr.Discard())
	logs, err := os.Create(filepath.Join(dir, "servers.log"))
	if err != nil {
		return nil, err
	}
	api, err := localapi.StartOn(filepath.Join(dir, "etcd"), logs)
	if err != nil {
		_ = logs.Close()
		return nil, err
	}
	e := &worldEnv{Env: api, dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig"), logs: logs}
	fail := func(err error) (*worldEnv, error) {
		_ = e.close()
		return nil, err
	}
	if err := api.WriteKubeconfig(e.kubeconfig); err != nil {
		return fail(err)
	}
	cfg := rest.CopyConfig(api.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if e.fast, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		return fail(err)
	}
	return e, nil
}

// close stops the servers and removes the cell's directory (the cache's
// is kept: dir is empty then).
func (e *worldEnv) close() error {
	err := e.Stop()
	_ = e.logs.Close()
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}

// buildWorld loads a world of the given size into a new etcd data directory
// and moves it into the cache when complete.
func buildWorld(cache string, services int, o RunOptions) error {
	if err := os.RemoveAll(cache); err != nil {
		return err
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	e, err := startWorldEnv(cache)
	if err != nil {
		return err
	}
	e.dir = "" // the directory is the cache's: keep it
	closed := false
	defer func() {
		if !closed {
			_ = e.close()
		}
	}()
	t0 := time.Now()
	ctx := context.Background()
	for n := range worldNamespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: worldNamespace(n), Labels: map[string]string{"team": fmt.Sprint("team-", n)}}}
		if err := e.fast.Create(ctx, ns); err != nil {
			return err
		}
	}
	var done atomic.Int64
	if err := inParallel(services, func(i int) error {
		svc, slice := worldService(i)
		if err := e.fast.Create(ctx, svc, client.FieldOwner("kubectl-client-side-apply")); err != nil {
			return err
		}
		if err := e.fast.Create(ctx, slice, client.FieldOwner("endpointslice-controller")); err != nil {
			return err
		}
		if d := done.Add(1); d%10000 == 0 {
			logf(o, "  loading the world: %d of %d Services in %s", d, services, time.Since(t0).Round(time.Second))
		}
		return nil
	}); err != nil {
		return err
	}
	logf(o, "  loaded %d Services and their EndpointSlices in %s", services, time.Since(t0).Round(time.Second))
	closed = true
	if err := e.close(); err != nil {
		return err
	}
	_ = os.Remove(e.kubeconfig)
	_ = os.Remove(e.logs.Name())
	return os.WriteFile(filepath.Join(cache, "complete"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644)
}

// loaders is how many objects the loader creates at once.
const loaders = 32

// inParallel calls fn for 0 ≤ i < n, loaders at a time, and returns the
// first error; after one, no new call starts.
func inParallel(n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, loaders)
	for range loaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n && len(errs) == 0; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// createScopes creates a layout's scopes, all of one protocol.
func (e *worldEnv) createScopes(l Layout, p model.Protocol) error {
	return inParallel(worldScopes(l), func(k int) error {
		return e.Client.Create(context.Background(), worldScope(l, k, p))
	})
}

// read builds the model of what the API server holds.
func (e *worldEnv) read(p WorldParams) (*apiWorld, error) {
	ctx := context.Background()
	w := newAPIWorld(p)
	svcs := &corev1.ServiceList{}
	if err := e.fast.List(ctx, svcs); err != nil {
		return nil, err
	}
	slices := &discoveryv1.EndpointSliceList{}
	if err := e.fast.List(ctx, slices); err != nil {
		return nil, err
	}
	bySvc := map[model.Key]*discoveryv1.EndpointSlice{}
	for i := range slices.Items {
		s := &slices.Items[i]
		bySvc[model.Key{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]}] = s
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		k := model.Key{Namespace: s.Namespace, Name: s.Name}
		if bySvc[k] == nil {
			return nil, fmt.Errorf("no EndpointSlice for Service %s", k)
		}
		w.setService(s, bySvc[k])
	}
	for k := range worldScopes(p.Layout) {
		ps := &xdsv1alpha1.ProxyScope{}
		want := worldScope(p.Layout, k, p.Protocol)
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(want), ps); err != nil {
			return nil, err
		}
		if err := w.setScope(ps); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// copyTree copies a directory of regular files.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		if !d.Type().IsRegular() {
			return errors.New("not a regular file: " + path)
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	})
}

// loadWorldMain is `bench load-world`: it builds and caches the world of
// -services Services, unless it is cached already.
func loadWorldMain(args []string) int {
	fs := flag.NewFlagSet("load-world", flag.ContinueOnError)
	services := fs.Int("services", 100000, "number of Services")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	e, err := openWorld(*services, RunOptions{Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench load-world:", err)
		return 1
	}
	if err := e.close(); err != nil {
		fmt.Fprintln(os.Stderr, "bench load-world:", err)
		return 1
	}
	return 0
}

// tail is the last n bytes of b.
func tail(b []byte, n int) string {
	return string(b[max(0, len(b)-n):])
}
