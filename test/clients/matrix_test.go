// Package clients is the client matrix (make test-clients): scenarios
// (TestClientMatrix, and a scope moving to another shard,
// TestClientMatrixShardMove) driven through three gRPC xDS clients as a
// user runs them — grpc-go in process, grpc-js-xds (Node.js, pinned by
// package-lock.json here) and gRPC C-core (Debian's python3-grpcio) as
// child processes — against the operator on a real API server, with backends in a network namespace the
// test creates, at the addresses the EndpointSlices list. Each joins over
// TLS the way docs/bootstrap.md tells its Pod to: grpc-go with a
// ServiceAccount token (call_creds), grpc-js-xds and C-core, each in a
// network namespace of its own at its Pod's address, by peer address with
// the published key, set up by the variables of the ConfigMap's grpc-env.
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
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/internal/whoami"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// The network the test creates: a namespace with one end of a veth pair,
// holding the backends' addresses, and the other end here. 198.18.0.0/15
// is reserved for benchmarking (RFC 2544) and never routed.
const (
	hostAddr = "198.18.0.1"
	addrA    = "198.18.0.2"
	addrB    = "198.18.0.3"
	// The addresses of the grpc-js-xds and C-core clients' Pods.
	addrJS    = "198.18.0.4"
	addrCCore = "198.18.0.5"
	// The addresses of whoami-v1 and whoami-v2, the mesh routes' backends
	// (meshroutes_test.go), in the backends' namespace.
	addrV1 = "198.18.0.6"
	addrV2 = "198.18.0.7"
	port   = 50051
	ns     = "matrix"
	target = "xds:///whoami.matrix.svc.cluster.local:50051"
)

// reach is how long a client may take to reach an expected outcome: far
// more than a working client needs (well under a second), and more than
// gRPC's 15 s does-not-exist timer, so a timer is not mistaken for a fix.
const reach = 25 * time.Second

// callCredsEnv turns on grpc-go's reading of the bootstrap's call_creds;
// grpc-go reads it once, when the process starts.
const callCredsEnv = "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS"

// TestMain runs the matrix's binary again with callCredsEnv set, as the
// grpc-env of the bootstrap ConfigMap tells a grpc-go Pod to: the in-process
// grpc-go client then sends its token.
func TestMain(m *testing.M) {
	if os.Getenv("SCOPEPLANE_CLIENT_MATRIX") != "" && os.Getenv(callCredsEnv) != "true" {
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, append(os.Environ(), callCredsEnv+"=true"))
		}
		fmt.Fprintln(os.Stderr, "running the client matrix again with", callCredsEnv+"=true:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func TestClientMatrix(t *testing.T) {
	node, python, netns, clientNS := matrixNetwork(t)
	dir := t.TempDir()
	c, cp := startOperator(t, dir)
	createClients(t, c,
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: port}}},
		},
		scope("grpc", xdsv1alpha1.ProtocolSotW),
		scope("delta", xdsv1alpha1.ProtocolDelta),
	)
	grpcBootstrap, grpcEnv := writeBootstrap(t, c, dir, "grpc")
	deltaBootstrap, _ := writeBootstrap(t, c, dir, "delta")
	token := writeToken(t, c, dir, "grpc-go")

	kinds := []string{"grpc-go", "grpc-js-xds", "c-core"}
	startPaced := func(kind, boot string, p pace) *runner {
		switch kind {
		case "grpc-go":
			return startGo(t, boot, token, p)
		case "grpc-js-xds":
			return startChild(t, kind, clientNS[kind], boot, append(slices.Clone(grpcEnv), p.env()...), node, filepath.Join(".", "client.js"), target)
		default:
			return startChild(t, kind, clientNS[kind], boot, append(slices.Clone(grpcEnv), p.env()...), python, filepath.Join(".", "client.py"), target)
		}
	}
	start := func(kind, boot string) *runner { return startPaced(kind, boot, matrixPace) }
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
	// Each joined as docs/bootstrap.md says: grpc-go with its token,
	// grpc-js-xds and C-core as their Pods, by peer address.
	joined := map[string]string{
		"grpc-go":     "system:serviceaccount:matrix:grpc-go",
		"grpc-js-xds": "system:serviceaccount:matrix:grpc-js (pod grpc-js-xds, by peer address " + addrJS + ")",
		"c-core":      "system:serviceaccount:matrix:c-core (pod c-core, by peer address " + addrCCore + ")",
	}
	testkit.Eventually(t, "the scope's proxies joined with their documented identities", func() (bool, string) {
		var got []string
		for _, p := range cp.Feedback.Get(model.Key{Namespace: ns, Name: "grpc"}).Proxies {
			got = append(got, p.Identity)
		}
		for _, want := range joined {
			if !slices.Contains(got, want) {
				return false, fmt.Sprint(got)
			}
		}
		return true, ""
	})
	for _, k := range kinds {
		m.add("joins over TLS as", k, joined[k])
	}

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
	// The Service comes back stamped with the scope's new generation, and
	// every running client must take it without a restart: C-core ignores
	// a listener or route configuration equal to the one it cached before
	// the removal, and grpc-js-xds a cluster that parses equal to its
	// cached copy (xds/translate/epoch.go).
	expect("Service removed from and re-added to the scope", "then backend-a again", backend("backend-a"))

	if err := c.Delete(context.Background(), whoamiService()); err != nil {
		t.Fatal(err)
	}
	expect("Service deleted and re-created", "RPCs fail", failing)
	create(t, c, whoamiService())
	expect("Service deleted and re-created", "then backend-a again", backend("backend-a"))

	// A Service that leaves the scope by its own labels and comes back
	// unchanged is not marked, since no edit of the scope records that it
	// left (docs/troubleshooting.md): grpc-go takes it back, and an edit of
	// the scope's spec, which restamps all it serves, brings back every
	// client.
	const relabeled = "Service left the scope by its labels and came back; then the scope's spec edited"
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whoami"}}
	selected := map[string]string{"scope": "grpc"}
	mutate(t, c, svc, func(s *corev1.Service) { s.Labels = selected })
	mutate(t, c, ps, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{MatchLabels: selected}}}
	})
	expect(relabeled, "backend-a", backend("backend-a"))
	mutate(t, c, svc, func(s *corev1.Service) { s.Labels = nil })
	expect(relabeled, "RPCs fail", failing)
	mutate(t, c, svc, func(s *corev1.Service) { s.Labels = selected })
	m.record(t, relabeled, "grpc-go", "then backend-a again", clients["grpc-go"], backend("backend-a"))
	mutate(t, c, ps, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"whoami"}}}
	})
	expect(relabeled, "backend-a after the edit", backend("backend-a"))

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

	meshRoutes(&mesh{
		t: t, c: c, cp: cp, m: m, kinds: kinds, clients: clients, identities: joined,
		start: func(kind string) *runner { return startPaced(kind, grpcBootstrap, meshPace) },
	}, netns)
}

