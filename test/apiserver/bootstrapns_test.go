package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
)

// TestBootstrapNamespacesWithNamespacedRBAC runs the control plane as the
// chart does with bootstrapConfigMaps.namespaces: as a ServiceAccount whose
// ClusterRole is the generated one without ConfigMaps, and which may touch
// ConfigMaps only through a Role in the one namespace listed. The scope of
// that namespace gets its bootstrap ConfigMap and names it in its status; the
// scope of another namespace is served and written a status that names none.
// A cache that watched ConfigMaps cluster-wide would be forbidden here, and
// no ConfigMap would be written.
func TestBootstrapNamespacesWithNamespacedRBAC(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	const (
		listed, other = "bootstrapped", "unlisted"
		user          = "system:serviceaccount:scopeplane-system:scopeplane"
	)
	clusterRules, configMapRules := generatedRules(t)
	create(t, env,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: listed}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "scopeplane"}, Rules: clusterRules},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scopeplane"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "scopeplane"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: listed, Name: "scopeplane-bootstrap"}, Rules: configMapRules},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: listed, Name: "scopeplane-bootstrap"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "scopeplane-bootstrap"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}},
	)
	for _, ns := range []string{listed, other} {
		create(t, env,
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api", Labels: map[string]string{"app": "api"}},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
			scope(ns, "edge", "api", xdsv1alpha1.ProtocolSotW))
	}
	// The impersonated user has no ConfigMap rights outside listed: check
	// the RBAC is what this test means before relying on it.
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	as, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := as.List(context.Background(), &corev1.ConfigMapList{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing ConfigMaps cluster-wide as %s: %v, want Forbidden", user, err)
	}

	startReplicaAs(t, cfg, "a", controlplane.Options{BootstrapNamespaces: []string{listed}})

	want := map[string]string{listed: bootstrap.ConfigMapName("edge"), other: ""}
	for ns, cmName := range want {
		testkit.Eventually(t, ns+"/edge status written", func() (bool, string) {
			ps, err := getScope(t, env, ns, "edge")
			if err != nil {
				return false, err.Error()
			}
			st := ps.Status
			ready := meta.FindStatusCondition(st.Conditions, xdsv1alpha1.ConditionReady)
			ok := ready != nil && ready.Status == metav1.ConditionTrue && st.ObservedGeneration == ps.Generation
			return ok && st.BootstrapConfigMap == cmName, fmt.Sprintf("bootstrapConfigMap %q (want %q), %+v", st.BootstrapConfigMap, cmName, st.Conditions)
		})
	}
	testkit.Eventually(t, "the bootstrap ConfigMap of "+listed+"/edge", func() (bool, string) {
		cm := &corev1.ConfigMap{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: listed, Name: bootstrap.ConfigMapName("edge")}, cm)
		return err == nil && cm.Data[bootstrap.EnvoyKey] != "", fmt.Sprint(err)
	})
	err = env.Client.Get(context.Background(), client.ObjectKey{Namespace: other, Name: bootstrap.ConfigMapName("edge")}, &corev1.ConfigMap{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s/%s: %v, want none written outside the bootstrap namespaces", other, bootstrap.ConfigMapName("edge"), err)
	}
}

// generatedRules returns the rules of config/rbac/role.yaml's ClusterRole
// without ConfigMaps, and its ConfigMap rules, as the chart splits them.
func generatedRules(t *testing.T) (cluster, configMaps []rbacv1.PolicyRule) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(localapi.RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind != "ClusterRole" {
			continue
		}
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "configmaps") {
				configMaps = append(configMaps, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: r.Verbs})
				r.Resources = slices.DeleteFunc(slices.Clone(r.Resources), func(s string) bool { return s == "configmaps" })
				if len(r.Resources) == 0 {
					continue
				}
			}
			cluster = append(cluster, r)
		}
	}
	if len(cluster) == 0 || len(configMaps) == 0 {
		t.Fatal("config/rbac/role.yaml: no ClusterRole, or no ConfigMap rule in it")
	}
	return cluster, configMaps
}
