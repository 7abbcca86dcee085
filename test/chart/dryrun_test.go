package chart_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

// TestServerDryRun applies every case's rendered objects to a real
// kube-apiserver (v1.37, the envtest binaries) with a server-side dry run,
// in a namespace that enforces the restricted Pod Security Standard, and
// fails on any error or warning. The ServiceMonitor and PrometheusRule are
// left out (envtest has no Prometheus Operator CRDs; checkServiceMonitor and
// checkObservability check them instead), and so is cert-manager's
// Certificate (its CRDs are not served to this build; the cert-manager
// render case checks it). It
// also applies the ProxyScope example NOTES.txt shows.
func TestServerDryRun(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is needed to apply the rendered chart: %v", err)
	}
	helmPath(t)
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the test API server: %v", err)
		}
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range renderCases {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
		}}}
		if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			var manifest bytes.Buffer
			var applied int
			for _, o := range decode(t, c.render(t)) {
				// Namespaced objects outside the release namespace (the
				// bootstrap namespaces' Roles) need their namespace.
				if ns := o.GetNamespace(); ns != "" && ns != c.namespace {
					if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
						t.Fatal(err)
					}
				}
				if o.GetAPIVersion() == "monitoring.coreos.com/v1" { // ServiceMonitor, PrometheusRule
					continue
				}
				if o.GetAPIVersion() == "cert-manager.io/v1" { // no cert-manager CRDs here either: the cert-manager case checks it
					continue
				}
				data, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				manifest.WriteString("---\n")
				manifest.Write(data)
				applied++
			}
			out := applyDryRun(t, kubectl, kubeconfig, manifest.Bytes())
			if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n != applied {
				t.Errorf("kubectl applied %d objects, want %d:\n%s", n, applied, out)
			}

			applyDryRun(t, kubectl, kubeconfig, notesExample(t, renderNotes(t, c)))
		})
	}
}

// applyDryRun applies a manifest with a server-side dry run and fails on an
// error or a warning (deprecated APIs, Pod Security violations, unknown
// fields); it returns kubectl's output, one line per object.
func applyDryRun(t *testing.T, kubectl, kubeconfig string, manifest []byte) string {
	t.Helper()
	cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--dry-run=server",
		"--field-manager=scopeplane-chart-test", "--validate=strict", "-o", "name", "-f", "-")
	cmd.Stdin = bytes.NewReader(manifest)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl apply --dry-run=server: %v\n%s\nmanifest:\n%s", err, stderr.String(), manifest)
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Errorf("kubectl apply --dry-run=server warned:\n%s", s)
	}
	return stdout.String()
}

// renderNotes renders NOTES.txt for the case. helm template leaves it out and
// helm install --dry-run needs every kind's CRD (the ServiceMonitor's is not
// installed here), so it renders a copy of the chart with one more template
// that includes NOTES.txt, which Helm parses with the other templates.
func renderNotes(t *testing.T, c renderCase) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "scopeplane")
	copyDir(t, chartDir, dir)
	const show = "templates/zz-notes-for-test.yaml"
	tpl := "notes: {{ include \"scopeplane/templates/NOTES.txt\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(dir, show), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"template"}, c.helmArgs(t, dir)...)
	out, stderr, err := runHelm(t, append(args, "--show-only", show)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr)
	}
	var rendered struct{ Notes string }
	if err := yaml.Unmarshal([]byte(out), &rendered); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return rendered.Notes
}

// notesExample extracts the ProxyScope of NOTES.txt: the indented here-document
// between `cat <<'YAML' | kubectl apply -f -` and `YAML`.
func notesExample(t *testing.T, notes string) []byte {
	t.Helper()
	_, rest, ok := strings.Cut(notes, "cat <<'YAML' | kubectl apply -f -\n")
	if !ok {
		t.Fatalf("NOTES.txt has no ProxyScope example:\n%s", notes)
	}
	var doc []string
	for _, line := range strings.Split(rest, "\n") {
		if strings.TrimSpace(line) == "YAML" {
			example := []byte(strings.Join(doc, "\n") + "\n")
			var u unstructured.Unstructured
			if err := yaml.Unmarshal(example, &u.Object); err != nil || u.GetKind() != "ProxyScope" {
				t.Fatalf("the NOTES.txt example is not a ProxyScope (%v):\n%s", err, example)
			}
			return example
		}
		doc = append(doc, strings.TrimPrefix(line, "   "))
	}
	t.Fatalf("the NOTES.txt example does not end with YAML:\n%s", notes)
	return nil
}

