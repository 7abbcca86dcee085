package chart_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// shardLabel is the label that keeps each shard's pods to its own
// Deployment, Service and PodDisruptionBudget, and countLabel the one that
// keeps a slot's Service to the pods of the current shard count.
const (
	shardLabel = "scopeplane.dev/shard"
	countLabel = "scopeplane.dev/shards"
)

// checkShards checks a render with sharding.shards = shards and
// sharding.slots = slots: for each shard K, a Deployment, a metrics
// Service and (with more than one replica) a PodDisruptionBudget named
// <fullname>-shard-K, no unsharded Deployment or budget; for each slot I,
// an xDS Service (slot 0's named <fullname>, the unsharded Service's name,
// slot I's <fullname>-slot-I) that selects the pods of shard I mod shards
// of this count and no other's; each Deployment runs --shard=K
// --shards=N with leader election and the same list of every slot
// Service's address in slot order; each Deployment, shard Service and
// budget selects its own shard's pods and no other's; and the shared
// objects (NetworkPolicy, ServiceMonitor, cert-manager Certificate, when
// rendered) cover every shard and every slot.
func checkShards(t *testing.T, objs []*unstructured.Unstructured, fullname string, shards, slots int) {
	t.Helper()
	for _, kind := range []string{"Deployment", "PodDisruptionBudget"} {
		if o := findNamedOptional(objs, kind, fullname); o != nil {
			t.Errorf("with %d shards the unsharded %s %s must not be rendered", shards, kind, fullname)
		}
	}
	var (
		deployments, services, slotServices []*unstructured.Unstructured
		podLabels, otherCount               []map[string]string
		want                                []string
	)
	for k := range shards {
		name := fmt.Sprintf("%s-shard-%d", fullname, k)
		d := findNamed(t, objs, "Deployment", name)
		svc := findNamed(t, objs, "Service", name)
		deployments, services = append(deployments, d), append(services, svc)
		labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		podLabels = append(podLabels, labels)
		if got := labels[shardLabel]; got != fmt.Sprint(k) {
			t.Errorf("Deployment %s: its pods' %s label is %q, want %q", name, shardLabel, got, fmt.Sprint(k))
		}
		if got := labels[countLabel]; got != fmt.Sprint(shards) {
			t.Errorf("Deployment %s: its pods' %s label is %q, want %q", name, countLabel, got, fmt.Sprint(shards))
		}
		// The same shard's pods of another count, as a rollout runs them.
		other := map[string]string{}
		for key, v := range labels {
			other[key] = v
		}
		other[countLabel] = fmt.Sprint(shards + 1)
		otherCount = append(otherCount, other)
		if _, ok := servicePort(svc, "xds"); ok {
			t.Errorf("shard Service %s has an xDS port: proxies reach the slots' Services, which the serving certificate names", name)
		}
	}
	for i := range slots {
		name := fmt.Sprintf("%s-slot-%d", fullname, i)
		if i == 0 {
			name = fullname
		}
		svc := findNamed(t, objs, "Service", name)
		slotServices = append(slotServices, svc)
		port, ok := servicePort(svc, "xds")
		if !ok {
			t.Fatalf("slot Service %s has no port named xds", name)
		}
		want = append(want, fmt.Sprintf("%s.%s.svc:%d", name, svc.GetNamespace(), port))
	}
	if got := countKind(objs, "Deployment"); got != shards {
		t.Errorf("%d Deployments rendered, want one per shard (%d)", got, shards)
	}
	if got := countKind(objs, "Service"); got != shards+slots {
		t.Errorf("%d Services rendered, want one per shard and one per slot (%d)", got, shards+slots)
	}

	// selectsOnly checks that the selector at path (maps and list indexes)
	// of o selects the pods of shard k and of no other shard.
	selectsOnly := func(o *unstructured.Unstructured, k int, path ...string) map[string]string {
		t.Helper()
		raw, _ := field(o.Object, path...)
		m, _ := raw.(map[string]any)
		selector := map[string]string{}
		for key, v := range m {
			selector[key] = fmt.Sprint(v)
		}
		if len(selector) == 0 {
			t.Errorf("%s %s has no %s", o.GetKind(), o.GetName(), strings.Join(path, "."))
			return nil
		}
		for j, labels := range podLabels {
			if got := selects(selector, labels); got != (j == k) {
				t.Errorf("%s %s: %s %v selects shard %d's pods: %v, want %v", o.GetKind(), o.GetName(), strings.Join(path, "."), selector, j, got, j == k)
			}
		}
		return selector
	}
	for k, d := range deployments {
		args := containerArgs(t, []*unstructured.Unstructured{d})
		wantArgs(t, args, fmt.Sprintf("--shard=%d", k), fmt.Sprintf("--shards=%d", shards), "--leader-elect")
		var addresses []string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--xds-server-address="); ok {
				addresses = append(addresses, v)
			}
		}
		if len(addresses) != 1 {
			t.Errorf("Deployment %s passes --xds-server-address %d times, want once", d.GetName(), len(addresses))
		} else if diff := cmp.Diff(want, strings.Split(addresses[0], ",")); diff != "" {
			t.Errorf("Deployment %s: --xds-server-address is not every slot Service's address in slot order (-want +got):\n%s", d.GetName(), diff)
		}
		selectsOnly(d, k, "spec", "selector", "matchLabels")
		selectsOnly(services[k], k, "spec", "selector")
		if pdb := findNamedOptional(objs, "PodDisruptionBudget", d.GetName()); pdb != nil {
			selectsOnly(pdb, k, "spec", "selector", "matchLabels")
		} else if replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); replicas > 1 {
			t.Errorf("shard %d has %d replicas and no PodDisruptionBudget %s", k, replicas, d.GetName())
		}
		constraints, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "topologySpreadConstraints")
		for i := range constraints {
			selectsOnly(d, k, "spec", "template", "spec", "topologySpreadConstraints", fmt.Sprint(i), "labelSelector", "matchLabels")
		}
	}
	for i, svc := range slotServices {
		selector := selectsOnly(svc, i%shards, "spec", "selector")
		if selector != nil && selects(selector, otherCount[i%shards]) {
			t.Errorf("slot Service %s selects the pods of shard %d of another count: %v", svc.GetName(), i%shards, selector)
		}
	}

	// The shared objects cover every shard.
	if np := findOptional(objs, "NetworkPolicy"); np != nil {
		selector, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
		for k, labels := range podLabels {
			if len(selector) == 0 || !selects(selector, labels) {
				t.Errorf("the NetworkPolicy's podSelector %v does not select shard %d's pods, so their xDS port is not admitted", selector, k)
			}
		}
	}
	if sm := findOptional(objs, "ServiceMonitor"); sm != nil {
		selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		for _, svc := range services {
			if len(selector) == 0 || !selects(selector, svc.GetLabels()) {
				t.Errorf("the ServiceMonitor's selector %v does not find Service %s", selector, svc.GetName())
			}
			if _, ok := servicePort(svc, "metrics"); !ok {
				t.Errorf("Service %s has no port named metrics for the ServiceMonitor", svc.GetName())
			}
		}
		// A slot's Service has no metrics port: the ServiceMonitor
		// scrapes each pod once, through its shard's Service.
		for _, svc := range slotServices {
			if _, ok := servicePort(svc, "metrics"); ok {
				t.Errorf("slot Service %s has a metrics port: the ServiceMonitor would scrape its shard's pods again", svc.GetName())
			}
		}
	}
	if c := findOptional(objs, "Certificate"); c != nil {
		names, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "dnsNames")
		var wantNames []string
		for _, svc := range slotServices {
			n, ns := svc.GetName(), svc.GetNamespace()
			wantNames = append(wantNames, n, n+"."+ns, n+"."+ns+".svc", n+"."+ns+".svc.cluster.local")
		}
		if diff := cmp.Diff(wantNames, names); diff != "" {
			t.Errorf("the Certificate does not name every slot Service (-want +got):\n%s", diff)
		}
	}
}

