// Package chart_test tests the Helm chart in charts/scopeplane with the pinned
// Helm that hack/helm.sh builds (its path in $HELM, set by `make test`):
// helm lint, golden renders of several value sets, schema refusals, the RBAC
// and CRDs copied from the controller-gen output, the values reference in
// docs/install.md, and (dryrun_test.go) every rendered object applied with a
// server-side dry run to a real kube-apiserver.
package chart_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from helm template and the values reference of docs/install.md and the chart README from values.yaml")

// chartDir is the chart under test.
var chartDir = filepath.Join(localapi.RepoRoot(), "charts", "scopeplane")

// renderCase is one value set: testdata/<name>.values.yaml (optional) is
// rendered as release <release> in <namespace> and compared with
// testdata/<name>.golden.yaml; check asserts what the value set is for.
type renderCase struct {
	name      string
	release   string
	namespace string
	check     func(t *testing.T, objs []*unstructured.Unstructured)
}

var renderCases = []renderCase{
	{
		name: "default", release: "scopeplane", namespace: "scopeplane-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			args := containerArgs(t, objs)
			wantArgs(t, args, "--xds-server-address=scopeplane.scopeplane-system.svc:18000",
				"--metrics-bind-address=:8080", "--health-probe-bind-address=:8081", "--xds-bind-address=:18000")
			// Two replicas by default: leader election, a budget that
			// lets a drain take one of them, and a spread over zones
			// and nodes that never keeps a pod unscheduled.
			wantArgs(t, args, "--leader-elect")
			d := find(t, objs, "Deployment")
			wantString(t, d, "2", "spec", "replicas")
			wantString(t, d, "ghcr.io/scopeplane/scopeplane:0.1.0", "spec", "template", "spec", "containers", "0", "image")
			checkDefaultSpread(t, d)
			pdb := find(t, objs, "PodDisruptionBudget")
			wantString(t, pdb, "1", "spec", "maxUnavailable")
			if _, found, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable"); found {
				t.Error("the default PodDisruptionBudget sets maxUnavailable only; it has minAvailable too")
			}
			wantString(t, findNamed(t, objs, "Role", "scopeplane"), "scopeplane-system", "metadata", "namespace")
			wantArgs(t, args, "--metrics-secure=true", "--bootstrap-configmaps=true")
			wantArgs(t, args, "--xds-auth=token,peer-address", "--xds-token-audience=scopeplane")
			if slices.Contains(args, "--xds-allow-anonymous") {
				t.Error("a default install must not admit anonymous proxies")
			}
			wantArgs(t, args, "--xds-tls-secret=scopeplane-xds-tls", "--xds-tls-secret-namespace=scopeplane-system")
			checkSelfManagedTLS(t, objs, "scopeplane-xds-tls", "scopeplane-system")
			for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Certificate"} {
				if o := findOptional(objs, kind); o != nil {
					t.Errorf("the default values must not render a %s", kind)
				}
			}
			for _, o := range objs {
				if o.GetKind() == "Secret" && o.GetName() != "scopeplane-xds-tls" {
					t.Errorf("the default values must render no Secret but the xDS TLS one, not %s", o.GetName())
				}
			}
			checkMemoryLimitEnv(t, objs)
			reader := findNamed(t, objs, "ClusterRole", "scopeplane-metrics-reader")
			rules, _, _ := unstructured.NestedSlice(reader.Object, "rules")
			want := []any{map[string]any{"nonResourceURLs": []any{"/metrics"}, "verbs": []any{"get"}}}
			if diff := cmp.Diff(want, rules); diff != "" {
				t.Errorf("the metrics-reader ClusterRole must grant get on /metrics only (-want +got):\n%s", diff)
			}
		},
	},
	{
		name: "ha", release: "scopeplane", namespace: "scopeplane-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			wantArgs(t, containerArgs(t, objs), "--leader-elect")
			wantString(t, find(t, objs, "PodDisruptionBudget"), "1", "spec", "maxUnavailable")
			wantString(t, findNamed(t, objs, "Role", "scopeplane"), "scopeplane-system", "metadata", "namespace")
			checkServiceMonitor(t, objs)
			checkSecureScrape(t, objs)
			checkObservability(t, objs)
		},
	},
	{
		name: "custom", release: "edge", namespace: "mesh",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			wantArgs(t, containerArgs(t, objs), "--leader-elect", "--xds-server-address=xds.mesh.example.com:443", "--zap-log-level=debug",
				"--xds-auth=token,spiffe,peer-address", "--xds-spiffe-trust-domain=mesh.example.com", "--xds-spiffe-trust-bundle=/etc/scopeplane/spiffe/ca.crt",
				"--bootstrap-configmaps=true", "--bootstrap-configmap-namespaces=storefront,payments")
			checkBootstrapRoles(t, objs, "edge-scopeplane", "mesh", []string{"storefront", "payments"})
			d := find(t, objs, "Deployment")
			wantString(t, d, "spire-bundle", "spec", "template", "spec", "volumes", "0", "configMap", "name")
			wantString(t, d, "/etc/scopeplane/spiffe", "spec", "template", "spec", "containers", "0", "volumeMounts", "0", "mountPath")
			wantString(t, d, "edge-scopeplane", "metadata", "name")
			wantString(t, d, "2", "spec", "template", "spec", "containers", "0", "resources", "limits", "cpu")
			wantString(t, d, "registry.example.com/scopeplane:0.2.0-rc.1", "spec", "template", "spec", "containers", "0", "image")
			if o := findOptional(objs, "PodDisruptionBudget"); o != nil {
				t.Error("one replica must not get a PodDisruptionBudget: it would block node drains")
			}
			// Empty grafanaDashboard.labels leave the chart's own labels alone.
			if got, want := find(t, objs, "ConfigMap").GetLabels(), d.GetLabels(); !maps.Equal(got, want) {
				t.Errorf("the dashboard ConfigMap's labels are %v, want the chart's own %v", got, want)
			}
		},
	},
	{
		name: "locked-down", release: "scopeplane", namespace: "mesh-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			wantArgs(t, containerArgs(t, objs), "--metrics-secure=false", "--bootstrap-configmaps=false", "--cross-namespace=allow")
			checkNetworkPolicy(t, objs)
			sm := find(t, objs, "ServiceMonitor")
			wantString(t, sm, "http", "spec", "endpoints", "0", "scheme")
			if _, found, _ := unstructured.NestedFieldNoCopy(sm.Object, "spec", "endpoints", "0", "authorization"); found {
				t.Error("a plain-HTTP ServiceMonitor must not send a token")
			}
			for _, o := range objs {
				if strings.HasSuffix(o.GetName(), "-metrics-reader") || strings.HasSuffix(o.GetName(), "-metrics-scraper") || o.GetKind() == "Secret" && !strings.HasSuffix(o.GetName(), "-xds-tls") {
					t.Errorf("metrics.secure=false must not render %s %s", o.GetKind(), o.GetName())
				}
			}
			pdb := find(t, objs, "PodDisruptionBudget")
			wantString(t, pdb, "1", "spec", "minAvailable")
			if _, found, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); found {
				t.Error("minAvailable replaces maxUnavailable; the PodDisruptionBudget has both")
			}
			env := checkMemoryLimitEnv(t, objs)
			if env["GOMEMLIMIT"] != "400MiB" {
				t.Errorf("extraEnv's GOMEMLIMIT is not in the container's environment: %v", env)
			}
		},
	},
	{
		name: "cert-manager", release: "scopeplane", namespace: "scopeplane-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			wantArgs(t, containerArgs(t, objs), "--xds-tls-dir=/etc/scopeplane/tls")
			c := findNamed(t, objs, "Certificate", "scopeplane-xds-tls")
			wantString(t, c, "scopeplane-xds-tls", "spec", "secretName")
			wantString(t, c, "xds-ca", "spec", "issuerRef", "name")
			wantString(t, c, "ClusterIssuer", "spec", "issuerRef", "kind")
			names, _, _ := unstructured.NestedStringSlice(c.Object, "spec", "dnsNames")
			if want := []string{"scopeplane", "scopeplane.scopeplane-system", "scopeplane.scopeplane-system.svc", "scopeplane.scopeplane-system.svc.cluster.local"}; !slices.Equal(names, want) {
				t.Errorf("the Certificate names %q, want the Service's names %q", names, want)
			}
			d := find(t, objs, "Deployment")
			wantString(t, d, "scopeplane-xds-tls", "spec", "template", "spec", "volumes", "0", "secret", "secretName")
			wantString(t, d, "/etc/scopeplane/tls", "spec", "template", "spec", "containers", "0", "volumeMounts", "0", "mountPath")
			if r := findNamedOptional(objs, "Role", "scopeplane-xds-tls"); r != nil {
				t.Error("with cert-manager, scopeplane needs no access to Secrets")
			}
		},
	},
	{
		name: "insecure", release: "scopeplane", namespace: "scopeplane-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			args := containerArgs(t, objs)
			wantArgs(t, args, "--xds-insecure")
			for _, a := range args {
				if strings.HasPrefix(a, "--xds-tls-") {
					t.Errorf("a plaintext xDS port with TLS argument %s", a)
				}
			}
			if findOptional(objs, "Certificate") != nil || findNamedOptional(objs, "Role", "scopeplane-xds-tls") != nil {
				t.Error("a plaintext xDS port needs neither a Certificate nor the Secret's Role")
			}
		},
	},
	{
		name: "byo-serviceaccount", release: "scopeplane", namespace: "scopeplane-system",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
				if o := findOptional(objs, kind); o != nil {
					t.Errorf("serviceAccount.create=false and rbac.create=false must not render a %s", kind)
				}
			}
			wantString(t, find(t, objs, "Deployment"), "platform-scopeplane", "spec", "template", "spec", "serviceAccountName")
			pdb := find(t, objs, "PodDisruptionBudget")
			wantString(t, pdb, "50%", "spec", "maxUnavailable")
			if _, found, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "minAvailable"); found {
				t.Error("maxUnavailable replaces minAvailable; the PodDisruptionBudget has both")
			}
		},
	},
	{
		name: "sharded", release: "edge", namespace: "mesh",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkShards(t, objs, "edge-scopeplane", 3, 6)
			find(t, objs, "Certificate")
			find(t, objs, "NetworkPolicy")
			find(t, objs, "ServiceMonitor")
		},
	},
}