// matrixNetwork skips the test unless make test-clients runs it, and
// makes its network with backend-a and backend-b serving in it; it returns
// the child clients' interpreters, the backends' network namespace and the
// child clients'.
func matrixNetwork(t *testing.T) (node, python, netns string, clientNS map[string]string) {
	if os.Getenv("SCOPEPLANE_CLIENT_MATRIX") == "" {
		t.Skip("the client matrix runs with make test-clients, which installs its Node.js and Python clients")
	}
	node, python = clientTools(t)
	netns, clientNS = makeNetwork(t)
	for name, addr := range map[string]string{"backend-a": addrA, "backend-b": addrB} {
		s := whoami.Serve(name, listenIn(t, netns, net.JoinHostPort(addr, fmt.Sprint(port))))
		t.Cleanup(s.Stop)
	}
	return node, python, netns, clientNS
}

// createClients creates what the clients need in namespace ns, and objs:
// their ServiceAccounts, the Pods of the child clients as the kubelet
// reports them (Running at the address of the client's network
// namespace), the whoami Service and its EndpointSlice whoami-1, listing
// backend-a.
func createClients(t *testing.T, c client.Client, objs ...client.Object) {
	create(t, c, append([]client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grpc-go"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grpc-js"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c-core"}},
		whoamiService(),
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "whoami-1", Labels: map[string]string{discoveryv1.LabelServiceName: "whoami"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addrA}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		},
	}, objs...)...)
	for _, p := range []struct{ name, sa, ip string }{{"grpc-js-xds", "grpc-js", addrJS}, {"c-core", "c-core", addrCCore}} {
		runningPod(t, c, p.name, p.sa, p.ip)
	}
}

// result is one RPC's outcome, as the clients print it: the backend that
// answered, or the error and its status code's name (DEADLINE_EXCEEDED);
// whether the call carried x-canary: yes (every other one does); and how
// long it took.
type result struct {
	Backend string `json:"backend,omitempty"`
	Error   string `json:"error,omitempty"`
	Code    string `json:"code,omitempty"`
	Canary  bool   `json:"canary"`
	Ms      int64  `json:"ms"`
}

// pace is how a client calls: one call at a time, interval after the last
// one ended, each with its own deadline.
type pace struct {
	interval, deadline time.Duration
}

// matrixPace is the pace of the matrix's endpoint and scope scenarios.
var matrixPace = pace{interval: 100 * time.Millisecond, deadline: time.Second}

