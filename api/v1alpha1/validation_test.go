package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/localapi"
)

var env *localapi.Env

func TestMain(m *testing.M) {
	var err error
	env, err = localapi.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// apply creates a ProxyScope from a spec written as a user writes it, the way
// `kubectl create` sends it, and returns the stored object or the API error.
func apply(t *testing.T, name, spec string) (*xdsv1alpha1.ProxyScope, error) {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: xds.scopeplane.dev/v1alpha1\nkind: ProxyScope\nmetadata:\n  name: %s\n  namespace: default\nspec:\n%s", name, indent(spec))
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("test spec is not YAML: %v\n%s", err, doc)
	}
	if err := env.Client.Create(context.Background(), u); err != nil {
		return nil, err
	}
	got := &xdsv1alpha1.ProxyScope{}
	if err := env.Client.Get(context.Background(), keyOf(u), got); err != nil {
		t.Fatalf("reading back %s: %v", name, err)
	}
	return got, nil
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = "  " + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

func manyNames(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "s%d,", i)
	}
	return "[" + strings.TrimSuffix(b.String(), ",") + "]"
}

func manySelections(n int) string {
	var b strings.Builder
	b.WriteString("services:\n")
	for i := range n {
		fmt.Fprintf(&b, "- names: [s%d]\n", i)
	}
	return b.String()
}

const proxyless = "listener: {mode: ProxylessGRPC}\n"

func TestProxyScopeRejectsInvalidSpecs(t *testing.T) {
	cases := []struct {
		name string
		spec string
		want string // the part of the API error after `ProxyScope.xds.scopeplane.dev "<name>" is invalid: `
		// celSkipped: a schema error stops the CEL rules, and the API server says so.
		celSkipped bool
	}{
		{"unknown-protocol", "protocol: Incremental\nservices: [{names: [a]}]\n" + proxyless,
			`spec.protocol: Unsupported value: "Incremental": supported values: "SotW", "Delta"`, true},
		{"no-services", proxyless,
			`spec.services: Required value`, true},
		{"empty-services", "services: []\n" + proxyless,
			`spec.services: Invalid value: 0: spec.services in body should have at least 1 items`, false},
		{"too-many-selections", manySelections(257) + proxyless,
			`spec.services: Too many: 257: must have at most 256 items`, true},
		{"selection-names-nothing", "services: [{namespace: default}]\n" + proxyless,
			`spec.services[0]: Invalid value: a selection must name something: set names, selector or namespaceSelector (selector: {} selects every Service of the namespace)`, false},
		{"names-with-namespace-selector", "services: [{names: [a], namespaceSelector: {matchLabels: {team: a}}}]\n" + proxyless,
			`spec.services[0]: Invalid value: names and namespaceSelector do not mix: names pick Services of one namespace; to narrow a namespaceSelector use selector`, false},
		{"namespace-with-namespace-selector", "services: [{namespace: shop, namespaceSelector: {matchLabels: {team: a}}}]\n" + proxyless,
			`spec.services[0]: Invalid value: namespace and namespaceSelector do not mix: set one namespace, or select namespaces by label`, false},
		{"uppercase-name", "services: [{names: [Checkout]}]\n" + proxyless,
			`spec.services[0].names[0]: Invalid value: "Checkout": must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit`, false},
		{"name-ends-with-dash", "services: [{names: [checkout-]}]\n" + proxyless,
			`spec.services[0].names[0]: Invalid value: "checkout-": must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit`, false},
		{"namespace-with-underscore", "services: [{namespace: my_ns, names: [a]}]\n" + proxyless,
			`spec.services[0].namespace: Invalid value: "my_ns": must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit`, false},
		{"name-too-long", "services: [{names: [" + strings.Repeat("a", 64) + "]}]\n" + proxyless,
			`spec.services[0].names[0]: Too long: may not be more than 63 bytes`, true},
		{"empty-names", "services: [{names: []}]\n" + proxyless,
			`spec.services[0].names: Invalid value: 0: spec.services[0].names in body should have at least 1 items`, false},
		{"duplicate-names", "services: [{names: [a, a]}]\n" + proxyless,
			`spec.services[0].names[1]: Duplicate value: "a"`, false},
		{"too-many-names", "services: [{names: " + manyNames(65) + "}]\n" + proxyless,
			`spec.services[0].names: Too many: 65: must have at most 64 items`, true},
		{"no-listener", "services: [{names: [a]}]\n",
			`spec.listener: Required value`, true},
		{"unknown-listener-mode", "services: [{names: [a]}]\nlistener: {mode: Istio}\n",
			`spec.listener.mode: Unsupported value: "Istio": supported values: "Envoy", "ProxylessGRPC"`, true},
		{"envoy-without-port", "services: [{names: [a]}]\nlistener: {mode: Envoy}\n",
			`spec.listener: Invalid value: an Envoy listener needs a port (1-65535) to listen on`, false},
		{"envoy-port-zero", "services: [{names: [a]}]\nlistener: {mode: Envoy, port: 0}\n",
			`spec.listener.port: Invalid value: 0: spec.listener.port in body should be greater than or equal to 1`, false},
		{"envoy-port-too-big", "services: [{names: [a]}]\nlistener: {mode: Envoy, port: 70000}\n",
			`spec.listener.port: Invalid value: 70000: spec.listener.port in body should be less than or equal to 65535`, false},
		{"proxies-not-a-name", "services: [{names: [a]}]\nproxies: [Envoy]\n" + proxyless,
			`spec.proxies[0]: Invalid value: "Envoy": must be a ServiceAccount name (a DNS-1123 subdomain): lowercase letters, digits, '-' and '.', starting and ending with a letter or digit`, false},
		{"proxies-duplicate", "services: [{names: [a]}]\nproxies: [envoy, gateway, envoy]\n" + proxyless,
			`spec.proxies: Invalid value: each ServiceAccount may be listed only once`, false},
		{"proxies-empty", "services: [{names: [a]}]\nproxies: []\n" + proxyless,
			`spec.proxies: Invalid value: 0: spec.proxies in body should have at least 1 items`, false},
		{"proxyless-with-port", "services: [{names: [a]}]\nlistener: {mode: ProxylessGRPC, port: 8080}\n",
			`spec.listener: Invalid value: a ProxylessGRPC listener has no port: gRPC clients dial each Service's own port; remove listener.port`, false},
		{"proxyless-with-virtual-hosts", "services: [{names: [a]}]\nlistener: {mode: ProxylessGRPC, virtualHosts: VHDS}\n",
			`spec.listener: Invalid value: virtualHosts is for Envoy listeners: gRPC clients get their routes inline; remove listener.virtualHosts`, false},
		{"virtual-hosts-unknown", "services: [{names: [a]}]\nlistener: {mode: Envoy, port: 80, virtualHosts: OnDemand}\n",
			`spec.listener.virtualHosts: Unsupported value: "OnDemand": supported values: "Inline", "VHDS"`, true},
		{"locality-priority-unknown", "services: [{names: [a]}]\nlocalityPriority: PreferClose\n" + proxyless,
			`spec.localityPriority: Unsupported value: "PreferClose": supported values: "None", "SameZone"`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := apply(t, tc.name, tc.spec)
			if err == nil {
				t.Fatalf("the API server accepted an invalid spec:\n%s", tc.spec)
			}
			want := tc.want
			if tc.celSkipped {
				want = "[" + want + ", <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]"
			}
			want = fmt.Sprintf(`ProxyScope.xds.scopeplane.dev %q is invalid: %s`, tc.name, want)
			if err.Error() != want {
				t.Errorf("wrong error\n got: %s\nwant: %s", err.Error(), want)
			}
		})
	}
}