// checkDefaultSpread checks that the default topology spread constraints
// spread the pods over zones and then nodes, select this release's pods, and
// schedule anyway: a constraint that cannot be met must not leave a replica
// pending in a single-zone or single-node cluster.
func checkDefaultSpread(t *testing.T, d *unstructured.Unstructured) {
	t.Helper()
	constraints, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "topologySpreadConstraints")
	var keys []string
	for _, c := range constraints {
		m, _ := c.(map[string]any)
		keys = append(keys, fmt.Sprint(m["topologyKey"]))
		if m["whenUnsatisfiable"] != "ScheduleAnyway" {
			t.Errorf("default spread over %v is %v, want ScheduleAnyway", m["topologyKey"], m["whenUnsatisfiable"])
		}
		if sel, _, _ := unstructured.NestedStringMap(m, "labelSelector", "matchLabels"); sel["app.kubernetes.io/instance"] != "scopeplane" {
			t.Errorf("default spread over %v selects %v, want this release's pods", m["topologyKey"], sel)
		}
	}
	if want := []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}; !slices.Equal(keys, want) {
		t.Errorf("default spread keys are %q, want %q", keys, want)
	}
}

// helmPath is the pinned helm binary. The tests fail, rather than skip,
// without it: `make test` provides it.
func helmPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("HELM")
	if path == "" {
		t.Fatal("HELM is not set: run the tests with `make test`, or export HELM=$(hack/helm.sh)")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("HELM=%s: %v (hack/helm.sh builds it)", path, err)
	}
	return path
}

// runHelm runs helm with its config, cache and data in a temporary directory,
// so that the tests neither read nor write the user's Helm state.
func runHelm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helmPath(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// valuesFile is the values file of a case, or "" when it has none.
func (c renderCase) valuesFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join("testdata", c.name+".values.yaml")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	return path
}

