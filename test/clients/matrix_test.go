// Package clients is the client matrix (make test-clients): one scenario
// driven through three gRPC xDS clients as a user runs them — grpc-go in
// process, grpc-js-xds (Node.js, pinned by package-lock.json here) and gRPC
// C-core (Debian's python3-grpcio) as child processes — against the
// operator on a real API server, with backends in a network namespace the
// test creates, at the addresses the EndpointSlices list.
package clients

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/server"
)

// The network the test creates: a namespace with one end of a veth pair,
// holding the backends' addresses, and the other end here. 198.18.0.0/15
// is reserved for benchmarking (RFC 2544) and never routed.
const (
	hostAddr = "198.18.0.1"
	addrA    = "198.18.0.2"
	addrB    = "198.18.0.3"
	port     = 50051
	ns       = "matrix"
	target   = "xds:///whoami.matrix.svc.cluster.local:50051"
)

// reach is how long a client may take to reach an expected outcome: far
// more than a working client needs (well under a second), and more than
// gRPC's 15 s does-not-exist timer, so a timer is not mistaken for a fix.
const reach = 25 * time.Second

func TestClientMatrix(t *testing.T) {
	if os.Getenv("SCOPEPLANE_CLIENT_MATRIX") == "" {
		t.Skip("the client matrix runs with make test-clients, which installs its Node.js and Python clients")
	}
	node, python := clientTools(t)
	netns := makeNetwork(t)
	a := whoami.Serve("backend-a", listenIn(t, netns, net.JoinHostPort(addrA, fmt.Sprint(port))))
	defer a.Stop()
	b := whoami.Serve("backend-b", listenIn(t, netns, net.JoinHostPort(addrB, fmt.Sprint(port))))
	defer b.Stop()

	c := startOperator(t)
	create(t, c,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		whoamiService(),
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: port}}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "whoami-1", Labels: map[string]string{discoveryv1.LabelServiceName: "whoami"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addrA}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		},
		scope("grpc", xdsv1alpha1.ProtocolSotW),
		scope("delta", xdsv1alpha1.ProtocolDelta),
	)
	dir := t.TempDir()
	grpcBootstrap := writeBootstrap(t, c, dir, "grpc")
	deltaBootstrap := writeBootstrap(t, c, dir, "delta")

	kinds := []string{"grpc-go", "grpc-js-xds", "c-core"}
	start := func(kind, boot string) *runner {
		switch kind {
		case "grpc-go":
			return startGo(t, boot)
		case "grpc-js-xds":
			return startChild(t, kind, boot, node, filepath.Join(".", "client.js"), target)
		default:
			return startChild(t, kind, boot, python, filepath.Join(".", "client.py"), target)
		}
	}
	clients := map[string]*runner{}
	for _, k := range kinds {
		clients[k] = start(k, grpcBootstrap)
	}

	m := &matrix{kinds: kinds, cells: map[string]map[string]string{}}
	defer func() { t.Log("\n" + m.String()) }()
	expect := func(scenario, what string, want func(result) bool) {
		for _, k := range kinds {
			m.record(t, scenario, k, what, clients[k], want)
		}
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami-1"}}
	ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grpc"}}

	expect("initial RPCs", "backend-a", backend("backend-a"))

	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{addrB} })
	expect("endpoint move", "backend-b", backend("backend-b"))

	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Conditions.Ready = ptr.To(false) })
	expect("endpoint not ready", "RPCs fail", failing)
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Conditions.Ready = ptr.To(true) })
	expect("endpoint not ready", "then backend-b again", backend("backend-b"))

	// A one-replica Deployment's rollout: its only pod (backend-b) is
	// serving but terminating before the new one (backend-a) is ready.
	// kube-proxy keeps routing to a terminating pod while no ready one
	// exists (KEP-1669), and so must every client: not one RPC may fail.
	const rollout = "rollout: the only backend terminating, a new one ready"
	from := map[string]int{}
	for _, k := range kinds {
		from[k] = clients[k].count()
	}
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) {
		s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	})
	for _, k := range kinds {
		m.recordSteady(t, rollout, k, "backend-b while terminating", clients[k], steadyResults, backend("backend-b"))
	}
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addrA}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true)}})
	})
	expect(rollout, "backend-a once ready", backend("backend-a"))
	mutate(t, c, slice, func(s *discoveryv1.EndpointSlice) { s.Endpoints = s.Endpoints[1:] })
	for _, k := range kinds {
		m.recordSteady(t, rollout, k, "backend-a after backend-b left", clients[k], steadyResults, backend("backend-a"))
		m.recordNoFailures(t, rollout, k, clients[k], from[k])
	}

	mutate(t, c, ps, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"other"}}}
	})
	expect("Service removed from and re-added to the scope", "RPCs fail", failing)
	mutate(t, c, ps, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}}
	})
	// The Service comes back stamped with the scope's new generation: C-core
	// ignores a listener or route configuration equal to the one it cached
	// before the removal, and these are not. grpc-js-xds also compares the
	// cluster, as it parsed it, and a parsed cluster has no field that could
	// carry the generation without changing what the client does; it keeps
	// failing until restarted (docs/troubleshooting.md), which is asserted.
	const readded = "Service removed from and re-added to the scope"
	for _, k := range []string{"grpc-go", "c-core"} {
		m.record(t, readded, k, "then backend-a again", clients[k], backend("backend-a"))
	}
	m.recordStuck(t, readded, "grpc-js-xds", clients["grpc-js-xds"], backend("backend-a"))
	clients["grpc-js-xds"].stop()
	clients["grpc-js-xds"] = start("grpc-js-xds", grpcBootstrap)
	m.record(t, readded, "grpc-js-xds", "restarted: backend-a", clients["grpc-js-xds"], backend("backend-a"))

	if err := c.Delete(context.Background(), whoamiService()); err != nil {
		t.Fatal(err)
	}
	expect("Service deleted and re-created", "RPCs fail", failing)
	create(t, c, whoamiService())
	expect("Service deleted and re-created", "then backend-a again", backend("backend-a"))

	// A client of a Delta scope: gRPC speaks SotW only, so it is refused,
	// and the scope says so.
	for _, k := range kinds {
		clients[k].stop()
		clients[k] = start(k, deltaBootstrap)
	}
	// grpc-go carries the refusal into the RPC's error: it must say what to do.
	const wrong = "wrong protocol (a Delta scope)"
	m.record(t, wrong, "grpc-go", "told to set spec.protocol: SotW", clients["grpc-go"], func(r result) bool {
		return strings.Contains(r.Error, "set the scope's spec.protocol: SotW")
	})
	for _, k := range []string{"grpc-js-xds", "c-core"} {
		m.record(t, wrong, k, "RPCs fail", clients[k], failing)
	}
	testkit.Eventually(t, "the delta scope Degraded with WrongProtocol, telling gRPC clients' owner to set spec.protocol: SotW", func() (bool, string) {
		got := &xdsv1alpha1.ProxyScope{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "delta"}, got); err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == xdsv1alpha1.ConditionDegraded {
				return cond.Reason == xdsv1alpha1.ReasonWrongProtocol && strings.Contains(cond.Message, "spec.protocol: SotW") &&
					!strings.Contains(cond.Message, "api_type"), cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Degraded condition"
	})
}