func TestProxyScopeAcceptsValidSpecsWithDefaults(t *testing.T) {
	cases := []struct {
		name  string
		spec  string
		check func(*testing.T, *xdsv1alpha1.ProxyScope)
	}{
		{"proxies", "services: [{selector: {}}]\nproxies: [envoy, gateway.v1]\n" + proxyless, func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
			if len(ps.Spec.Proxies) != 2 || ps.Spec.Proxies[1] != "gateway.v1" {
				t.Errorf("proxies %v, want [envoy gateway.v1]", ps.Spec.Proxies)
			}
		}},
		{"minimal", "services: [{selector: {}}]\n" + proxyless, func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
			if ps.Spec.Protocol != xdsv1alpha1.ProtocolSotW {
				t.Errorf("protocol defaulted to %q, want SotW", ps.Spec.Protocol)
			}
			if ps.Spec.Listener.Port != nil {
				t.Errorf("a ProxylessGRPC listener got a port: %d", *ps.Spec.Listener.Port)
			}
		}},
		{"envoy-delta", "protocol: Delta\nservices: [{namespace: shop, names: [cart, checkout], selector: {matchLabels: {tier: web}}}]\nlistener: {mode: Envoy, port: 10080}\n",
			func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
				if ps.Spec.Protocol != xdsv1alpha1.ProtocolDelta || ps.Spec.Listener.Port == nil || *ps.Spec.Listener.Port != 10080 {
					t.Errorf("spec not kept: %+v", ps.Spec)
				}
				if got := ps.Spec.Services[0].Names; len(got) != 2 || got[0] != "cart" {
					t.Errorf("names not kept: %v", got)
				}
			}},
		{"namespace-selector", "services: [{namespaceSelector: {matchLabels: {mesh: enabled}}, selector: {matchExpressions: [{key: expose, operator: Exists}]}}]\n" + proxyless,
			func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
				if ps.Spec.Services[0].NamespaceSelector == nil || ps.Spec.Services[0].Selector == nil {
					t.Errorf("selectors not kept: %+v", ps.Spec.Services[0])
				}
			}},
		{"most-selections", manySelections(256) + proxyless, func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
			if len(ps.Spec.Services) != 256 {
				t.Errorf("kept %d selections, want 256", len(ps.Spec.Services))
			}
		}},
		{"longest-name", "services: [{names: [" + strings.Repeat("a", 63) + "]}]\nlistener: {mode: Envoy, port: 65535}\n", func(t *testing.T, ps *xdsv1alpha1.ProxyScope) {
			if ps.Spec.Protocol != xdsv1alpha1.ProtocolSotW {
				t.Errorf("protocol defaulted to %q, want SotW", ps.Spec.Protocol)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := apply(t, "valid-"+tc.name, tc.spec)
			if err != nil {
				t.Fatalf("the API server refused a valid spec: %v\n%s", err, tc.spec)
			}
			tc.check(t, ps)
		})
	}
}

func keyOf(u *unstructured.Unstructured) client.ObjectKey {
	return client.ObjectKey{Namespace: u.GetNamespace(), Name: u.GetName()}
}
