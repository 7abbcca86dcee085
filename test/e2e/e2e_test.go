// Package e2e runs scopeplane as a user does, on a real single-node
// Kubernetes that hack/cluster/node.sh builds on this machine: the chart
// installed with `helm install` and its defaults, the image on real Pods,
// and the quickstart's own manifests (docs/quickstart): backends whose
// EndpointSlices the endpointslice controller makes, and a proxyless gRPC
// client Pod with a kubelet-projected token counting every RPC. Everything in-process tests cannot see — the image, RBAC in practice,
// probes, the Service DNS name in the bootstraps, the projected token — is
// on this path.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/envoyprobe"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// root is the repository root, where the chart and the manifests are.
var root = filepath.Join("..", "..")

const (
	namespace = "scopeplane-system"
	release   = "scopeplane"
	// zone is the node's topology.kubernetes.io/zone.
	zone = "e2e-zone-a"
)

// quickstart is the path of one of the quickstart's manifests, the files
// docs/quickstart-kind.md shows and tells a user to apply.
func quickstart(name string) string { return filepath.Join(root, "docs", "quickstart", name) }

func TestQuickstartOnANode(t *testing.T) {
	if os.Getenv("SCOPEPLANE_E2E") == "" {
		t.Skip("needs a Kubernetes node: run `make e2e` (as root), which builds one with hack/cluster/node.sh and runs this test on it")
	}
	helm := os.Getenv("HELM")
	if helm == "" {
		t.Fatal("HELM is not set: run `make e2e`, which builds Helm with hack/helm.sh")
	}

	// Gateway API's route CRDs, as a user installs them, before the
	// operator starts: it looks for the route kinds when it starts.
	t.Log("step: Gateway API's HTTPRoute and GRPCRoute CRDs (standard channel)")
	for _, crd := range gatewayRouteCRDs(t) {
		run(t, "kubectl", "apply", "--server-side", "-f", crd)
	}

	t.Log("step: helm install with the chart's defaults")
	run(t, helm, "install", release, filepath.Join(root, "charts", "scopeplane"), "--namespace", namespace, "--create-namespace")
	run(t, "kubectl", "-n", namespace, "rollout", "status", "deploy/"+release, "--timeout=5m")
	ready := run(t, "kubectl", "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name=scopeplane",
		"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	if n := strings.Count(ready, "=True"); n != 2 {
		t.Fatalf("want both operator Pods Ready, got:\n%s", ready)
	}

	// The zone of a proxy comes from the Node its token is bound to: the
	// label is there before the client's stream starts.
	node := os.Getenv("SCOPEPLANE_E2E_NODE")
	run(t, "kubectl", "label", "node", node, "topology.kubernetes.io/zone="+zone, "--overwrite")

	t.Log("step: the quickstart's backends, their Service and a ProxylessGRPC scope")
	run(t, "kubectl", "apply", "-f", quickstart("whoami.yaml"))
	run(t, "kubectl", "wait", "--for=condition=Ready", "proxyscope/whoami", "--timeout=2m")
	run(t, "kubectl", "rollout", "status", "deploy/whoami", "--timeout=3m")

	t.Log("step: the quickstart's proxyless gRPC client Pod in the scope")
	run(t, "kubectl", "apply", "-f", quickstart("whoami-client.yaml"))
	if _, err := kubectl("wait", "--for=condition=Ready", "pod/whoami-client", "--timeout=3m"); err != nil {
		logs, _ := kubectl("logs", "whoami-client", "--tail=20")
		t.Fatalf("the client Pod is not Ready (no RPC went through the scope): %v\n%s", err, logs)
	}
	ip := strings.TrimSpace(run(t, "kubectl", "get", "pod", "whoami-client", "-o", "jsonpath={.status.podIP}"))
	c := client{url: "http://" + ip + ":8080/counts"}
	backends := podNames(t, "app=whoami")
	first := c.waitFor(t, "RPCs reach both backends", func(n counts) bool { return n.reached(backends) })
	t.Logf("counts: %s", first)
	t.Logf("the node:\n%s", run(t, "kubectl", "get", "nodes,pods", "-A", "-o", "wide"))
	t.Logf("the scope:\n%s", run(t, "kubectl", "get", "proxyscope", "whoami", "-o", "wide"))
	if first.Failed != 0 {
		t.Errorf("%d RPCs failed before the client had served one (last: %s)", first.Failed, first.LastError)
	}

	t.Log("step: kubectl scopeplane proxy-status places the client in its Node's zone")
	// Through the API server: the plugin port-forwards to each replica.
	status := run(t, "kubectl", "scopeplane", "proxy-status", "default/whoami")
	t.Logf("proxy-status:\n%s", status)
	want := zone + " (node " + node + ")"
	if !strings.Contains(status, "whoami-grpc") || !strings.Contains(status, want) {
		t.Errorf("proxy-status does not list whoami-grpc in %q, the zone of the Node its token is bound to", want)
	}

	t.Log("step: the quickstart's Envoy Pod, envoy-probe in Envoy's place, joins the storefront scope")
	run(t, "kubectl", "label", "service", "whoami", "app.kubernetes.io/part-of=storefront")
	run(t, "kubectl", "apply", "-f", filepath.Join(root, "config", "samples", "xds_v1alpha1_proxyscope_envoy_sotw.yaml"))
	run(t, "kubectl", "wait", "--for=condition=Ready", "proxyscope/storefront", "--timeout=2m")
	applyEnvoyProbe(t)
	if _, err := kubectl("wait", "--for=condition=Ready", "pod/envoy", "--timeout=3m"); err != nil {
		logs, _ := kubectl("logs", "envoy", "--tail=20")
		t.Fatalf("the probe in the Envoy Pod did not join the scope with the Envoy bootstrap: %v\n%s", err, logs)
	}
	probeIP := strings.TrimSpace(run(t, "kubectl", "get", "pod", "envoy", "-o", "jsonpath={.status.podIP}"))
	envoy := probe{url: "http://" + probeIP + ":8080/status"}
	joined := envoy.waitFor(t, "the probe holds whoami's endpoints", func(s envoyprobe.Status) bool { return s.Synced && holds(s, backendIPs(t)) })
	t.Logf("envoy-probe: %s", describe(joined))

	t.Log("step: scale the backend to 3")
	before := c.get(t)
	run(t, "kubectl", "scale", "deploy/whoami", "--replicas=3")
	run(t, "kubectl", "rollout", "status", "deploy/whoami", "--timeout=3m")
	backends = podNames(t, "app=whoami")
	after := c.waitFor(t, "RPCs reach all three backends", func(n counts) bool { return n.reachedSince(before, backends) })
	c.noFailures(t, "scaling", before, after)

	t.Log("step: a canary with a mesh route (docs/quickstart/canary-v2.yaml, canary-route.yaml), then the route deleted")
	run(t, "kubectl", "apply", "-f", quickstart("canary-v2.yaml"))
	run(t, "kubectl", "rollout", "status", "deploy/whoami-v2", "--timeout=3m")
	before = c.get(t)
	run(t, "kubectl", "apply", "-f", quickstart("canary-route.yaml"))
	canary := podNames(t, "app=whoami-v2")
	after = c.waitFor(t, "RPCs reach the canary", func(n counts) bool { return n.reachedSince(before, append(canary, backends...)) })
	c.noFailures(t, "the canary", before, after)
	t.Logf("counts: %s", after)
	const split = "default/whoami:50051=50 default/whoami-v2:50051=50"
	routed := envoy.waitFor(t, "the probe holds the canary's weighted route", func(s envoyprobe.Status) bool {
		return slices.Contains(s.Routes["http-10080/whoami.default:50051"], split) && holds(s, backendIPs(t))
	})
	t.Logf("envoy-probe: routes of whoami %v", routed.Routes["http-10080/whoami.default:50051"])
	if routed.NACKs != 0 {
		t.Errorf("the probe, which validates what it gets as Envoy does, rejected %d responses", routed.NACKs)
	}
	testkit.EventuallyWithin(t, 2*time.Minute, "the route Accepted with its references resolved by scopeplane", func() (bool, string) {
		const ours = `.status.parents[?(@.controllerName=="scopeplane.dev/mesh")]`
		out, _ := kubectl("get", "httproute", "whoami-canary", "-o",
			`jsonpath={`+ours+`.conditions[?(@.type=="Accepted")].status} {`+ours+`.conditions[?(@.type=="ResolvedRefs")].status}`)
		return strings.TrimSpace(out) == "True True", out
	})
	before = c.get(t)
	run(t, "kubectl", "delete", "httproute", "whoami-canary")
	after = c.waitFor(t, "RPCs go on after the route left", func(n counts) bool { return n.OK > before.OK+200 })
	c.noFailures(t, "the route's deletion", before, after)
	run(t, "kubectl", "delete", "deploy/whoami-v2", "svc/whoami-v2")

	t.Log("step: a backend rollout")
	rolloutBackends(t, c, c.get(t), "the rollout")

	t.Log("step: delete the leader Pod")
	before = c.get(t)
	leader := leaderPod(t)
	run(t, "kubectl", "-n", namespace, "delete", "pod", leader, "--wait=false")
	testkit.EventuallyWithin(t, 3*time.Minute, "another replica takes the Lease from "+leader, func() (bool, string) {
		next := leaderPod(t)
		return next != leader && next != "", "held by " + next
	})
	t.Logf("the Lease moved from %s to %s", leader, leaderPod(t))
	run(t, "kubectl", "-n", namespace, "rollout", "status", "deploy/"+release, "--timeout=5m")
	run(t, "kubectl", "wait", "--for=condition=Ready", "proxyscope/whoami", "--timeout=2m")
	after = c.waitFor(t, "RPCs go on after the leader left", func(n counts) bool { return n.OK > before.OK+200 })
	c.noFailures(t, "the leader's deletion", before, after)

	t.Log("step: helm upgrade with a changed value rolls both replicas")
	before = c.get(t)
	old := podNames(t, "app.kubernetes.io/name=scopeplane")
	run(t, helm, "upgrade", release, filepath.Join(root, "charts", "scopeplane"), "--namespace", namespace,
		"--set", "podAnnotations.e2e-upgrade=one")
	run(t, "kubectl", "-n", namespace, "rollout", "status", "deploy/"+release, "--timeout=5m")
	waitPodsIn(t, namespace, "app.kubernetes.io/name=scopeplane", 2)
	for _, p := range podNamesIn(t, namespace, "app.kubernetes.io/name=scopeplane") {
		for _, o := range old {
			if p == o {
				t.Fatalf("helm upgrade left the Pod %s in place", p)
			}
		}
	}
	run(t, "kubectl", "wait", "--for=condition=Ready", "proxyscope/whoami", "--timeout=2m")
	after = c.waitFor(t, "RPCs go on after the upgrade", func(n counts) bool { return n.OK > before.OK+200 })
	c.noFailures(t, "helm upgrade", before, after)
	t.Logf("counts: %s", after)
	// Both replicas were replaced: the probe's stream ended and it
	// reconnected, as Envoy does, holding the backends of the rollout, and
	// the replica it reached counts it synced on every type it serves it.
	rejoined := envoy.waitFor(t, "the probe reconnected and holds whoami's endpoints", func(s envoyprobe.Status) bool {
		return s.Synced && s.Streams > joined.Streams && holds(s, backendIPs(t))
	})
	t.Logf("envoy-probe: %s", describe(rejoined))
	testkit.EventuallyWithin(t, 2*time.Minute, "proxy-status counts the reconnected probe synced", func() (bool, string) {
		out, _ := kubectl("scopeplane", "proxy-status", "default/storefront")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "envoy" {
				synced := 0 // of CDS, EDS, LDS and RDS; SotW sends no VHDS
				for _, cell := range f {
					if cell == "SYNCED" {
						synced++
					}
				}
				return synced == 4, out
			}
		}
		return false, out
	})
	if rejoined.NACKs != 0 {
		t.Errorf("the probe, which validates what it gets as Envoy does, rejected %d responses", rejoined.NACKs)
	}

	shardingSteps(t, helm, c)

	t.Log("step: helm uninstall")
	out := run(t, helm, "uninstall", release, "--namespace", namespace, "--wait")
	t.Logf("helm uninstall: %s", strings.TrimSpace(out))
	if left := run(t, "kubectl", "-n", namespace, "get", "deploy,svc,sa,role,rolebinding", "-l", "app.kubernetes.io/instance="+release, "-o", "name"); strings.TrimSpace(left) != "" {
		t.Errorf("helm uninstall left the chart's objects:\n%s", left)
	}
	// The chart creates the CA Secret (empty, the leader fills it), so the
	// CA's private key goes with the release rather than outliving it.
	if out, err := kubectl("-n", namespace, "get", "secret", release+"-xds-tls", "-o", "name"); err == nil {
		t.Errorf("helm uninstall left the CA Secret with its private key: %s", strings.TrimSpace(out))
	}
	if _, err := kubectl("get", "crd", "proxyscopes.xds.scopeplane.dev"); err != nil {
		t.Errorf("helm uninstall removed the ProxyScope CRD, which the chart keeps: %v", err)
	}
}

