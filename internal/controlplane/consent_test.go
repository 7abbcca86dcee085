package controlplane_test

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// referenceGrant grants ProxyScopes of namespace from the Services of ns
// (one by name, or all of them when name is empty), or, with another group
// or kind in to, something else.
func referenceGrant(ns, name, from string, toGroup, toKind, toName string) *gatewayv1beta1.ReferenceGrant {
	to := gatewayv1beta1.ReferenceGrantTo{Group: gatewayv1beta1.Group(toGroup), Kind: gatewayv1beta1.Kind(toKind)}
	if toName != "" {
		to.Name = ptr.To(gatewayv1beta1.ObjectName(toName))
	}
	return &gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1beta1.Group(xdsv1alpha1.GroupVersion.Group), Kind: "ProxyScope", Namespace: gatewayv1beta1.Namespace(from)}},
			To:   []gatewayv1beta1.ReferenceGrantTo{to},
		},
	}
}

// heldClusters are the cluster names a proxy holds, sorted.
func heldClusters(c *adsclient.Client) []string {
	var out []string
	for name := range c.State(xdstype.Cluster.URL()) {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// expectHeld waits until the proxy holds exactly the clusters.
func expectHeld(t *testing.T, what string, c *adsclient.Client, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Timeout)
	defer cancel()
	if err := c.WaitFor(ctx, func(c *adsclient.Client) bool { return slices.Equal(heldClusters(c), want) }); err != nil {
		t.Fatalf("%s: the proxy holds %v, want %v (stream: %v, %+v)", what, heldClusters(c), want, c.Err(), c.Stats())
	}
}

// TestNamespaceConsent connects a SotW and a delta proxy to scopes that
// select Services of another namespace, and grants and revokes that
// namespace's consent while they stay connected.
func TestNamespaceConsent(t *testing.T) {
	ctx := context.Background()
	port := []corev1.ServicePort{{Name: "http", Port: 80}}
	sel := []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}, {Namespace: "consent-b", Selector: &metav1.LabelSelector{}}}
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "consent-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "consent-b"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-a", Name: "own"}, Spec: corev1.ServiceSpec{Ports: port}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-b", Name: "api"}, Spec: corev1.ServiceSpec{Ports: port}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-b", Name: "db"}, Spec: corev1.ServiceSpec{Ports: port}},
		&xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-a", Name: "sotw"}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: sel, Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		}},
		&xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-a", Name: "delta"}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: sel, Protocol: xdsv1alpha1.ProtocolDelta, Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		}},
		&xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "consent-a", Name: "only-b"}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: sel[1:], Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
		}},
	)
	// refused expects sotw to be served with consent-b's Services left out,
	// and only-b, which selects nothing else, Accepted as onlyB says: False
	// while none of consent-b's Services is granted, True once some are.
	refused := func(what string, onlyB metav1.ConditionStatus) {
		t.Helper()
		ps := expectCondition(t, "consent-a", "sotw", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted)
		if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted); !strings.Contains(c.Message, "Services of consent-b") {
			t.Errorf("%s: the Accepted message does not name consent-b: %s", what, c.Message)
		}
		expectCondition(t, "consent-a", "sotw", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted)
		expectCondition(t, "consent-a", "only-b", xdsv1alpha1.ConditionAccepted, onlyB, xdsv1alpha1.ReasonRefNotPermitted)
	}

	refused("no ReferenceGrant", metav1.ConditionFalse)
	// Connected once the scopes are built (a proxy naming a scope not built
	// yet is refused).
	expectCondition(t, "consent-a", "delta", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonRefNotPermitted)
	conn := dialXDS(t)
	sotw, _ := proxy(t, conn, adsclient.SotW, testkit.Node("consent-sotw", "consent-a/sotw"), nil)
	delta, _ := proxy(t, conn, adsclient.Delta, testkit.Node("consent-delta", "consent-a/delta"), nil)
	proxies := map[string]*adsclient.Client{"SotW": sotw, "delta": delta}
	expectAll := func(what string, want ...string) {
		t.Helper()
		for p, c := range proxies {
			expectHeld(t, what+" ("+p+")", c, want...)
		}
	}
	expectAll("no ReferenceGrant", "consent-a/own:80")

	// Grants that do not count: from another namespace, to another kind.
	create(t,
		referenceGrant("consent-b", "other-ns", "elsewhere", "", "Service", ""),
		referenceGrant("consent-b", "other-kind", "consent-a", "", "Secret", ""),
	)
	expectAll("grants from another namespace or to another kind", "consent-a/own:80")
	refused("grants that do not count", metav1.ConditionFalse)

	byName := referenceGrant("consent-b", "api", "consent-a", "", "Service", "api")
	create(t, byName)
	expectAll("api granted by name", "consent-a/own:80", "consent-b/api:80")
	refused("db is still not granted", metav1.ConditionTrue)

	all := referenceGrant("consent-b", "all", "consent-a", "", "Service", "")
	create(t, all)
	expectAll("all Services granted", "consent-a/own:80", "consent-b/api:80", "consent-b/db:80")
	expectCondition(t, "consent-a", "sotw", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved)
	expectCondition(t, "consent-a", "sotw", xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	expectCondition(t, "consent-a", "only-b", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved)

	// Revoked while the proxies stay connected: the Services leave them.
	for _, g := range []*gatewayv1beta1.ReferenceGrant{all, byName} {
		if err := env.Client.Delete(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	expectAll("grants revoked", "consent-a/own:80")
	refused("grants revoked", metav1.ConditionFalse)
	if !sotw.Running() || !delta.Running() {
		t.Errorf("a proxy's stream ended on the revocation: SotW %v, delta %v", sotw.Err(), delta.Err())
	}
}
