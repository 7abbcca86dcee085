package chart_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
)

var proxyScopeGVK = schema.GroupVersionKind{Group: "xds.scopeplane.dev", Version: "v1alpha1", Kind: "ProxyScope"}

// TestCRDUpgradeKeepsScopes upgrades the ProxyScope CRD under existing
// scopes as a release does: the CRD the chart renders, with a new optional
// field in its schema, applied server-side over the one installed before (the
// generated CRD, as Helm's crds/ directory or an older install.yaml left it).
// Every scope must survive with its spec and status, and the new field must
// then be stored, not pruned.
func TestCRDUpgradeKeepsScopes(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is needed to apply the CRD: %v", err)
	}
	var crd *unstructured.Unstructured
	for _, o := range decode(t, renderCases[0].render(t)) {
		if o.GetKind() == "CustomResourceDefinition" && o.GetName() == "proxyscopes.xds.scopeplane.dev" {
			crd = o
		}
	}
	if crd == nil {
		t.Fatal("the chart renders no ProxyScope CRD")
	}

	env, err := localapi.Start() // installs config/crd/bases: the CRD before the upgrade
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

	// Scopes in two namespaces, one with a status written as the leader does.
	var before []*unstructured.Unstructured
	for _, ns := range []string{"shop", "billing"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		for i, protocol := range []string{"SotW", "Delta"} {
			ps := &unstructured.Unstructured{}
			ps.SetGroupVersionKind(proxyScopeGVK)
			ps.SetNamespace(ns)
			ps.SetName(fmt.Sprintf("scope-%d", i))
			ps.Object["spec"] = map[string]any{
				"protocol": protocol,
				"services": []any{map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": ns}}}},
				"listener": map[string]any{"mode": "Envoy", "port": int64(10080 + i)},
			}
			if err := env.Client.Create(ctx, ps); err != nil {
				t.Fatalf("creating ProxyScope %s/%s: %v", ns, ps.GetName(), err)
			}
			before = append(before, ps)
		}
	}
	withStatus := before[0]
	withStatus.Object["status"] = map[string]any{"observedGeneration": int64(1), "version": "v1-before-upgrade"}
	if err := env.Client.Status().Update(ctx, withStatus); err != nil {
		t.Fatalf("writing a status: %v", err)
	}

	// The upgrade: the chart's CRD with one more optional field in v1alpha1's spec.
	upgraded := crd.DeepCopy()
	versions, _, _ := unstructured.NestedSlice(upgraded.Object, "spec", "versions")
	if len(versions) == 0 {
		t.Fatal("the rendered CRD has no versions")
	}
	for i, v := range versions {
		vm := v.(map[string]any)
		if vm["name"] != "v1alpha1" {
			continue
		}
		props, found, err := unstructured.NestedMap(vm, "schema", "openAPIV3Schema", "properties", "spec", "properties")
		if err != nil || !found {
			t.Fatalf("v1alpha1 has no spec properties: %v", err)
		}
		props["upgradeNote"] = map[string]any{"type": "string", "maxLength": int64(64), "description": "upgradeNote is the field the upgrade adds."}
		if err := unstructured.SetNestedMap(vm, props, "schema", "openAPIV3Schema", "properties", "spec", "properties"); err != nil {
			t.Fatal(err)
		}
		versions[i] = vm
	}
	if err := unstructured.SetNestedSlice(upgraded.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	manifest, err := yaml.Marshal(upgraded.Object)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts",
		"--field-manager=scopeplane-upgrade-test", "-f", "-")
	cmd.Stdin = bytes.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply --server-side of the upgraded CRD: %v\n%s", err, out)
	}
	wait := exec.Command(kubectl, "--kubeconfig", kubeconfig, "wait", "--for=condition=Established",
		"crd/proxyscopes.xds.scopeplane.dev", "--timeout=60s")
	if out, err := wait.CombinedOutput(); err != nil {
		t.Fatalf("the upgraded CRD is not Established: %v\n%s", err, out)
	}

	// Every scope is still there, spec and status unchanged.
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(proxyScopeGVK.GroupVersion().WithKind("ProxyScopeList"))
	if err := env.Client.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(before) {
		t.Fatalf("after the upgrade %d ProxyScopes exist, want %d", len(list.Items), len(before))
	}
	for _, b := range before {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(proxyScopeGVK)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil {
			t.Fatalf("ProxyScope %s/%s after the upgrade: %v", b.GetNamespace(), b.GetName(), err)
		}
		if got.GetUID() != b.GetUID() {
			t.Errorf("ProxyScope %s/%s was re-created (uid %s, was %s)", b.GetNamespace(), b.GetName(), got.GetUID(), b.GetUID())
		}
		if diff := cmp.Diff(b.Object["spec"], got.Object["spec"]); diff != "" {
			t.Errorf("ProxyScope %s/%s spec changed by the upgrade (-before +after):\n%s", b.GetNamespace(), b.GetName(), diff)
		}
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(proxyScopeGVK)
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(withStatus), got); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedString(got.Object, "status", "version"); v != "v1-before-upgrade" {
		t.Errorf("the status written before the upgrade is gone: status.version = %q", v)
	}

	// The new field is accepted and stored. The API server switches to the
	// new schema asynchronously after Established, so a write that comes
	// back pruned is retried until the field is kept.
	testkit.Eventually(t, "spec.upgradeNote kept by the upgraded CRD", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(before[1]), got); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(got.Object, "added after the upgrade", "spec", "upgradeNote"); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Update(ctx, got); err != nil {
			t.Fatalf("writing the new field: %v", err)
		}
		v, _, _ := unstructured.NestedString(got.Object, "spec", "upgradeNote")
		return v == "added after the upgrade", fmt.Sprintf("spec.upgradeNote is %q after the write", v)
	})
	if v, _, _ := unstructured.NestedString(got.Object, "spec", "protocol"); v != "Delta" {
		t.Errorf("writing the new field lost spec.protocol: %q", v)
	}
}
