package controlplane_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
)

// TestStatusIsNoCrossNamespaceOracle has a scope author probe other
// namespaces through status, without any grant: a namespace that exists and
// one that does not are refused alike, and a namespaceSelector with a label
// selector that matches Services in a namespace without consent gets the same
// status as one that matches nothing anywhere.
func TestStatusIsNoCrossNamespaceOracle(t *testing.T) {
	port := []corev1.ServicePort{{Name: "http", Port: 80}}
	listener := xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)}
	probe := func(name string, sel ...xdsv1alpha1.ServiceSelection) *xdsv1alpha1.ProxyScope {
		return &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "oracle-a", Name: name},
			Spec: xdsv1alpha1.ProxyScopeSpec{Services: sel, Listener: listener}}
	}
	everywhere := func(app string) xdsv1alpha1.ServiceSelection {
		return xdsv1alpha1.ServiceSelection{NamespaceSelector: &metav1.LabelSelector{},
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}
	}
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "oracle-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "oracle-b"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "oracle-a", Name: "own", Labels: map[string]string{"app": "own"}}, Spec: corev1.ServiceSpec{Ports: port}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "oracle-b", Name: "vault", Labels: map[string]string{"app": "vault"}}, Spec: corev1.ServiceSpec{Ports: port}},
		probe("exists", xdsv1alpha1.ServiceSelection{Namespace: "oracle-b", Selector: &metav1.LabelSelector{}}),
		probe("absent", xdsv1alpha1.ServiceSelection{Namespace: "oracle-none", Selector: &metav1.LabelSelector{}}),
		probe("vault", everywhere("vault")),
		probe("nothing", everywhere("nothing-has-this-label")),
		probe("vault-and-own", everywhere("vault"), xdsv1alpha1.ServiceSelection{Names: []xdsv1alpha1.DNSLabel{"own"}}),
		probe("nothing-and-own", everywhere("nothing-has-this-label"), xdsv1alpha1.ServiceSelection{Names: []xdsv1alpha1.DNSLabel{"own"}}),
	)
	accepted := func(ps *xdsv1alpha1.ProxyScope) *metav1.Condition {
		return meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted)
	}

	// A namespace named: refused alike whether it exists or not.
	exists := accepted(expectCondition(t, "oracle-a", "exists", xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonRefNotPermitted))
	absent := accepted(expectCondition(t, "oracle-a", "absent", xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonRefNotPermitted))
	if strings.ReplaceAll(exists.Message, "oracle-b", "X") != strings.ReplaceAll(absent.Message, "oracle-none", "X") {
		t.Errorf("an existing and a missing namespace are told apart:\n%s\n%s", exists.Message, absent.Message)
	}

	// A namespaceSelector: what it finds in a namespace without consent is
	// neither counted nor named.
	for _, pair := range [][2]string{{"vault", "nothing"}, {"vault-and-own", "nothing-and-own"}} {
		var reason string
		status := metav1.ConditionTrue
		reason = xdsv1alpha1.ReasonResolved
		if pair[0] == "vault" {
			status, reason = metav1.ConditionFalse, xdsv1alpha1.ReasonNoMatchingServices
		}
		// Both scopes must settle (each is built on its own schedule)
		// before their statuses are compared.
		for _, name := range pair {
			expectCondition(t, "oracle-a", name, xdsv1alpha1.ConditionAccepted, status, reason)
		}
		ps := getScope(t, "oracle-a", pair[0])
		ref := getScope(t, "oracle-a", pair[1])
		got, want := accepted(ps), accepted(ref)
		if got == nil || got.Status != want.Status || got.Reason != want.Reason || got.Message != want.Message {
			t.Errorf("%s tells what %s does not: %+v, want %+v", pair[0], pair[1], got, want)
		}
		if ps.Status.SelectedServices != ref.Status.SelectedServices || ps.Status.Clusters != ref.Status.Clusters {
			t.Errorf("%s counts %d Services, %d clusters; %s %d, %d", pair[0], ps.Status.SelectedServices, ps.Status.Clusters,
				pair[1], ref.Status.SelectedServices, ref.Status.Clusters)
		}
		for _, c := range ps.Status.Conditions {
			if strings.Contains(c.Message, "oracle-b") {
				t.Errorf("%s's %s condition names oracle-b: %s", pair[0], c.Type, c.Message)
			}
		}
	}
}