// TestNotes checks that NOTES.txt tells where proxies reach the xDS server
// (the address the pods write into the bootstraps), how a proxy joins a
// scope, where its bootstrap is, and what a gRPC Pod of each client sets.
func TestNotes(t *testing.T) {
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			notes := renderNotes(t, c)
			var addr, shards string
			for _, a := range containerArgs(t, decode(t, c.render(t))) {
				if v, ok := strings.CutPrefix(a, "--xds-server-address="); ok {
					addr = v
				}
				if v, ok := strings.CutPrefix(a, "--shards="); ok {
					shards = v
				}
			}
			reach := "Proxies reach its xDS server (ADS gRPC, SotW and delta) at " + addr + "."
			if slots := strings.Split(addr, ","); len(slots) > 1 {
				// The first and the last slot: its Service and that
				// Service's address.
				last := len(slots) - 1
				reach = fmt.Sprintf("slots, and its proxies reach the slot's Service,\nwhich sends them to the slot's shard (slot I: shard I mod %s); the scope's bootstrap names it:\n"+
					"   slot 0: Service %s at %s\n   ...\n   slot %d: Service %s at %s\n",
					shards, strings.Split(slots[0], ".")[0], slots[0], last, strings.Split(slots[last], ".")[0], slots[last])
			}
			want := []string{
				reach,
				"kind: ProxyScope",
				"scopeplane.dev/scope: default/storefront",
				"status.bootstrapConfigMap",
				"jsonpath='{.status.bootstrapConfigMap}'",
			}
			args := containerArgs(t, decode(t, c.render(t)))
			// What a proxyless gRPC Pod mounts and sets, per client.
			if !slices.Contains(args, "--xds-insecure") {
				want = append(want, "GOOGLE_APPLICATION_CREDENTIALS=/etc/scopeplane/xds/tls-only-key.json",
					"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=/etc/scopeplane/xds/ca.crt")
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--xds-auth=") && strings.Contains(a, "peer-address") }) {
					want = append(want, "as the one Running Pod holding their address, when it sets\n     spec.admitByPeerAddress: true.")
				} else {
					want = append(want, "add peer-address to xds.auth.methods")
				}
				if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--xds-auth=") && strings.Contains(a, "token") }) {
					want = append(want, "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS=true")
				}
			}
			if slices.Contains(args, "--bootstrap-configmaps=false") {
				want = append(want[:3], "Bootstrap ConfigMaps are off (bootstrapConfigMaps.enabled=false): write each proxy's")
			}
			for _, want := range want {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
				}
			}
			// What a proxy mounts for the credential the chart asks for: the
			// token at the path the bootstraps read it from, which Envoy sends
			// unless it presents a SPIFFE certificate.
			var methods string
			anonymous := false
			for _, a := range containerArgs(t, decode(t, c.render(t))) {
				if v, ok := strings.CutPrefix(a, "--xds-auth="); ok {
					methods = v
				}
				anonymous = anonymous || a == "--xds-allow-anonymous"
			}
			token := slices.Contains(strings.Split(methods, ","), "token")
			spiffe := slices.Contains(strings.Split(methods, ","), "spiffe")
			if !anonymous && token && !strings.Contains(notes, "/var/run/secrets/scopeplane/token") {
				t.Errorf("NOTES.txt does not say where the token is mounted (--xds-auth=%s):\n%s", methods, notes)
			}
			if !anonymous && token && !spiffe && !strings.Contains(notes, "envoy-sds-token.yaml") {
				t.Errorf("NOTES.txt does not say that Envoy sends the token (--xds-auth=%s):\n%s", methods, notes)
			}
			notesExample(t, notes)
		})
	}
}