// result is one RPC's outcome, as the clients print it.
type result struct {
	Backend string `json:"backend,omitempty"`
	Error   string `json:"error,omitempty"`
}

func backend(name string) func(result) bool {
	return func(r result) bool { return r.Backend == name }
}

func failing(r result) bool { return r.Error != "" }

// runner is one running client and the results it reported, in order.
type runner struct {
	kind    string
	mu      sync.Mutex
	results []result
	stderr  *lockedBuffer
	stop    func()
}

func (r *runner) add(res result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

func (r *runner) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.results)
}

// await waits, up to reach, for a result after the first from that
// satisfies want; it returns the last result seen.
func (r *runner) await(from int, want func(result) bool) (bool, result, time.Duration) {
	begin := time.Now()
	deadline := begin.Add(reach)
	var last result
	for {
		r.mu.Lock()
		for _, res := range r.results[min(from, len(r.results)):] {
			last = res
			if want(res) {
				r.mu.Unlock()
				return true, res, time.Since(begin)
			}
		}
		from = max(from, len(r.results))
		r.mu.Unlock()
		if time.Now().After(deadline) {
			return false, last, time.Since(begin)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// matrix is the outcome of each scenario for each client.
type matrix struct {
	kinds     []string
	scenarios []string
	cells     map[string]map[string]string
}

// record waits for the client to reach what the step wants and records it;
// a client that does not is an error, and the scenario goes on.
func (m *matrix) record(t *testing.T, scenario, kind, what string, r *runner, want func(result) bool) {
	t.Helper()
	if m.cells[scenario] == nil {
		m.scenarios = append(m.scenarios, scenario)
		m.cells[scenario] = map[string]string{}
	}
	ok, last, took := r.await(r.count(), want)
	cell := m.cells[scenario][kind]
	if cell != "" {
		cell += "; "
	}
	if ok {
		cell += what
		if last.Error != "" {
			cell += fmt.Sprintf(" (%s)", clipped(last.Error))
		}
	} else {
		cell += fmt.Sprintf("NOT %s within %v (last: %s)", what, reach, clipped(last.Backend+last.Error))
		t.Errorf("%s, %s: %s did not reach %q within %v (%v); last result %+v; stderr:\n%s", scenario, what, kind, what, reach, took.Round(time.Second), last, r.stderr.tail())
	}
	m.cells[scenario][kind] = cell
}

// recordStuck records a client that, as documented, does not reach what
// want says within reach; one that does is an error, since the
// troubleshooting guide then says something no longer true.
func (m *matrix) recordStuck(t *testing.T, scenario, kind string, r *runner, want func(result) bool) {
	t.Helper()
	ok, last, _ := r.await(r.count(), want)
	if ok {
		m.add(scenario, kind, "recovered")
		t.Errorf("%s: %s recovered (%+v), which docs/troubleshooting.md says it does not: update the guide and this test", scenario, kind, last)
		return
	}
	m.add(scenario, kind, fmt.Sprintf("still failing after %v (known client limitation: last %s)", reach, clipped(last.Backend+last.Error)))
}

// steadyResults is how many RPCs in a row a steady step wants: two
// seconds of calls, many times what a push takes to reach the clients.
const steadyResults = 20

// recordSteady waits for n results after now and records whether every one
// satisfies want.
func (m *matrix) recordSteady(t *testing.T, scenario, kind, what string, r *runner, n int, want func(result) bool) {
	t.Helper()
	from := r.count()
	ok, _, _ := r.await(from+n-1, func(result) bool { return true })
	r.mu.Lock()
	got := slices.Clone(r.results[from:])
	r.mu.Unlock()
	bad := slices.IndexFunc(got, func(res result) bool { return !want(res) })
	switch {
	case !ok:
		m.add(scenario, kind, fmt.Sprintf("NOT %d results within %v", n, reach))
		t.Errorf("%s, %s: %s returned %d results within %v, want %d; stderr:\n%s", scenario, what, kind, len(got), reach, n, r.stderr.tail())
	case bad >= 0:
		m.add(scenario, kind, fmt.Sprintf("NOT %s (result %d of %d: %s)", what, bad+1, len(got), clipped(got[bad].Backend+got[bad].Error)))
		t.Errorf("%s, %s: %s's result %d of %d is %+v", scenario, what, kind, bad+1, len(got), got[bad])
	default:
		m.add(scenario, kind, fmt.Sprintf("%s (%d RPCs)", what, len(got)))
	}
}

// recordNoFailures records how many RPCs the client made since its result
// number from, and fails the test if any of them failed.
func (m *matrix) recordNoFailures(t *testing.T, scenario, kind string, r *runner, from int) {
	t.Helper()
	r.mu.Lock()
	got := slices.Clone(r.results[from:])
	r.mu.Unlock()
	failed := 0
	var first result
	for _, res := range got {
		if res.Error != "" {
			if failed == 0 {
				first = res
			}
			failed++
		}
	}
	m.add(scenario, kind, fmt.Sprintf("%d failed of %d RPCs", failed, len(got)))
	if failed > 0 {
		t.Errorf("%s: %s failed %d of %d RPCs, the first with %q", scenario, kind, failed, len(got), first.Error)
	}
}

// add appends a note to a cell.
func (m *matrix) add(scenario, kind, note string) {
	if m.cells[scenario] == nil {
		m.scenarios = append(m.scenarios, scenario)
		m.cells[scenario] = map[string]string{}
	}
	if cell := m.cells[scenario][kind]; cell != "" {
		note = cell + "; " + note
	}
	m.cells[scenario][kind] = note
}

func clipped(s string) string {
	if len(s) > 90 {
		return s[:90] + "…"
	}
	return s
}

func (m *matrix) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| scenario | %s |\n|---|%s\n", strings.Join(m.kinds, " | "), strings.Repeat("---|", len(m.kinds)))
	for _, s := range m.scenarios {
		fmt.Fprintf(&b, "| %s |", s)
		for _, k := range m.kinds {
			fmt.Fprintf(&b, " %s |", strings.ReplaceAll(m.cells[s][k], "|", "/"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// clientTools finds Node.js with the pinned packages installed and a
// Python with grpcio, or fails saying how to get them.
func clientTools(t *testing.T) (node, python string) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("Node.js (node) is not on PATH: the grpc-js-xds client needs it")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "@grpc", "grpc-js-xds", "package.json")); err != nil {
		t.Fatal("test/clients/node_modules lacks @grpc/grpc-js-xds: run `npm ci` in test/clients (make test-clients does)")
	}
	python = os.Getenv("SCOPEPLANE_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	if out, err := exec.Command(python, "-c", "import grpc").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc (%v: %s): install Debian's python3-grpcio (make test-clients does, as root), or set SCOPEPLANE_PYTHON", python, err, bytes.TrimSpace(out))
	}
	return node, python
}

// makeNetwork creates a network namespace holding addrA and addrB behind a
// veth pair whose other end here has hostAddr, and removes both when the
// test ends. Where it cannot, it skips the test, saying why, unless the
// test runs as root: there (make test-clients in CI) nothing should stop
// it, and a matrix that quietly did not run would prove nothing.
func makeNetwork(t *testing.T) string {
	name := fmt.Sprintf("spmatrix-%d", os.Getpid())
	host, peer := fmt.Sprintf("spm%dh", os.Getpid()%100000), fmt.Sprintf("spm%dn", os.Getpid()%100000)
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	if err := ip("netns", "add", name); err != nil {
		if os.Geteuid() == 0 {
			t.Fatalf("cannot create the network namespace for the backends as root: %v", err)
		}
		t.Skipf("the client matrix needs a network namespace for its backends and cannot create one (run it as root, with iproute2): %v", err)
	}
	t.Cleanup(func() {
		_ = ip("link", "del", host) // deletes the peer too
		if err := ip("netns", "del", name); err != nil {
			t.Errorf("removing the network namespace: %v", err)
		}
	})
	for _, args := range [][]string{
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", name},
		{"addr", "add", hostAddr + "/24", "dev", host},
		{"link", "set", host, "up"},
		{"-n", name, "addr", "add", addrA + "/24", "dev", peer},
		{"-n", name, "addr", "add", addrB + "/24", "dev", peer},
		{"-n", name, "link", "set", peer, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// listenIn listens on addr inside the network namespace netns: a socket
// stays in the namespace it was made in, whichever thread later uses it.
func listenIn(t *testing.T, netns, addr string) net.Listener {
	type out struct {
		lis net.Listener
		err error
	}
	done := make(chan out, 1)
	go func() {
		// The thread is locked and never unlocked when it cannot return to
		// its namespace: the runtime then ends it with the goroutine.
		runtime.LockOSThread()
		here, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- out{err: err}
			return
		}
		defer func() { _ = here.Close() }()
		there, err := os.Open("/run/netns/" + netns)
		if err != nil {
			done <- out{err: err}
			return
		}
		defer func() { _ = there.Close() }()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- out{err: fmt.Errorf("entering %s: %w", netns, err)}
			return
		}
		lis, err := net.Listen("tcp", addr)
		if err := unix.Setns(int(here.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- out{err: fmt.Errorf("leaving %s: %w", netns, err)}
			return
		}
		runtime.UnlockOSThread()
		done <- out{lis, err}
	}()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.lis
}

// startOperator runs the API server and the operator, as the end-to-end
// tests do, and returns a client of the API server.
func startOperator(t *testing.T) client.Client {
	ctrl.SetLogger(logr.Discard()) // the matrix is the output; the operator's logs are not
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := controlplane.Setup(ctx, mgr, controlplane.Options{
		XDSListener: lis, XDSServerAddress: lis.Addr().String(), CoalesceWindow: 5 * time.Millisecond, StatusWindow: 50 * time.Millisecond,
		// The matrix is about protocol conformance: grpc-js and C-core
		// connect in plaintext.
		TLS:    controlplane.TLS{Insecure: true},
		Server: server.Options{Authenticator: &auth.Authenticator{AllowAnonymous: true}},
	}); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return env.Client
}

func whoamiService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: port, AppProtocol: ptr.To("grpc")}}},
	}
}