// applyEnvoyProbe applies the quickstart's Envoy Pod with its container
// running envoy-probe from the quickstart's workload image, with Envoy's
// arguments, instead of Envoy: the mounts and volumes are the file's.
func applyEnvoyProbe(t *testing.T) {
	t.Helper()
	var envoy, client corev1.Pod
	for file, pod := range map[string]*corev1.Pod{"envoy.yaml": &envoy, "whoami-client.yaml": &client} {
		raw, err := os.ReadFile(quickstart(file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(raw, pod); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	c := &envoy.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = client.Spec.Containers[0].Image, corev1.PullIfNotPresent
	c.Args = append([]string{"envoy-probe"}, c.Args...)
	c.Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	c.ReadinessProbe = &corev1.Probe{PeriodSeconds: 2, ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8080)}}}
	out, err := yaml.Marshal(&envoy)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Stdin = bytes.NewReader(out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply of the Envoy Pod with envoy-probe: %v\n%s", err, b)
	}
}

// backendIPs are the addresses of the whoami Pods that run and are not
// terminating.
func backendIPs(t *testing.T) []string {
	t.Helper()
	out := run(t, "kubectl", "get", "pods", "-l", "app=whoami", "-o",
		`jsonpath={range .items[?(@.status.phase=="Running")]}{.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}`)
	var ips []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 1 {
			ips = append(ips, f[0])
		}
	}
	return ips
}

