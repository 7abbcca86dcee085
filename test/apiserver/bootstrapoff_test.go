package apiserver

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
)

// TestNoBootstrapConfigMaps runs the control plane as
// --bootstrap-configmaps=false does: proxies of both protocols are served
// and the status is written in full, naming no bootstrap ConfigMap, and no
// ConfigMap is written.
func TestNoBootstrapConfigMaps(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	const ns = "nobootstrap"
	create(t, env,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api", Labels: map[string]string{"app": "api"}},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}}},
		scope(ns, "sotw", "api", xdsv1alpha1.ProtocolSotW),
		scope(ns, "delta", "api", xdsv1alpha1.ProtocolDelta),
	)
	r := startReplica(t, env, "a", controlplane.Options{NoBootstrapConfigMaps: true})
	proxies := []*proxy{
		connect(t, r.addr, adsclient.SotW, "sotw-1", ns+"/sotw"),
		connect(t, r.addr, adsclient.Delta, "delta-1", ns+"/delta"),
	}
	awaitClusters(t, "both proxies configured", proxies, 1)
	for _, name := range []string{"sotw", "delta"} {
		testkit.Eventually(t, ns+"/"+name+" status written", func() (bool, string) {
			ps, err := getScope(t, env, ns, name)
			if err != nil {
				return false, err.Error()
			}
			st := ps.Status
			accepted := meta.IsStatusConditionTrue(st.Conditions, xdsv1alpha1.ConditionAccepted)
			ready := meta.FindStatusCondition(st.Conditions, xdsv1alpha1.ConditionReady)
			degraded := meta.FindStatusCondition(st.Conditions, xdsv1alpha1.ConditionDegraded)
			ok := accepted && ready != nil && ready.Status == metav1.ConditionTrue && ready.Reason == xdsv1alpha1.ReasonSynced &&
				degraded != nil && degraded.Status == metav1.ConditionFalse &&
				ptr.Deref(st.ConnectedProxies, 0) == 1 && st.SyncedProxies == 1 && st.Clusters == 1 && st.Version != "" &&
				st.ObservedGeneration == ps.Generation
			return ok && st.BootstrapConfigMap == "", fmt.Sprintf("%+v", st)
		})
	}
	// The status writes above follow the scopes' creation, as a bootstrap
	// ConfigMap would have: by now it would exist.
	cms := &corev1.ConfigMapList{}
	if err := env.Client.List(context.Background(), cms, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if cm.Name != "kube-root-ca.crt" || cm.Labels[bootstrapconfig.ManagedByLabel] != "" {
			t.Errorf("ConfigMap %s/%s (labels %v) written with bootstrap ConfigMaps off", cm.Namespace, cm.Name, cm.Labels)
		}
	}
}