// selects reports whether a matchLabels selector selects an object with labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if l, ok := labels[k]; !ok || l != v {
			return false
		}
	}
	return true
}

// servicePort is the port number of svc's port named name.
func servicePort(svc *unstructured.Unstructured, name string) (int64, bool) {
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	for _, p := range ports {
		p, _ := p.(map[string]any)
		if p["name"] == name {
			switch n := p["port"].(type) {
			case int64:
				return n, true
			case float64: // as JSON decodes numbers
				return int64(n), float64(int64(n)) == n
			}
			return 0, false
		}
	}
	return 0, false
}

func countKind(objs []*unstructured.Unstructured, kind string) int {
	n := 0
	for _, o := range objs {
		if o.GetKind() == kind {
			n++
		}
	}
	return n
}

// TestShardsOfOne checks that sharding.shards=1 renders exactly what the
// chart renders without it, and the case's golden file, for every render
// case that does not set it.
func TestShardsOfOne(t *testing.T) {
	for _, c := range renderCases {
		if c.name == "sharded" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template"}, c.helmArgs(t, chartDir)...)
			out, stderr, err := runHelm(t, append(args, "--set", "sharding.shards=1")...)
			if err != nil {
				t.Fatalf("helm template --set sharding.shards=1: %v\n%s", err, stderr)
			}
			if diff := cmp.Diff(c.render(t), out); diff != "" {
				t.Errorf("sharding.shards=1 renders differently from leaving it unset (-unset +1):\n%s", diff)
			}
			golden := filepath.Join("testdata", c.name+".golden.yaml")
			if diff := cmp.Diff(string(mustRead(t, golden)), withoutGeneratedCRDs(withoutGeneratedRules(out))); diff != "" {
				t.Errorf("sharding.shards=1 renders differently from %s (-golden +1):\n%s", golden, diff)
			}
		})
	}
}