// helmArgs are the arguments of helm template that render chart with the
// case's release name, namespace and values.
func (c renderCase) helmArgs(t *testing.T, chart string) []string {
	t.Helper()
	args := []string{c.release, chart, "--namespace", c.namespace}
	if f := c.valuesFile(t); f != "" {
		args = append(args, "--values", f)
	}
	return args
}

// render runs helm template for the case.
func (c renderCase) render(t *testing.T) string {
	t.Helper()
	out, stderr, err := runHelm(t, append([]string{"template"}, c.helmArgs(t, chartDir)...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	return out
}

func TestLint(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir, "--namespace", c.namespace}
			if f := c.valuesFile(t); f != "" {
				args = append(args, "--values", f)
			}
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint did not pass:\n%s", out)
			}
		})
	}
}

// TestTemplateGolden compares each case's render with its golden file
// (rewritten with -update), then runs the case's own checks. The RBAC rules
// are left out of the goldens: they are controller-gen's, and
// TestRBACFollowsGenerated compares them with config/rbac/role.yaml.
func TestTemplateGolden(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			rendered := c.render(t)
			got := withoutGeneratedCRDs(withoutGeneratedRules(rendered))
			golden := filepath.Join("testdata", c.name+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run `go test ./test/chart -update` to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("helm template differs from %s (-want +got); if the change is intended, run `go test ./test/chart -update`:\n%s", golden, diff)
			}
			c.check(t, decode(t, rendered))
		})
	}
}

// rulesPlaceholder stands for the generated rules in the goldens.
const rulesPlaceholder = "rules: [] # the rules of config/rbac/role.yaml, compared by TestRBACFollowsGenerated\n"

// crdPlaceholder stands for the generated schema of a CRD in the goldens.
const crdPlaceholder = "spec: {} # the spec of config/crd/bases, compared by TestCRDsFollowGenerated"