// describe is what the test logs of envoy-probe's status.
func describe(s envoyprobe.Status) string {
	return fmt.Sprintf("streams=%d synced=%v nacks=%d held=%v endpoints=%v lastError=%q",
		s.Streams, s.Synced, s.NACKs, s.Held, s.Endpoints, s.LastError)
}

// holds says whether whoami's ClusterLoadAssignment holds exactly ips.
func holds(s envoyprobe.Status, ips []string) bool {
	for name, got := range s.Endpoints {
		if strings.Contains(name, "whoami") {
			return len(ips) > 0 && slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(ips)))
		}
	}
	return false
}

// probe reads envoy-probe's status over the node's Pod network.
type probe struct{ url string }

func (p probe) waitFor(t *testing.T, what string, ok func(envoyprobe.Status) bool) envoyprobe.Status {
	t.Helper()
	var s envoyprobe.Status
	testkit.EventuallyWithin(t, 2*time.Minute, what, func() (bool, string) {
		resp, err := http.Get(p.url)
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		s = envoyprobe.Status{}
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			return false, err.Error()
		}
		return ok(s), describe(s)
	})
	return s
}

// leaderPod is the Pod that holds the leader election Lease, "" if none.
func leaderPod(t *testing.T) string {
	t.Helper()
	holder, err := kubectl("-n", namespace, "get", "lease", "scopeplane.xds.scopeplane.dev", "-o", "jsonpath={.spec.holderIdentity}")
	if err != nil {
		return ""
	}
	// client-go's identity is the hostname (the Pod's name), "_", a UUID.
	name, _, _ := strings.Cut(strings.TrimSpace(holder), "_")
	return name
}