// TestShardsElectEvenWithOneReplica checks that every shard elects its own
// leader even with one replica each (and, with one replica, gets no
// PodDisruptionBudget), and that the leader election Role is rendered.
func TestShardsElectEvenWithOneReplica(t *testing.T) {
	out, stderr, err := runHelm(t, "template", "sp", chartDir, "--namespace", "ops", "--set", "sharding.shards=2,replicas=1")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	objs := decode(t, out)
	checkShards(t, objs, "sp-scopeplane", 2, 24)
	if n := countKind(objs, "PodDisruptionBudget"); n != 0 {
		t.Errorf("shards of one replica got %d PodDisruptionBudgets, want none: they would block node drains", n)
	}
	if _, ok := rolesOf(t, []byte(out))["Role"]; !ok {
		t.Error("shards elect leaders, but the leader election Role is not rendered")
	}
}

// TestShardNamesFitServiceNames checks that a full name of 63 characters
// still gives each shard and each slot a Service name of at most 63
// characters (a DNS label), distinct per shard and slot.
func TestShardNamesFitServiceNames(t *testing.T) {
	long := strings.Repeat("a", 62) + "b"
	out, stderr, err := runHelm(t, "template", "sp", chartDir, "--set", "sharding.shards=12,sharding.slots=60,fullnameOverride="+long)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	var names []string
	for _, o := range decode(t, out) {
		if o.GetKind() == "Service" {
			names = append(names, o.GetName())
			if len(o.GetName()) > 63 {
				t.Errorf("Service %s is %d characters long, over 63", o.GetName(), len(o.GetName()))
			}
		}
	}
	if len(names) != 72 || len(slices.Compact(slices.Sorted(slices.Values(names)))) != 72 {
		t.Errorf("12 shards and 60 slots rendered %d Services, want 72 distinct: %q", len(names), names)
	}
	for _, want := range []string{strings.Repeat("a", 54) + "-shard-11", strings.Repeat("a", 55) + "-slot-59", long} {
		if !slices.Contains(names, want) {
			t.Errorf("no Service %s, the full name shortened to fit: %q", want, names)
		}
	}
}