// withoutGeneratedCRDs replaces the spec of each rendered CRD, which comes
// verbatim from controller-gen, by crdPlaceholder; its metadata stays.
func withoutGeneratedCRDs(rendered string) string {
	docs := strings.Split(rendered, "\n---\n")
	for i, doc := range docs {
		if !strings.Contains(doc, "# Source: scopeplane/templates/crds.yaml") {
			continue
		}
		if at := strings.Index(doc, "\nspec:\n"); at >= 0 {
			docs[i] = doc[:at+1] + crdPlaceholder
		}
	}
	out := strings.Join(docs, "\n---\n")
	if strings.HasSuffix(rendered, "\n") && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// withoutGeneratedRules replaces the rules of the rendered ClusterRole and
// Role, which come verbatim from controller-gen, by rulesPlaceholder.
func withoutGeneratedRules(rendered string) string {
	docs := strings.Split(rendered, "\n---\n")
	for i, doc := range docs {
		if !strings.Contains(doc, "# Source: scopeplane/templates/rbac.yaml") {
			continue
		}
		if !strings.Contains(doc, "\nkind: ClusterRole\n") && !strings.Contains(doc, "\nkind: Role\n") {
			continue
		}
		if at := strings.Index(doc, "\nrules:\n"); at >= 0 {
			docs[i] = doc[:at+1] + strings.TrimSuffix(rulesPlaceholder, "\n")
		}
	}
	out := strings.Join(docs, "\n---\n")
	if strings.HasSuffix(rendered, "\n") && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

func TestSchemaRefusesInvalidValues(t *testing.T) {
	for _, c := range []struct {
		name, values string
		want         []string
	}{
		{"replicas as a word", `replicas: three`, []string{"at '/replicas': got string, want integer"}},
		{"negative replicas", `replicas: -1`, []string{"at '/replicas': minimum: got -1, want 0"}},
		{"misspelt key", `replica: 3`, []string{"additional properties 'replica' not allowed"}},
		{"pull policy", `image: {pullPolicy: Sometimes}`, []string{"at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"}},
		{"xds address with a scheme", `xds: {advertisedAddress: "https://xds.example.com"}`, []string{"at '/xds/advertisedAddress': 'https://xds.example.com' does not match pattern"}},
		{"port out of range", `service: {xdsPort: 70000}`, []string{"at '/service/xdsPort': maximum: got 70,000, want 65,535"}},
		{"memory", `resources: {limits: {memory: lots}}`, []string{"at '/resources/limits/memory': 'lots' does not match pattern"}},
		{"percentage without %", `podDisruptionBudget: {maxUnavailable: "50"}`, []string{"at '/podDisruptionBudget/maxUnavailable': '50' does not match pattern '^[0-9]+%$'"}},
		{"leader election as a string", `leaderElection: {enabled: "yes"}`, []string{"at '/leaderElection/enabled': got string, want boolean"}},
		{"network policy namespace not a DNS label", `networkPolicy: {xds: {namespaces: [Mesh_1]}}`, []string{"at '/networkPolicy/xds/namespaces/0': 'Mesh_1' does not match pattern"}},
		{"empty network policy peer", `networkPolicy: {xds: {from: [{}]}}`, []string{"at '/networkPolicy/xds/from/0': minProperties"}},
		{"extra env without a name", `extraEnv: [{value: "1"}]`, []string{"at '/extraEnv/0': missing property 'name'"}},
		{"metrics.secure as a string", `metrics: {secure: "no"}`, []string{"at '/metrics/secure': got string, want boolean"}},
		{"connection age without a unit", `xds: {limits: {maxConnectionAge: "30"}}`, []string{"at '/xds/limits/maxConnectionAge': '30' does not match pattern"}},
		{"unknown authentication method", `xds: {auth: {methods: kerberos}}`, []string{"at '/xds/auth/methods': 'kerberos' does not match pattern"}},
		{"no shards", `sharding: {shards: 0}`, []string{"at '/sharding/shards': minimum: got 0, want 1"}},
		{"shards as a word", `sharding: {shards: three}`, []string{"at '/sharding/shards': got string, want integer"}},
		{"more slots than certificates name well", `sharding: {slots: 100}`, []string{"at '/sharding/slots': maximum: got 100, want 64"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(c.values+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, stderr, err := runHelm(t, "template", "scopeplane", chartDir, "--values", values)
			if err == nil {
				t.Fatalf("helm template accepted %q:\n%s", c.values, out)
			}
			if !strings.Contains(stderr, "values don't meet the specifications of the schema") {
				t.Errorf("helm template failed for another reason than the schema:\n%s", stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("the error does not say %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestRefusesUselessValues checks the values the schema cannot refuse but
// the templates do, with a message that says what to set.
func TestRefusesUselessValues(t *testing.T) {
	for _, c := range []struct{ name, set, want string }{
		{"a NetworkPolicy that admits no proxy", "networkPolicy.enabled=true",
			"networkPolicy.enabled needs networkPolicy.xds.namespaces or networkPolicy.xds.from"},
		{"a secure ServiceMonitor without RBAC", "serviceMonitor.enabled=true,rbac.create=false",
			"serviceMonitor.enabled with metrics.secure needs rbac.create"},
		{"SPIFFE without a trust bundle", "xds.auth.methods=spiffe",
			"xds.auth.methods includes spiffe: set xds.auth.spiffe.trustBundleConfigMap"},
		{"one advertised address for several shards", "sharding.shards=2,xds.advertisedAddress=xds.example.com:443",
			"xds.advertisedAddress cannot be set with sharding.shards=2: one address cannot name 2 shards"},
		{"fewer slots than shards", "sharding.shards=4,sharding.slots=3",
			"sharding.slots=3 is fewer than sharding.shards=4: each shard serves at least one slot"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, err := runHelm(t, "template", "scopeplane", chartDir, "--set", c.set)
			if err == nil || !strings.Contains(stderr, c.want) {
				t.Errorf("helm template --set %s: %v, want an error saying %q:\n%s%s", c.set, err, c.want, stderr, out)
			}
		})
	}
}

// TestChartCopiesAreCurrent checks that the CRDs and the RBAC manifest in the
// chart are the ones controller-gen generated, as `make manifests` copies
// them (`make verify` catches the same from a dirty tree; this says how to
// fix it).
func TestChartCopiesAreCurrent(t *testing.T) {
	root := localapi.RepoRoot()
	sameFile(t, filepath.Join(root, "config", "rbac", "role.yaml"), filepath.Join(chartDir, "files", "role.yaml"))
	bases, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	copies, err := filepath.Glob(filepath.Join(chartDir, "files", "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	names := func(paths []string) (out []string) {
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if diff := cmp.Diff(names(bases), names(copies)); diff != "" {
		t.Errorf("charts/scopeplane/files/crds does not hold the CRDs of config/crd/bases (-want +got); run `make manifests`:\n%s", diff)
	}
	for _, b := range bases {
		sameFile(t, b, filepath.Join(chartDir, "files", "crds", filepath.Base(b)))
	}
}

func sameFile(t *testing.T, generated, copied string) {
	t.Helper()
	want, err := os.ReadFile(generated)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(copied)
	if err != nil {
		t.Errorf("%v: run `make manifests`", err)
		return
	}
	if !bytes.Equal(want, got) {
		t.Errorf("%s is not a copy of %s: run `make manifests`", copied, generated)
	}
}

// TestRBACFollowsGenerated checks that the rendered ClusterRole carries
// exactly the rules controller-gen generated, and that those rules stay
// within what scopeplane is meant to do.
func TestRBACFollowsGenerated(t *testing.T) {
	generated := rolesOf(t, mustRead(t, filepath.Join(localapi.RepoRoot(), "config", "rbac", "role.yaml")))
	if len(generated["ClusterRole"]) == 0 || len(generated["Role"]) == 0 {
		t.Fatal("config/rbac/role.yaml lacks the ClusterRole or the leader election Role")
	}
	// The default values have every rule of the ClusterRole; the Role comes
	// with leader election (the ha case).
	rendered := rolesOf(t, []byte(renderCases[0].render(t)))
	if diff := cmp.Diff(generated["ClusterRole"], rendered["ClusterRole"]); diff != "" {
		t.Errorf("the chart's ClusterRole rules differ from config/rbac/role.yaml (-generated +chart):\n%s", diff)
	}
	ha := rolesOf(t, []byte(renderCase{name: "ha", release: "scopeplane", namespace: "scopeplane-system"}.render(t)))
	if diff := cmp.Diff(generated["Role"], ha["Role"]); diff != "" {
		t.Errorf("the chart's Role rules differ from config/rbac/role.yaml (-generated +chart):\n%s", diff)
	}
	checkLeastPrivilege(t, "ClusterRole", generated["ClusterRole"])
	checkLeastPrivilege(t, "Role", generated["Role"])
}

// TestRBACFollowsValues checks every case's rendered RBAC: least privilege,
// the leader election Role exactly when the pods elect a leader, ConfigMap
// access exactly when bootstrap ConfigMaps are written, TokenReviews exactly
// when the metrics are secure or proxies authenticate with tokens,
// ServiceAccounts exactly with tokens, Pods with tokens or peer addresses,
// and SubjectAccessReviews exactly when the metrics are secure.
func TestRBACFollowsValues(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			rendered := c.render(t)
			roles := rolesOf(t, []byte(rendered))
			if findOptional(decode(t, rendered), "ClusterRole") == nil {
				return // rbac.create=false
			}
			checkLeastPrivilege(t, "ClusterRole", roles["ClusterRole"])
			checkLeastPrivilege(t, "Role", roles["Role"])
			args := containerArgs(t, decode(t, rendered))
			// Token authentication falls back to TokenReview.
			authBy := func(method string) bool {
				return slices.ContainsFunc(args, func(a string) bool {
					v, ok := strings.CutPrefix(a, "--xds-auth=")
					return ok && slices.Contains(strings.Split(v, ","), method)
				})
			}
			tokenAuth := authBy("token")
			grants := func(rules []rbacv1.PolicyRule, group, resource string) bool {
				return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
					return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource)
				})
			}
			for _, tc := range []struct {
				what, group, resource string
				rules                 []rbacv1.PolicyRule
				want                  bool
			}{
				{"the Role, leases", "coordination.k8s.io", "leases", roles["Role"], slices.Contains(args, "--leader-elect")},
				{"the ClusterRole, ConfigMaps", "", "configmaps", roles["ClusterRole"], slices.Contains(args, "--bootstrap-configmaps=true") &&
					!slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--bootstrap-configmap-namespaces=") })},
				{"the Role, ConfigMaps (replicas' feedback)", "", "configmaps", roles["Role"], slices.Contains(args, "--leader-elect")},
				{"the ClusterRole, TokenReviews", "authentication.k8s.io", "tokenreviews", roles["ClusterRole"], slices.Contains(args, "--metrics-secure=true") || tokenAuth},
				// Token bindings watch ServiceAccounts and Pods; the
				// peer-address method, Pods.
				{"the ClusterRole, ServiceAccounts", "", "serviceaccounts", roles["ClusterRole"], tokenAuth},
				{"the ClusterRole, Pods", "", "pods", roles["ClusterRole"], tokenAuth || authBy("peer-address")},
				{"the ClusterRole, SubjectAccessReviews", "authorization.k8s.io", "subjectaccessreviews", roles["ClusterRole"], slices.Contains(args, "--metrics-secure=true")},
				{"the ClusterRole, ReferenceGrants", "gateway.networking.k8s.io", "referencegrants", roles["ClusterRole"], slices.Contains(args, "--cross-namespace=grant")},
			} {
				if got := grants(tc.rules, tc.group, tc.resource); got != tc.want {
					t.Errorf("%s: granted %v, want %v (args %q)", tc.what, got, tc.want, args)
				}
			}
		})
	}
}

// allowedAccess is everything scopeplane may do, by "group/resource": read
// Services, EndpointSlices and Namespaces, and Nodes (their zone label); read ProxyScopes and write their
// status; write the bootstrap ConfigMaps (and, in the release namespace, the replicas' feedback ConfigMaps); hold the leader election Lease;
// record Events; ask the API server who calls the metrics endpoint and
// whether it may; read the ReferenceGrants through which namespaces consent
// to cross-namespace selections; read HTTPRoutes and GRPCRoutes and write
// their status. A new permission must be added here on purpose.
var allowedAccess = map[string][]string{
	"/services":                       {"get", "list", "watch"},
	"discovery.k8s.io/endpointslices": {"get", "list", "watch"},
	"/namespaces":                     {"get", "list", "watch"},
	"/nodes":                          {"get", "list", "watch"},
	"/pods":                           {"get", "list", "watch"},
	"/serviceaccounts":                {"get", "list", "watch"},
	"xds.scopeplane.dev/proxyscopes":  {"get", "list", "watch"},
	"gateway.networking.k8s.io/referencegrants":   {"get", "list", "watch"},
	"gateway.networking.k8s.io/httproutes":        {"get", "list", "watch"},
	"gateway.networking.k8s.io/grpcroutes":        {"get", "list", "watch"},
	"gateway.networking.k8s.io/httproutes/status": {"get", "update", "patch"},
	"gateway.networking.k8s.io/grpcroutes/status": {"get", "update", "patch"},
	"xds.scopeplane.dev/proxyscopes/status":       {"get", "update", "patch"},
	"/configmaps":                                 {"get", "list", "watch", "create", "update", "patch"},
	"coordination.k8s.io/leases":                  {"get", "create", "update"},
	"/events":                                     {"create", "patch"},
	"events.k8s.io/events":                        {"create", "patch"},
	"authentication.k8s.io/tokenreviews":          {"create"},
	"authorization.k8s.io/subjectaccessreviews":   {"create"},
}

// namespacedVerbs are verbs allowed only in the Role of the release
// namespace: a replica deletes its own feedback ConfigMap there when it
// stops, and may delete no other ConfigMap.
var namespacedVerbs = map[string][]string{"/configmaps": {"delete"}}

// namespacedOnly is what scopeplane may do only in its own namespace, so
// only a Role may grant it: the leader election Lease (a ClusterRole would
// let it take over every controller's Lease, kube-system's included) and
// the core/v1 Events leader election records.
var namespacedOnly = []string{"coordination.k8s.io/leases", "/events"}

func checkLeastPrivilege(t *testing.T, kind string, rules []rbacv1.PolicyRule) {
	t.Helper()
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("the %s grants non-resource URLs %q, which scopeplane should not need", kind, r.NonResourceURLs)
		}
		if len(r.ResourceNames) > 0 {
			t.Errorf("the %s names resources %q: a rule for names cannot grant create, and the bootstrap names are the scopes'", kind, r.ResourceNames)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				allowed, ok := allowedAccess[g+"/"+res]
				if !ok {
					t.Errorf("the %s grants access to %q in group %q, which scopeplane should not need (allowedAccess in test/chart)", kind, res, g)
					continue
				}
				if kind == "ClusterRole" && slices.Contains(namespacedOnly, g+"/"+res) {
					t.Errorf("the ClusterRole grants %q in group %q cluster-wide: it belongs in the Role of the release namespace", res, g)
				}
				if kind == "Role" {
					allowed = append(slices.Clone(allowed), namespacedVerbs[g+"/"+res]...)
				}
				for _, v := range r.Verbs {
					if !slices.Contains(allowed, v) {
						t.Errorf("the %s grants %q on %q in group %q, beyond %q", kind, v, res, g, allowed)
					}
				}
			}
		}
	}
}

// TestRBACFromGeneratedRole renders a copy of the chart whose files/role.yaml
// holds, besides the ClusterRole, a namespaced Role (what controller-gen emits
// for a marker with namespace=...): it becomes a Role and RoleBinding in the
// release namespace.
func TestRBACFromGeneratedRole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scopeplane")
	copyDir(t, chartDir, dir)
	role := `---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: scopeplane
rules:
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: scopeplane
  namespace: system
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
`
	if err := os.WriteFile(filepath.Join(dir, "files", "role.yaml"), []byte(role), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runHelm(t, "template", "sp", dir, "--namespace", "ops", "--set", "replicas=1")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	if o := findNamedOptional(decode(t, out), "Role", "sp-scopeplane"); o != nil {
		t.Error("without leader election the chart must not install the leader election Role")
	}
	out, stderr, err = runHelm(t, "template", "sp", dir, "--namespace", "ops", "--set", "replicas=1", "--set", "leaderElection.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	objs := decode(t, out)
	r := findNamed(t, objs, "Role", "sp-scopeplane")
	wantString(t, r, "ops", "metadata", "namespace")
	rb := findNamed(t, objs, "RoleBinding", "sp-scopeplane")
	wantString(t, rb, "ops", "metadata", "namespace")
	wantString(t, rb, "Role", "roleRef", "kind")
	wantString(t, rb, "sp-scopeplane", "subjects", "0", "name")
	wantString(t, rb, "ops", "subjects", "0", "namespace")
	if diff := cmp.Diff(rolesOf(t, []byte(role)), rolesOf(t, []byte(out))); diff != "" {
		t.Errorf("rules differ (-generated +chart):\n%s", diff)
	}

	if err := os.WriteFile(filepath.Join(dir, "files", "role.yaml"), []byte("kind: Secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := runHelm(t, "template", "sp", dir); err == nil || !strings.Contains(stderr, "files/role.yaml holds a Secret") {
		t.Errorf("an unexpected kind in files/role.yaml must fail the render; got %v:\n%s", err, stderr)
	}
}

// rolesOf returns the rules of every ClusterRole and Role in a manifest that
// scopeplane itself is bound to, by kind.
func rolesOf(t *testing.T, manifest []byte) map[string][]rbacv1.PolicyRule {
	t.Helper()
	out := map[string][]rbacv1.PolicyRule{}
	for _, o := range decode(t, string(manifest)) {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" || strings.HasSuffix(o.GetName(), "-metrics-reader") {
			continue // the metrics-reader is for scrapers, not scopeplane
		}
		if strings.HasSuffix(o.GetName(), "-xds-tls") {
			continue // not generated: checkSelfManagedTLS checks it
		}
		if o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-bootstrap") {
			continue // the ClusterRole's ConfigMap rules, moved: checkBootstrapRoles checks them
		}
		data, err := yaml.Marshal(o.Object["rules"])
		if err != nil {
			t.Fatal(err)
		}
		var rules []rbacv1.PolicyRule
		if err := yaml.UnmarshalStrict(data, &rules); err != nil {
			t.Fatal(err)
		}
		out[o.GetKind()] = append(out[o.GetKind()], rules...)
	}
	return out
}

// decode parses a multi-document manifest into objects, skipping empty documents.
func decode(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	dec := k8syaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decoding the manifest: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func findOptional(objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	return nil
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	o := findOptional(objs, kind)
	if o == nil {
		t.Fatalf("no %s rendered", kind)
	}
	return o
}

// field walks maps by key and lists by decimal index.
func field(obj any, path ...string) (any, bool) {
	for _, p := range path {
		switch v := obj.(type) {
		case map[string]any:
			next, ok := v[p]
			if !ok {
				return nil, false
			}
			obj = next
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			obj = v[i]
		default:
			return nil, false
		}
	}
	return obj, true
}

func wantString(t *testing.T, o *unstructured.Unstructured, want string, path ...string) {
	t.Helper()
	got, ok := field(o.Object, path...)
	if !ok {
		t.Errorf("%s %s has no %s", o.GetKind(), o.GetName(), strings.Join(path, "."))
		return
	}
	if fmt.Sprint(got) != want {
		t.Errorf("%s %s: %s = %v, want %s", o.GetKind(), o.GetName(), strings.Join(path, "."), got, want)
	}
}

func containerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	raw, ok := field(find(t, objs, "Deployment").Object, "spec", "template", "spec", "containers", "0", "args")
	if !ok {
		t.Fatal("the Deployment's container has no args")
	}
	var args []string
	for _, a := range raw.([]any) {
		args = append(args, fmt.Sprint(a))
	}
	return args
}

func wantArgs(t *testing.T, args []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("the container args %q lack %q", args, w)
		}
	}
}

// checkObservability checks the PrometheusRule (which the API server cannot
// dry-run) and the dashboard ConfigMap carry the chart's files whole: the
// files themselves are checked against Prometheus' parser and the exported
// metrics by internal/controlplane's TestMetricsAfterScriptedSequence
// (checkAlertsAndDashboard).
func checkObservability(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	rule := find(t, objs, "PrometheusRule")
	wantString(t, rule, "monitoring.coreos.com/v1", "apiVersion")
	wantString(t, rule, "kube-prometheus-stack", "metadata", "labels", "release")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	var alerts int
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		alerts += len(rules)
	}
	var file struct {
		Groups []struct {
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(chartDir, "files", "alerts.yaml")), &file); err != nil {
		t.Fatal(err)
	}
	var want int
	for _, g := range file.Groups {
		want += len(g.Rules)
	}
	if alerts != want || want == 0 {
		t.Errorf("the PrometheusRule holds %d alerts, want the %d of files/alerts.yaml", alerts, want)
	}
	var dashboard *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dashboard") {
			dashboard = o
		}
	}
	if dashboard == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	wantString(t, dashboard, "1", "metadata", "labels", "grafana_dashboard")
	body, _, _ := unstructured.NestedString(dashboard.Object, "data", "scopeplane.json")
	var d struct{ Panels []any }
	if err := json.Unmarshal([]byte(body), &d); err != nil || len(d.Panels) == 0 {
		t.Errorf("the dashboard ConfigMap does not hold the dashboard JSON: %v", err)
	}
}