// env is the pace in the variables the child clients read.
func (p pace) env() []string {
	return []string{
		fmt.Sprintf("SCOPEPLANE_CALL_INTERVAL_MS=%d", p.interval.Milliseconds()),
		fmt.Sprintf("SCOPEPLANE_CALL_DEADLINE_MS=%d", p.deadline.Milliseconds()),
	}
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
	_, ok, last := r.awaitAt(from, want)
	return ok, last, time.Since(begin)
}

// awaitAt is await saying where the result that satisfied want is: at is
// the number of results up to and including it.
func (r *runner) awaitAt(from int, want func(result) bool) (at int, ok bool, last result) {
	deadline := time.Now().Add(reach)
	for {
		r.mu.Lock()
		for i := min(from, len(r.results)); i < len(r.results); i++ {
			last = r.results[i]
			if want(last) {
				r.mu.Unlock()
				return i + 1, true, last
			}
		}
		from = max(from, len(r.results))
		r.mu.Unlock()
		if time.Now().After(deadline) {
			return from, false, last
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

// makeNetwork creates a bridge here with hostAddr and, attached to it by
// veth pairs, a network namespace holding addrA, addrB, addrV1 and addrV2
// (the backends)
// and one for each child client at its Pod's address (grpc-js-xds addrJS,
// C-core addrCCore), so that the xDS server sees each client's own source
// address; it removes them all when the test ends. It returns the
// backends' namespace and the clients' by kind. Where it cannot, it skips
// the test, saying why, unless the test runs as root: there (make
// test-clients in CI) nothing should stop it, and a matrix that quietly
// did not run would prove nothing.
func makeNetwork(t *testing.T) (string, map[string]string) {
	name := fmt.Sprintf("spmatrix-%d", os.Getpid())
	id := os.Getpid() % 100000
	bridge, host, peer := fmt.Sprintf("spm%db", id), fmt.Sprintf("spm%dh", id), fmt.Sprintf("spm%dn", id)
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
	clients := map[string]string{"grpc-js-xds": name + "-js", "c-core": name + "-c"}
	t.Cleanup(func() {
		for _, l := range []string{host, fmt.Sprintf("spm%dja", id), fmt.Sprintf("spm%dca", id), bridge} {
			_ = ip("link", "del", l) // a veth's peer goes with it
		}
		for _, n := range []string{name, clients["grpc-js-xds"], clients["c-core"]} {
			if err := ip("netns", "del", n); err != nil && !strings.Contains(err.Error(), "No such file") {
				t.Errorf("removing the network namespace %s: %v", n, err)
			}
		}
	})
	steps := [][]string{
		{"link", "add", bridge, "type", "bridge"},
		{"addr", "add", hostAddr + "/24", "dev", bridge},
		{"link", "set", bridge, "up"},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", host, "master", bridge},
		{"link", "set", host, "up"},
		{"link", "set", peer, "netns", name},
		{"-n", name, "addr", "add", addrA + "/24", "dev", peer},
		{"-n", name, "addr", "add", addrB + "/24", "dev", peer},
		{"-n", name, "addr", "add", addrV1 + "/24", "dev", peer},
		{"-n", name, "addr", "add", addrV2 + "/24", "dev", peer},
		{"-n", name, "link", "set", peer, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	}
	for kind, addr := range map[string]string{"grpc-js-xds": addrJS, "c-core": addrCCore} {
		n, here, there := clients[kind], fmt.Sprintf("spm%d%sa", id, kind[:1]), fmt.Sprintf("spm%d%sb", id, kind[:1])
		steps = append(steps,
			[]string{"netns", "add", n},
			[]string{"link", "add", here, "type", "veth", "peer", "name", there},
			[]string{"link", "set", here, "master", bridge},
			[]string{"link", "set", here, "up"},
			[]string{"link", "set", there, "netns", n},
			[]string{"-n", n, "addr", "add", addr + "/24", "dev", there},
			[]string{"-n", n, "link", "set", there, "up"},
			[]string{"-n", n, "link", "set", "lo", "up"},
		)
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return name, clients
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
// tests do, with the chart's defaults: TLS from the self-managed CA, and
// tokens, here with peer addresses too. The bootstraps name files in dir,
// where writeBootstrap puts them as the kubelet would. It returns a client
// of the API server and the control plane.
func startOperator(t *testing.T, dir string) (client.Client, *controlplane.ControlPlane) {
	env := startAPI(t)
	// The clients reach the xDS port at the bridge's address, from their
	// own.
	lis, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := startReplica(t, env, dir, lis, shard.Shards{})
	return env.Client, cp
}

// startAPI runs the API server, with the operator's namespace.
func startAPI(t *testing.T) *localapi.Env {
	ctrl.SetLogger(logr.Discard()) // the matrix is the output; the operator's logs are not
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	create(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scopeplane-system"}})
	return env
}

// startReplica runs one replica of the operator against env, serving xDS
// on lis, of the shards given (none: unsharded); stop ends it as a pod's
// termination does, its streams ended with Unavailable. Replicas of one
// test share its process, and so controller names.
func startReplica(t *testing.T, env *localapi.Env, dir string, lis net.Listener, shards shard.Shards) (cp *controlplane.ControlPlane, stop func()) {
	t.Cleanup(func() { _ = lis.Close() })
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.Config{Methods: "token,peer-address", Audience: auth.DefaultAudience}.Build(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp, err = controlplane.Setup(ctx, mgr, controlplane.Options{
		XDSListener: lis, XDSServerAddress: lis.Addr().String(), CoalesceWindow: 5 * time.Millisecond, StatusWindow: 50 * time.Millisecond,
		BootstrapMountPath: dir,
		TLS:                controlplane.TLS{Secret: types.NamespacedName{Namespace: "scopeplane-system", Name: "scopeplane-xds-tls"}},
		Server:             server.Options{Authenticator: a},
		Shards:             shards,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return cp, stop
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
			// grpc-js-xds and C-core join by their Pods' addresses.
			AdmitByPeerAddress: true,
		},
	}
}

// runningPod creates a Pod of ServiceAccount sa and reports it Running at
// ip, on a node at hostAddr, as a kubelet would.
func runningPod(t *testing.T, c client.Client, name, sa, ip string) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, NodeName: "matrix-node", Containers: []corev1.Container{{Name: "client", Image: name}}},
	}
	create(t, c, p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		HostIP: hostAddr, HostIPs: []corev1.HostIP{{IP: hostAddr}}}
	if err := c.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// writeToken writes a ServiceAccount token of sa for the scopeplane
// audience, as the kubelet writes a projected one, and returns its path.
func writeToken(t *testing.T, c client.Client, dir, sa string) string {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{auth.DefaultAudience}, ExpirationSeconds: ptr.To(int64(3600))}}
	if err := c.SubResource("token").Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}, tr); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, sa+".token")
	if err := os.WriteFile(path, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
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

// writeBootstrap writes the files of the scope's ConfigMap into dir, as a
// Pod mounting it at dir would see them (the CA and the published key are
// the same in every scope's), the gRPC bootstrap under a name of the
// scope's own; it returns the bootstrap's path and the variables of its
// grpc-env.
func writeBootstrap(t *testing.T, c client.Client, dir, scopeName string) (string, []string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	testkit.Eventually(t, "the bootstrap ConfigMap of "+scopeName, func() (bool, string) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName(scopeName)}, cm)
		return err == nil && cm.Data[bootstrap.GRPCKey] != "" && cm.Data[bootstrap.TLSOnlyKeyKey] != "", fmt.Sprint(err)
	})
	for _, k := range []string{bootstrap.CAKey, bootstrap.TLSOnlyKeyKey} {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(cm.Data[k]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, scopeName+"-bootstrap.json")
	if err := os.WriteFile(path, []byte(cm.Data[bootstrap.GRPCKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, l := range strings.Split(cm.Data[bootstrap.GRPCEnvKey], "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			env = append(env, l)
		}
	}
	return path, env
}

// startGo runs grpc-go's xDS client in process, calling at pace p as the
// child clients do (every other call with x-canary: yes), with the
// bootstrap's call_creds reading the token at tokenPath instead of the
// projected volume's path.
func startGo(t *testing.T, bootstrapPath, tokenPath string, p pace) *runner {
	data, err := os.ReadFile(bootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	data = bytes.ReplaceAll(data, []byte(`"`+bootstrap.TokenPath+`"`), []byte(`"`+tokenPath+`"`))
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
		canary := false
		for ctx.Err() == nil {
			canary = !canary
			callCtx, callCancel := context.WithTimeout(ctx, p.deadline)
			if canary {
				callCtx = metadata.AppendToOutgoingContext(callCtx, "x-canary", "yes")
			}
			begin := time.Now()
			name, err := whoami.Call(callCtx, conn)
			res := result{Backend: name, Canary: canary, Ms: time.Since(begin).Milliseconds()}
			callCancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				res.Error, res.Code = err.Error(), rpccode.Code(status.Code(err)).String()
			}
			r.add(res)
			select {
			case <-ctx.Done():
			case <-time.After(p.interval):
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

// startChild runs a client script in the network namespace netns, with
// the environment of the ConfigMap's grpc-env (its GRPC_XDS_BOOTSTRAP
// replaced by bootstrapPath), and reads its JSON lines. ip netns exec
// enters the namespace and execs the interpreter, whose process it is.
func startChild(t *testing.T, kind, netns, bootstrapPath string, grpcEnv []string, interpreter string, args ...string) *runner {
	cmd := exec.Command("ip", append([]string{"netns", "exec", netns, interpreter}, args...)...)
	cmd.Env = append(append(os.Environ(), grpcEnv...), "GRPC_XDS_BOOTSTRAP="+bootstrapPath)
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