// run runs a command and fails the test, with its output, when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := command(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func kubectl(args ...string) (string, error) { return command("kubectl", args...) }

func command(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// podNames lists the names of the running, not terminating, Pods of a label selector.
func podNames(t *testing.T, selector string) []string {
	t.Helper()
	return podNamesIn(t, "default", selector)
}

func podNamesIn(t *testing.T, ns, selector string) []string {
	t.Helper()
	out := run(t, "kubectl", "-n", ns, "get", "pods", "-l", selector, "-o",
		`jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}`)
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 1 {
			names = append(names, f[0])
		}
	}
	return names
}

// waitPods waits until exactly n Pods of the selector exist: a rollout's
// old Pods are gone.
func waitPods(t *testing.T, selector string, n int) {
	t.Helper()
	waitPodsIn(t, "default", selector, n)
}

func waitPodsIn(t *testing.T, ns, selector string, n int) {
	t.Helper()
	testkit.EventuallyWithin(t, 3*time.Minute, fmt.Sprintf("%d Pods of %s", n, selector), func() (bool, string) {
		out := run(t, "kubectl", "-n", ns, "get", "pods", "-l", selector, "-o", "name")
		return len(strings.Fields(out)) == n, out
	})
}

// counts is the client Pod's /counts.
type counts struct {
	OK        int64            `json:"ok"`
	Failed    int64            `json:"failed"`
	ByBackend map[string]int64 `json:"byBackend"`
	LastError string           `json:"lastError"`
	ByError   map[string]int64 `json:"byError"`
}