// checkServiceMonitor checks the ServiceMonitor the API server cannot
// validate here (envtest has no Prometheus Operator CRDs): it scrapes the
// metrics port of the chart's Service, in the release namespace.
func checkServiceMonitor(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor")
	svc := find(t, objs, "Service")
	wantString(t, sm, "monitoring.coreos.com/v1", "apiVersion")
	wantString(t, sm, svc.GetNamespace(), "metadata", "namespace")
	wantString(t, sm, "kube-prometheus-stack", "metadata", "labels", "release")
	wantString(t, sm, "metrics", "spec", "endpoints", "0", "port")
	wantString(t, sm, "/metrics", "spec", "endpoints", "0", "path")
	wantString(t, sm, "15s", "spec", "endpoints", "0", "interval")
	wantString(t, sm, "10s", "spec", "endpoints", "0", "scrapeTimeout")
	wantString(t, sm, svc.GetNamespace(), "spec", "namespaceSelector", "matchNames", "0")
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(selector) == 0 {
		t.Fatal("the ServiceMonitor selects no labels")
	}
	for k, v := range selector {
		if svc.GetLabels()[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, which the Service %s does not carry", k, v, svc.GetName())
		}
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if !slices.ContainsFunc(ports, func(p any) bool { return p.(map[string]any)["name"] == "metrics" }) {
		t.Error("the Service has no port named metrics for the ServiceMonitor")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func findNamed(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	if o := findNamedOptional(objs, kind, name); o != nil {
		return o
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// findNamedOptional is the kind's object of that name, or nil.
func findNamedOptional(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// checkMemoryLimitEnv checks that the container learns its memory limit
// from the downward API (the binary sets GOMEMLIMIT from it), and returns
// the container's plain environment values by name.
func checkMemoryLimitEnv(t *testing.T, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	raw, _ := field(find(t, objs, "Deployment").Object, "spec", "template", "spec", "containers", "0", "env")
	env, _ := raw.([]any)
	values := map[string]string{}
	var limit map[string]any
	for _, e := range env {
		e := e.(map[string]any)
		if e["name"] == "SCOPEPLANE_MEMORY_LIMIT" {
			limit = e
		}
		if v, ok := e["value"].(string); ok {
			values[e["name"].(string)] = v
		}
	}
	want := map[string]any{"name": "SCOPEPLANE_MEMORY_LIMIT", "valueFrom": map[string]any{
		"resourceFieldRef": map[string]any{"containerName": "scopeplane", "resource": "limits.memory"}}}
	if diff := cmp.Diff(want, limit); diff != "" {
		t.Errorf("the container's SCOPEPLANE_MEMORY_LIMIT (-want +got):\n%s", diff)
	}
	return values
}

// checkSecureScrape checks the ServiceMonitor of secure metrics: HTTPS, with
// the token of a ServiceAccount of its own that is bound to the
// metrics-reader ClusterRole and nothing else.
func checkSecureScrape(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor")
	wantString(t, sm, "https", "spec", "endpoints", "0", "scheme")
	wantString(t, sm, "true", "spec", "endpoints", "0", "tlsConfig", "insecureSkipVerify")
	wantString(t, sm, "Bearer", "spec", "endpoints", "0", "authorization", "type")
	wantString(t, sm, "scopeplane-metrics-token", "spec", "endpoints", "0", "authorization", "credentials", "name")
	wantString(t, sm, "token", "spec", "endpoints", "0", "authorization", "credentials", "key")
	secret := findNamed(t, objs, "Secret", "scopeplane-metrics-token")
	wantString(t, secret, "kubernetes.io/service-account-token", "type")
	wantString(t, secret, "scopeplane-metrics-scraper", "metadata", "annotations", "kubernetes.io/service-account.name")
	findNamed(t, objs, "ServiceAccount", "scopeplane-metrics-scraper")
	binding := findNamed(t, objs, "ClusterRoleBinding", "scopeplane-metrics-scraper")
	wantString(t, binding, "scopeplane-metrics-reader", "roleRef", "name")
	wantString(t, binding, "scopeplane-metrics-scraper", "subjects", "0", "name")
	wantString(t, binding, sm.GetNamespace(), "subjects", "0", "namespace")
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" || o == binding {
			continue
		}
		if subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects"); slices.ContainsFunc(subjects, func(s any) bool {
			return s.(map[string]any)["name"] == "scopeplane-metrics-scraper"
		}) {
			t.Errorf("%s %s binds the scraper's ServiceAccount, which may only read /metrics", o.GetKind(), o.GetName())
		}
	}
}

// checkNetworkPolicy checks the locked-down case's NetworkPolicy: it selects
// the release's pods and admits only xDS from the named namespaces and
// peer, and metrics from the named namespace's Prometheus.
func checkNetworkPolicy(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	np := find(t, objs, "NetworkPolicy")
	selector, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	pods, _, _ := unstructured.NestedStringMap(find(t, objs, "Deployment").Object, "spec", "template", "metadata", "labels")
	if len(selector) == 0 {
		t.Fatal("the NetworkPolicy selects every pod of the namespace")
	}
	for k, v := range selector {
		if pods[k] != v {
			t.Errorf("the NetworkPolicy selects %s=%s, which the pods do not carry", k, v)
		}
	}
	ns := func(name string) map[string]any {
		return map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": name}}}
	}
	want := map[string]any{
		"podSelector": np.Object["spec"].(map[string]any)["podSelector"],
		"policyTypes": []any{"Ingress"},
		"ingress": []any{
			map[string]any{
				"ports": []any{map[string]any{"port": "xds", "protocol": "TCP"}},
				"from": []any{ns("storefront"), ns("payments"), map[string]any{
					"namespaceSelector": map[string]any{"matchLabels": map[string]any{"mesh.example.com/member": "true"}},
					"podSelector":       map[string]any{"matchLabels": map[string]any{"app": "gateway"}},
				}},
			},
			map[string]any{
				"ports": []any{map[string]any{"port": "metrics", "protocol": "TCP"}},
				"from": []any{map[string]any{
					"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}},
					"podSelector":       map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "prometheus"}},
				}},
			},
		},
	}
	if diff := cmp.Diff(want, np.Object["spec"]); diff != "" {
		t.Errorf("the NetworkPolicy's spec (-want +got):\n%s", diff)
	}
}