func scope(name string, p xdsv1alpha1.Protocol) *xdsv1alpha1.ProxyScope {
	return &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: p,
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		},
	}
}

func create(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func mutate[T client.Object](t *testing.T, c client.Client, obj T, fn func(T)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		fn(obj)
		return c.Update(context.Background(), obj)
	}); err != nil {
		t.Fatal(err)
	}
}

// writeBootstrap writes the gRPC bootstrap the operator put in the scope's
// ConfigMap to a file, as a pod mounting it would see it.
func writeBootstrap(t *testing.T, c client.Client, dir, scopeName string) string {
	t.Helper()
	var data string
	testkit.Eventually(t, "the bootstrap ConfigMap of "+scopeName, func() (bool, string) {
		cm := &corev1.ConfigMap{}
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(scopeName)}, cm)
		data = cm.Data[bootstrap.GRPCKey]
		return err == nil && data != "", fmt.Sprint(err)
	})
	path := filepath.Join(dir, scopeName+"-bootstrap.json")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startGo runs grpc-go's xDS client in process, calling every 100 ms as
// the child clients do.
func startGo(t *testing.T, bootstrapPath string) *runner {
	data, err := os.ReadFile(bootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	res, err := xds.NewXDSResolverWithConfigForTesting(data)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithResolvers(res), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{kind: "grpc-go", stderr: &lockedBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			callCtx, callCancel := context.WithTimeout(ctx, time.Second)
			name, err := whoami.Call(callCtx, conn)
			callCancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				r.add(result{Error: err.Error()})
			} else {
				r.add(result{Backend: name})
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = conn.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// startChild runs a client script and reads its JSON lines.
func startChild(t *testing.T, kind, bootstrapPath, interpreter string, args ...string) *runner {
	cmd := exec.Command(interpreter, args...)
	cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP="+bootstrapPath)
	r := &runner{kind: kind, stderr: &lockedBuffer{}}
	cmd.Stderr = r.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s client: %v", kind, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var res result
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil || (res.Backend == "") == (res.Error == "") {
				res = result{Error: "unreadable line from the client: " + sc.Text()}
			}
			r.add(res)
		}
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			<-read
			_ = cmd.Wait()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// lockedBuffer keeps a child's stderr for the failure message.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// tail is the last few kB written.
func (l *lockedBuffer) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}
