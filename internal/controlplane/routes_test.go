package controlplane_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/internal/testkit"
)

// routeController is the control plane's --route-controller-name in
// these tests.
const routeController = "example.com/scopeplane-test"

// TestRouteStatusWrittenByTheLeader checks the wiring of the route status
// writers: the leader writes a mesh route's entry under the controller
// name it was given, from the cache the control plane builds.
func TestRouteStatusWrittenByTheLeader(t *testing.T) {
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh-routes"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "mesh-routes", Name: "api"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
	hr := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mesh-routes", Name: "to-api"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{testkit.ServiceParent("", "api", 0)}},
			Rules:           []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: testkit.BackendRef("", "api", 80)}}}},
		},
	}
	create(t, hr)
	testkit.Eventually(t, "the route's entry, Accepted and ResolvedRefs", func() (bool, string) {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(hr), hr); err != nil {
			t.Fatal(err)
		}
		for _, e := range hr.Status.Parents {
			if e.ControllerName == routeController && len(e.Conditions) == 2 &&
				e.Conditions[0].Reason == "Accepted" && e.Conditions[1].Reason == "ResolvedRefs" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", hr.Status.Parents)
	})
}