// checkSelfManagedTLS checks the Role of the self-managed CA's Secret: in
// the release namespace, create (which cannot be narrowed to a name) and
// get and update of that Secret only, bound to scopeplane's ServiceAccount.
func checkSelfManagedTLS(t *testing.T, objs []*unstructured.Unstructured, secret, namespace string) {
	t.Helper()
	r := findNamed(t, objs, "Role", secret)
	wantString(t, r, namespace, "metadata", "namespace")
	rules, _, _ := unstructured.NestedSlice(r.Object, "rules")
	// Only the one Secret, which the chart creates: no right to create any
	// Secret (RBAC cannot narrow create to a name).
	want := []any{
		map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "resourceNames": []any{secret}, "verbs": []any{"get", "update"}},
	}
	if diff := cmp.Diff(want, rules); diff != "" {
		t.Errorf("the xDS TLS Role (-want +got):\n%s", diff)
	}
	sec := findNamed(t, objs, "Secret", secret)
	wantString(t, sec, namespace, "metadata", "namespace")
	wantString(t, sec, "Opaque", "type")
	if _, ok := sec.Object["data"]; ok {
		t.Errorf("the chart's xDS TLS Secret sets data, which an upgrade would write over the leader's CA")
	}
	rb := findNamed(t, objs, "RoleBinding", secret)
	wantString(t, rb, secret, "roleRef", "name")
	wantString(t, rb, namespace, "subjects", "0", "namespace")
}