func (n counts) String() string {
	return fmt.Sprintf("ok=%d failed=%d byBackend=%v", n.OK, n.Failed, n.ByBackend)
}

// reached says whether every one of backends answered.
func (n counts) reached(backends []string) bool { return n.reachedSince(counts{}, backends) }

// reachedSince says whether every one of backends answered after before.
func (n counts) reachedSince(before counts, backends []string) bool {
	if len(backends) == 0 {
		return false
	}
	for _, b := range backends {
		if n.ByBackend[b] <= before.ByBackend[b] {
			return false
		}
	}
	return true
}

// client reads the client Pod's counts over the node's Pod network.
type client struct{ url string }

func (c client) get(t *testing.T) counts {
	t.Helper()
	resp, err := http.Get(c.url)
	if err != nil {
		t.Fatalf("reading the client's counts: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var n counts
	if err := json.NewDecoder(resp.Body).Decode(&n); err != nil {
		t.Fatalf("decoding the client's counts: %v", err)
	}
	return n
}

// waitFor polls the counts until ok holds, for up to two minutes.
func (c client) waitFor(t *testing.T, what string, ok func(counts) bool) counts {
	t.Helper()
	var n counts
	testkit.EventuallyWithin(t, 2*time.Minute, what, func() (bool, string) {
		n = c.get(t)
		return ok(n), fmt.Sprintf("counts: %s (last error: %s)", n, n.LastError)
	})
	return n
}

// noFailures fails the test when any RPC between before and after failed.
func (c client) noFailures(t *testing.T, during string, before, after counts) {
	t.Helper()
	if d := after.Failed - before.Failed; d != 0 {
		byError := map[string]int64{}
		for msg, n := range after.ByError {
			if n -= before.ByError[msg]; n > 0 {
				byError[msg] = n
			}
		}
		t.Errorf("%d of %d RPCs failed during %s: %v", d, after.OK+after.Failed-before.OK-before.Failed, during, byError)
	} else {
		t.Logf("%s: %d RPCs, none failed", during, after.OK-before.OK)
	}
}

// gatewayRouteCRDs are the HTTPRoute and GRPCRoute CRDs of Gateway API's
// standard channel, from the sigs.k8s.io/gateway-api module go.mod
// requires: the version whose types scopeplane is built with.
func gatewayRouteCRDs(t *testing.T) []string {
	t.Helper()
	dir := strings.TrimSpace(run(t, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api"))
	var out []string
	for _, kind := range []string{"httproutes", "grpcroutes"} {
		out = append(out, filepath.Join(dir, "config", "crd", "standard", "gateway.networking.k8s.io_"+kind+".yaml"))
	}
	return out
}

// shardingSteps turns sharding on under the quickstart and changes the
// shard count, as docs/sharding.md tells a user to expect on a real node,
// where each slot's Service is kube-proxy's. Turned on (two shards of one
// replica each, six slots), the whoami client keeps calling with what it
// holds (its bootstrap predates sharding, so it gets no update from then
// on, and is not checked after). A scope like whoami's, named so that its
// slot's shard differs between two and three shards, gets a client of its
// own on its slot's bootstrap. Then
// three shards of the same slots: that scope moves to another shard at
// the same address, its bootstrap stays, and its running client
// reconnects through the slot's Service to the new shard and follows a
// backend rollout, with no RPC failed and no restart. Last, that shard
// scaled to zero and back: the scope says ShardAbsent meanwhile.
func shardingSteps(t *testing.T, helm string, whoami client) {
	t.Helper()
	const slots = 6
	var addrs []string
	for i := range slots {
		name := release
		if i > 0 {
			name = fmt.Sprintf("%s-slot-%d", release, i)
		}
		addrs = append(addrs, fmt.Sprintf("%s.%s.svc:18000", name, namespace))
	}
	two, three := shard.Shards{N: 2, Addresses: addrs}, shard.Shards{N: 3, Addresses: addrs}
	var key model.Key
	for i := 0; key.Name == ""; i++ {
		// A scope that moves, to a shard other than 0, which the last
		// step stops.
		if k := (model.Key{Namespace: "default", Name: fmt.Sprintf("moving-%d", i)}); two.ShardOf(k) != three.ShardOf(k) && three.ShardOf(k) != 0 {
			key = k
		}
	}
	addr := two.AddressOf(key)
	upgrade := func(shards int) {
		t.Helper()
		run(t, helm, "upgrade", release, filepath.Join(root, "charts", "scopeplane"), "--namespace", namespace,
			"--set", fmt.Sprintf("sharding.shards=%d,sharding.slots=%d,replicas=1", shards, slots))
		for k := range shards {
			run(t, "kubectl", "-n", namespace, "rollout", "status", fmt.Sprintf("deploy/%s-shard-%d", release, k), "--timeout=5m")
		}
		waitPodsIn(t, namespace, "app.kubernetes.io/name=scopeplane", shards)
	}
	bootstrapOf := func() string {
		return run(t, "kubectl", "get", "configmap", bootstrap.ConfigMapName(key.Name), "-o", "jsonpath={.data."+strings.ReplaceAll(bootstrap.GRPCKey, ".", `\.`)+"}")
	}

	t.Logf("step: sharding turned on, two shards of %d slots: the whoami client keeps calling", slots)
	before := whoami.get(t)
	upgrade(2)
	after := whoami.waitFor(t, "the whoami client's RPCs go on", func(n counts) bool { return n.OK > before.OK+200 })
	whoami.noFailures(t, "sharding turned on", before, after)

	t.Logf("step: scope %s, at slot %d (shard %d of two, %d of three), and a client on its bootstrap, which names %s",
		key, two.SlotOf(key), two.ShardOf(key), three.ShardOf(key), addr)
	applyMoving(t, key.Name)
	run(t, "kubectl", "wait", "--for=condition=Ready", "proxyscope/"+key.Name, "--timeout=2m")
	testkit.EventuallyWithin(t, 2*time.Minute, key.Name+"'s bootstrap names its slot's Service", func() (bool, string) {
		b := bootstrapOf()
		return strings.Contains(b, strconv.Quote(addr)), b
	})
	pod := key.Name + "-client"
	if _, err := kubectl("wait", "--for=condition=Ready", "pod/"+pod, "--timeout=3m"); err != nil {
		logs, _ := kubectl("logs", pod, "--tail=20")
		t.Fatalf("the client on %s's bootstrap is not Ready: %v\n%s", key.Name, err, logs)
	}
	ip := strings.TrimSpace(run(t, "kubectl", "get", "pod", pod, "-o", "jsonpath={.status.podIP}"))
	c := client{url: "http://" + ip + ":8080/counts"}
	backends := podNames(t, "app=whoami")
	joined := c.waitFor(t, "RPCs reach every backend through the slot", func(n counts) bool { return n.reached(backends) })
	c.noFailures(t, "joining a slot", counts{}, joined)

	t.Logf("step: three shards of the same slots: %s moves to shard %d at the same address, and its running client follows a backend rollout without a restart", key, three.ShardOf(key))
	boot := bootstrapOf()
	before = c.get(t)
	upgrade(3)
	// The client reconnects, with backoff, once the replica that held its
	// stream stopped and the slot's new shard is Ready; it holds what it
	// had meanwhile, so its RPCs go on, but a change of the backends before
	// it is back would reach it only then.
	owner := fmt.Sprintf(" %s-shard-%d-", release, three.ShardOf(key))
	upgraded := time.Now()
	testkit.EventuallyWithin(t, 3*time.Minute, "the client back on a replica of shard "+fmt.Sprint(three.ShardOf(key)), func() (bool, string) {
		out, _ := kubectl("scopeplane", "proxy-status", key.String())
		return strings.Contains(out, owner) && strings.Count(out, "SYNCED") >= 4, out
	})
	t.Logf("the client was back on shard %d %v after the upgrade's rollouts ended", three.ShardOf(key), time.Since(upgraded).Round(time.Second))
	after = c.waitFor(t, "RPCs go on", func(n counts) bool { return n.OK > before.OK+200 })
	c.noFailures(t, "the shard count's change", before, after)
	t.Logf("counts: %s", rolloutBackends(t, c, c.get(t), "a backend rollout after it"))
	if b := bootstrapOf(); b != boot {
		t.Errorf("%s's bootstrap changed with the shard count:\n%s\nthen\n%s", key.Name, boot, b)
	}
	if restarts := run(t, "kubectl", "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].restartCount}"); strings.TrimSpace(restarts) != "0" {
		t.Errorf("the client restarted %s times", restarts)
	}
	t.Logf("the scope's proxies:\n%s", run(t, "kubectl", "scopeplane", "proxy-status", key.String()))

	// With every replica of its shard gone, the scope says so (shard 0's
	// leader reads the shard's Lease), and its running client keeps
	// calling the backends it holds; once the shard is back, its leader
	// writes the status anew and the client follows it again.
	k := three.ShardOf(key)
	deploy := fmt.Sprintf("deploy/%s-shard-%d", release, k)
	reason := func() string {
		out, _ := kubectl("get", "proxyscope", key.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].reason}`)
		return strings.TrimSpace(out)
	}
	t.Logf("step: shard %d scaled to zero: %s says ShardAbsent; scaled back, its leader writes the status again", k, key)
	before = c.get(t)
	run(t, "kubectl", "-n", namespace, "scale", deploy, "--replicas=0")
	scaled := time.Now()
	testkit.EventuallyWithin(t, 3*time.Minute, key.Name+" Ready=False, ShardAbsent", func() (bool, string) {
		r := reason()
		return r == xdsv1alpha1.ReasonShardAbsent, r
	})
	t.Logf("%s was marked %v after the scale-down: %s", key.Name, time.Since(scaled).Round(time.Second),
		run(t, "kubectl", "get", "proxyscope", key.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`))
	run(t, "kubectl", "-n", namespace, "scale", deploy, "--replicas=1")
	run(t, "kubectl", "-n", namespace, "rollout", "status", deploy, "--timeout=5m")
	testkit.EventuallyWithin(t, 3*time.Minute, key.Name+"'s status written by its shard's leader again", func() (bool, string) {
		r := reason()
		return r != "" && r != xdsv1alpha1.ReasonShardAbsent, r
	})
	after = c.waitFor(t, "RPCs go on", func(n counts) bool { return n.OK > before.OK+200 })
	c.noFailures(t, "the shard's absence", before, after)
}

// rolloutBackends restarts the whoami backends and waits until c's RPCs,
// counted from before, reach every new one, with none failed during what
// the step says; it returns the counts then.
func rolloutBackends(t *testing.T, c client, before counts, during string) counts {
	t.Helper()
	run(t, "kubectl", "rollout", "restart", "deploy/whoami")
	run(t, "kubectl", "rollout", "status", "deploy/whoami", "--timeout=5m")
	waitPods(t, "app=whoami", 3)
	backends := podNames(t, "app=whoami")
	after := c.waitFor(t, "RPCs reach the new backends", func(n counts) bool { return n.reachedSince(before, backends) })
	c.noFailures(t, during, before, after)
	return after
}

// applyMoving applies the quickstart's whoami ProxyScope under name, and
// the quickstart's client Pod as <name>-client, mounting that scope's
// bootstrap ConfigMap.
func applyMoving(t *testing.T, name string) {
	t.Helper()
	raw, err := os.ReadFile(quickstart("whoami.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var scope map[string]any
	for _, doc := range strings.Split(string(raw), "\n---") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err == nil && o["kind"] == "ProxyScope" {
			scope = o
		}
	}
	if scope == nil {
		t.Fatal("whoami.yaml has no ProxyScope")
	}
	scope["metadata"] = map[string]any{"name": name, "namespace": "default"}
	var pod corev1.Pod
	if raw, err = os.ReadFile(quickstart("whoami-client.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Name = name + "-client"
	for i := range pod.Spec.Volumes {
		if cm := pod.Spec.Volumes[i].ConfigMap; cm != nil {
			cm.Name = bootstrap.ConfigMapName(name)
		}
	}
	for _, o := range []any{scope, &pod} {
		out, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("kubectl", "apply", "-f", "-")
		cmd.Stdin = bytes.NewReader(out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl apply of %s's scope and client: %v\n%s", name, err, b)
		}
	}
}
