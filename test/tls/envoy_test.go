package tls_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/auth/authtest"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/server"
)

// TestEnvoyKeysWithTheDefaults runs the control plane as the chart's
// defaults do (TLS from the self-managed CA, tokens the only credential)
// against a real kube-apiserver and checks the scope's bootstrap ConfigMap:
// it holds Envoy's CA and token SDS files beside the bootstrap, each valid
// for Envoy, and they stay byte for byte the same across reconciles that
// rewrite the ConfigMap: a CA rotation changes ca.crt alone, and a
// protocol change the bootstrap's api_type alone, and a reconcile that
// changes nothing does not write.
func TestEnvoyKeysWithTheDefaults(t *testing.T) {
	env, _ := startControlPlane(t, controlplane.Options{
		XDSServerAddress: "scopeplane.scopeplane-system.svc:18000",
		Server:           server.Options{Authenticator: &auth.Authenticator{Tokens: auth.NewTokenVerifier("scopeplane", authtest.NewIssuer(t, "k1"), nil)}},
	}, "edge")
	ctx := t.Context()
	ps := &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "gw"},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Protocol: xdsv1alpha1.ProtocolSotW,
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To(int32(10080))},
		},
	}
	if err := env.Client.Create(ctx, ps); err != nil {
		t.Fatal(err)
	}

	wantKeys := []string{bootstrap.CAKey, bootstrap.EnvoyKey, bootstrap.TokenSDSKey, bootstrap.CASDSKey, bootstrap.GRPCKey, bootstrap.GRPCEnvKey, bootstrap.TLSOnlyKeyKey}
	slices.Sort(wantKeys)
	get := func() (*corev1.ConfigMap, error) {
		cm := &corev1.ConfigMap{}
		return cm, env.Client.Get(ctx, client.ObjectKey{Namespace: "edge", Name: bootstrap.ConfigMapName("gw")}, cm)
	}
	var first *corev1.ConfigMap
	testkit.Eventually(t, "the bootstrap ConfigMap", func() (bool, string) {
		cm, err := get()
		if err != nil {
			return false, err.Error()
		}
		first = cm
		return cm.Data[bootstrap.CAKey] != "", "no ca.crt yet"
	})
	if keys := slices.Sorted(maps.Keys(first.Data)); !slices.Equal(keys, wantKeys) {
		t.Fatalf("the ConfigMap's keys are %v, want %v", keys, wantKeys)
	}
	if err := bootstrap.ValidateEnvoy([]byte(first.Data[bootstrap.EnvoyKey])); err != nil {
		t.Errorf("%s: %v", bootstrap.EnvoyKey, err)
	}
	for _, key := range []string{bootstrap.CASDSKey, bootstrap.TokenSDSKey} {
		if err := bootstrap.ValidateEnvoySDS([]byte(first.Data[key])); err != nil {
			t.Errorf("%s: %v", key, err)
		}
	}

	// unchangedBut checks that cm holds the same keys as first, each the
	// same but the ones named.
	unchangedBut := func(cm *corev1.ConfigMap, changed ...string) error {
		if keys := slices.Sorted(maps.Keys(cm.Data)); !slices.Equal(keys, wantKeys) {
			return fmt.Errorf("keys %v, want %v", keys, wantKeys)
		}
		for _, key := range wantKeys {
			if same := cm.Data[key] == first.Data[key]; same == slices.Contains(changed, key) {
				return fmt.Errorf("%s changed: %v, want %v", key, !same, slices.Contains(changed, key))
			}
		}
		return nil
	}

	// A CA rotation (the Secret deleted, so the leader makes a new CA)
	// rewrites the ConfigMap: ca.crt alone changes, which Envoy follows
	// through the unchanged envoy-sds-ca.yaml.
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, caSecret, sec); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, sec); err != nil {
		t.Fatal(err)
	}
	var rotated *corev1.ConfigMap
	testkit.Eventually(t, "the new CA in the bootstrap ConfigMap", func() (bool, string) {
		cm, err := get()
		if err != nil {
			return false, err.Error()
		}
		rotated = cm
		return cm.Data[bootstrap.CAKey] != first.Data[bootstrap.CAKey], "the old CA still"
	})
	if err := unchangedBut(rotated, bootstrap.CAKey); err != nil {
		t.Errorf("after the CA rotation: %v", err)
	}
	first.Data[bootstrap.CAKey] = rotated.Data[bootstrap.CAKey]

	// A protocol change rewrites the bootstrap's api_type, nothing else
	// of Envoy's.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ps), ps); err != nil {
		t.Fatal(err)
	}
	ps.Spec.Protocol = xdsv1alpha1.ProtocolDelta
	if err := env.Client.Update(ctx, ps); err != nil {
		t.Fatal(err)
	}
	var delta *corev1.ConfigMap
	testkit.Eventually(t, "the Delta bootstrap in the ConfigMap", func() (bool, string) {
		cm, err := get()
		if err != nil {
			return false, err.Error()
		}
		delta = cm
		return cm.Data[bootstrap.EnvoyKey] != first.Data[bootstrap.EnvoyKey], "the SotW bootstrap still"
	})
	if err := unchangedBut(delta, bootstrap.EnvoyKey); err != nil {
		t.Errorf("after the protocol change: %v", err)
	}
	if err := bootstrap.ValidateEnvoy([]byte(delta.Data[bootstrap.EnvoyKey])); err != nil {
		t.Errorf("the Delta %s: %v", bootstrap.EnvoyKey, err)
	}

	// Reconciles that change nothing write nothing: a second reconciler
	// with the same settings (as a new leader would be) renders every key
	// byte for byte as the first did, so the ConfigMap keeps its
	// resourceVersion and no proxy's mount is touched.
	r := &bootstrapconfig.Reconciler{
		Client: env.Client, XDSServer: "scopeplane.scopeplane-system.svc:18000", Conflicts: bootstrapconfig.NewConflicts(),
		CA: staticCA(delta.Data[bootstrap.CAKey]), Token: true,
	}
	for i := range 3 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ps)}); err != nil {
			t.Fatal(err)
		}
		cm, err := get()
		if err != nil {
			t.Fatal(err)
		}
		if cm.ResourceVersion != delta.ResourceVersion || !maps.Equal(cm.Data, delta.Data) {
			t.Errorf("reconcile %d rewrote the ConfigMap (resourceVersion %s, was %s)", i+1, cm.ResourceVersion, delta.ResourceVersion)
		}
	}
}