// TestCRDsFollowGenerated checks that the chart renders every CRD of
// config/crd/bases as a template (so that helm upgrade upgrades it), equal to
// what controller-gen generated but for the chart's labels and the
// helm.sh/resource-policy: keep that makes helm uninstall leave it (and every
// ProxyScope) in place; and that crds.install=false renders none.
func TestCRDsFollowGenerated(t *testing.T) {
	bases, err := filepath.Glob(filepath.Join(localapi.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	rendered := map[string]*unstructured.Unstructured{}
	for _, o := range decode(t, renderCases[0].render(t)) {
		if o.GetKind() == "CustomResourceDefinition" {
			rendered[o.GetName()] = o
		}
	}
	for _, b := range bases {
		generated := decode(t, string(mustRead(t, b)))
		if len(generated) != 1 {
			t.Fatalf("%s holds %d objects, want one CRD", b, len(generated))
		}
		want := generated[0]
		got, ok := rendered[want.GetName()]
		if !ok {
			t.Errorf("the chart does not render CRD %s (%s)", want.GetName(), filepath.Base(b))
			continue
		}
		if v := got.GetAnnotations()["helm.sh/resource-policy"]; v != "keep" {
			t.Errorf("CRD %s: helm.sh/resource-policy is %q, want keep: helm uninstall would delete every ProxyScope", got.GetName(), v)
		}
		if v := got.GetLabels()["app.kubernetes.io/managed-by"]; v != "Helm" {
			t.Errorf("CRD %s: app.kubernetes.io/managed-by is %q, want the chart's labels", got.GetName(), v)
		}
		got = got.DeepCopy()
		annotations := got.GetAnnotations()
		delete(annotations, "helm.sh/resource-policy")
		got.SetAnnotations(annotations)
		got.SetLabels(nil)
		if diff := cmp.Diff(want.Object, got.Object); diff != "" {
			t.Errorf("the rendered CRD %s differs from %s beyond its labels and resource policy (-want +got); run `make manifests`:\n%s", got.GetName(), b, diff)
		}
	}
	if len(rendered) != len(bases) {
		t.Errorf("the chart renders %d CRDs, config/crd/bases has %d", len(rendered), len(bases))
	}

	out, stderr, err := runHelm(t, "template", "scopeplane", chartDir, "--set", "crds.install=false")
	if err != nil {
		t.Fatalf("helm template --set crds.install=false: %v\n%s", err, stderr)
	}
	if o := findOptional(decode(t, out), "CustomResourceDefinition"); o != nil {
		t.Errorf("crds.install=false renders CRD %s", o.GetName())
	}
}

// checkBootstrapRoles checks that bootstrapConfigMaps.namespaces moves the
// ConfigMap access into a Role and RoleBinding of each namespace listed, with
// the generated ClusterRole's ConfigMap verbs and nothing else, bound to the
// release's ServiceAccount; and that the ClusterRole keeps none.
func checkBootstrapRoles(t *testing.T, objs []*unstructured.Unstructured, fullname, releaseNS string, namespaces []string) {
	t.Helper()
	generated := rolesOf(t, mustRead(t, filepath.Join(localapi.RepoRoot(), "config", "rbac", "role.yaml")))["ClusterRole"]
	var verbs []string
	for _, r := range generated {
		if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "configmaps") {
			verbs = append(verbs, r.Verbs...)
		}
	}
	if len(verbs) == 0 {
		t.Fatal("config/rbac/role.yaml's ClusterRole grants no ConfigMap access")
	}
	var found []string
	for _, o := range objs {
		if o.GetKind() != "Role" || o.GetName() != fullname+"-bootstrap" {
			continue
		}
		found = append(found, o.GetNamespace())
		data, err := yaml.Marshal(o.Object["rules"])
		if err != nil {
			t.Fatal(err)
		}
		var rules []rbacv1.PolicyRule
		if err := yaml.UnmarshalStrict(data, &rules); err != nil {
			t.Fatal(err)
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: verbs}}
		if diff := cmp.Diff(want, rules); diff != "" {
			t.Errorf("Role %s/%s (-want +got):\n%s", o.GetNamespace(), o.GetName(), diff)
		}
		rb := findNamedIn(t, objs, "RoleBinding", o.GetNamespace(), o.GetName())
		wantString(t, rb, o.GetName(), "roleRef", "name")
		wantString(t, rb, "Role", "roleRef", "kind")
		wantString(t, rb, releaseNS, "subjects", "0", "namespace")
	}
	if !slices.Equal(found, namespaces) {
		t.Errorf("bootstrap Roles in namespaces %q, want %q", found, namespaces)
	}
	for _, r := range rolesOf(t, []byte(manifestOf(t, objs)))["ClusterRole"] {
		if slices.Contains(r.Resources, "configmaps") {
			t.Errorf("with bootstrap namespaces the ClusterRole still grants ConfigMaps: %v", r)
		}
	}
}

// findNamedIn finds the object of kind named name in namespace ns.
func findNamedIn(t *testing.T, objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s/%s rendered", kind, ns, name)
	return nil
}

// manifestOf writes objs back into one YAML stream.
func manifestOf(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	var b strings.Builder
	for _, o := range objs {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return b.String()
}
