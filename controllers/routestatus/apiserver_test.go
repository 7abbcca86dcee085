package routestatus_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/scopeplane/scopeplane/controllers/routestatus"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
)

var env *localapi.Env

const us = routestatus.DefaultControllerName

// TestMain runs the route status writers of both kinds, as the leader
// runs them, against a real API server with the experimental route CRDs.
func TestMain(m *testing.M) {
	var err error
	if env, err = localapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kinds := []model.RouteKind{model.HTTPRoute, model.GRPCRoute}
	if err := routestatus.Index(ctx, mgr.GetFieldIndexer(), kinds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	services := servicecache.New(servicecache.ForManager(mgr, cache.Options{}), ctrl.Log)
	if err := mgr.Add(services); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, k := range kinds {
		r := &routestatus.Reconciler{Kind: k, Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Services: services, ControllerName: us, Kinds: kinds, Grants: true}
		if err := r.SetupWithManager(mgr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
	}
	_ = env.Stop()
	os.Exit(code)
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func service(ns, name string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "p", Port: port}}},
	}
}

func parent(name string, port int32) gatewayv1.ParentReference {
	return testkit.ServiceParent("", name, port)
}

var backend = testkit.BackendRef

func httpRoute(ns, name string, p gatewayv1.ParentReference, backends ...gatewayv1.BackendRef) *gatewayv1.HTTPRoute {
	hr := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{p}},
			Rules:           []gatewayv1.HTTPRouteRule{{}},
		},
	}
	for _, b := range backends {
		hr.Spec.Rules[0].BackendRefs = append(hr.Spec.Rules[0].BackendRefs, gatewayv1.HTTPBackendRef{BackendRef: b})
	}
	return hr
}

// conditions reads the route's entry of ours, as "Type=Status/Reason" per
// condition, with the messages.
func ours(t *testing.T, obj client.Object) (map[string]string, string, []gatewayv1.RouteParentStatus) {
	t.Helper()
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	var parents []gatewayv1.RouteParentStatus
	switch o := obj.(type) {
	case *gatewayv1.HTTPRoute:
		parents = o.Status.Parents
	case *gatewayv1.GRPCRoute:
		parents = o.Status.Parents
	}
	got := map[string]string{}
	var msgs []string
	for _, e := range parents {
		if e.ControllerName != us {
			continue
		}
		for _, c := range e.Conditions {
			got[c.Type] = string(c.Status) + "/" + c.Reason
			msgs = append(msgs, c.Message)
			if c.ObservedGeneration != obj.GetGeneration() {
				got[c.Type] += fmt.Sprintf(" (observedGeneration %d of %d)", c.ObservedGeneration, obj.GetGeneration())
			}
		}
	}
	return got, strings.Join(msgs, " | "), parents
}

// waitFor waits until the route's entry of ours says accepted and
// resolved, with a message that contains msg.
func waitFor(t *testing.T, obj client.Object, accepted, resolved, msg string) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("%s: Accepted=%s, ResolvedRefs=%s", obj.GetName(), accepted, resolved), func() (bool, string) {
		got, msgs, _ := ours(t, obj)
		ok := got["Accepted"] == accepted && got["ResolvedRefs"] == resolved && strings.Contains(msgs, msg)
		return ok, fmt.Sprintf("%v: %s", got, msgs)
	})
}

func TestRouteStatusGoodAndOthersKept(t *testing.T) {
	create(t, namespace("good"), service("good", "reviews", 80), service("good", "v1", 8080), service("good", "v2", 8080))
	hr := httpRoute("good", "split", parent("reviews", 80), backend("", "v1", 8080))
	create(t, hr)
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "attached to port 80 of Service good/reviews")

	// Another controller adds its entry for the same parent; an edit of
	// the route rewrites ours and keeps theirs as it is.
	_, _, parents := ours(t, hr)
	theirs := gatewayv1.RouteParentStatus{ParentRef: parent("reviews", 80), ControllerName: "example.com/other-mesh",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "NotOurs", Message: "theirs", LastTransitionTime: metav1.Unix(1000, 0)}}}
	hr.Status.Parents = append([]gatewayv1.RouteParentStatus{theirs}, parents...)
	if err := env.Client.Status().Update(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	hr.Spec.Rules[0].BackendRefs = append(hr.Spec.Rules[0].BackendRefs, gatewayv1.HTTPBackendRef{BackendRef: backend("", "missing", 8080)})
	if err := env.Client.Update(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hr, "True/Accepted", "False/BackendNotFound", "rule 0: backendRefs[1]: Service good/missing does not exist")
	_, _, parents = ours(t, hr)
	var kept bool
	for _, e := range parents {
		kept = kept || e.ControllerName == theirs.ControllerName && len(e.Conditions) == 1 && e.Conditions[0].Reason == "NotOurs" && e.Conditions[0].LastTransitionTime.Equal(&theirs.Conditions[0].LastTransitionTime)
	}
	if !kept || len(parents) != 2 {
		t.Errorf("status.parents %+v: want the other controller's entry as it was, and ours", parents)
	}

	// Another writer drops our entry: it is written back.
	hr.Status.Parents = []gatewayv1.RouteParentStatus{theirs}
	if err := env.Client.Status().Update(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hr, "True/Accepted", "False/BackendNotFound", "Service good/missing does not exist")
}

func TestRouteStatusFollowsParentAndBackendServices(t *testing.T) {
	create(t, namespace("late"))
	hr := httpRoute("late", "r", parent("front", 80), backend("", "back", 8080))
	create(t, hr)
	waitFor(t, hr, "False/NoMatchingParent", "False/BackendNotFound", "Service late/front does not exist")
	// The parent appears, on another port first.
	create(t, service("late", "front", 81))
	waitFor(t, hr, "False/NoMatchingParent", "False/BackendNotFound", "Service late/front has no port 80")
	front := service("late", "front", 81)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(front), front); err != nil {
		t.Fatal(err)
	}
	front.Spec.Ports[0].Port = 80
	if err := env.Client.Update(context.Background(), front); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hr, "True/Accepted", "False/BackendNotFound", "Service late/back does not exist")
	create(t, service("late", "back", 8080))
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "")
	// And goes.
	if err := env.Client.Delete(context.Background(), front); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hr, "False/NoMatchingParent", "True/ResolvedRefs", "Service late/front does not exist")
}

func TestRouteStatusCrossNamespaceBackendNeedsAGrant(t *testing.T) {
	create(t, namespace("consumer"), namespace("provider"), service("consumer", "api", 80), service("provider", "api-v2", 8080))
	hr := httpRoute("consumer", "canary", parent("api", 80), backend("provider", "api-v2", 8080))
	create(t, hr)
	waitFor(t, hr, "True/Accepted", "False/RefNotPermitted", "no ReferenceGrant of namespace provider lets HTTPRoutes of namespace consumer name it")
	// A grant to GRPCRoutes does not do.
	grant := func(name, kind string) *gatewayv1beta1.ReferenceGrant {
		return &gatewayv1beta1.ReferenceGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: "provider", Name: name},
			Spec: gatewayv1beta1.ReferenceGrantSpec{
				From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1beta1.GroupName, Kind: gatewayv1beta1.Kind(kind), Namespace: "consumer"}},
				To:   []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: "Service", Name: ptr.To(gatewayv1beta1.ObjectName("api-v2"))}},
			},
		}
	}
	create(t, grant("grpc-only", "GRPCRoute"))
	waitFor(t, hr, "True/Accepted", "False/RefNotPermitted", "")
	create(t, grant("http", "HTTPRoute"))
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "every backendRef resolves")
}

// TestRouteStatusMirrorBackendAndSession checks that the API server's
// route schema lets a RequestMirror filter and sessionPersistence through
// as they are converted, and that a mirror's backend is resolved as a
// backendRef is: BackendNotFound naming the filter until its Service exists.
func TestRouteStatusMirrorBackendAndSession(t *testing.T) {
	create(t, namespace("shadow"), service("shadow", "web", 80))
	hr := httpRoute("shadow", "copy", parent("web", 80), backend("", "web", 80))
	hr.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{
		Type:          gatewayv1.HTTPRouteFilterRequestMirror,
		RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backend("", "audit", 8080).BackendObjectReference, Percent: ptr.To[int32](10)},
	}}
	hr.Spec.Rules[0].SessionPersistence = &gatewayv1.SessionPersistence{SessionName: ptr.To("sticky")}
	create(t, hr)
	waitFor(t, hr, "True/Accepted", "False/BackendNotFound", "rule 0: filters[0].requestMirror.backendRef: Service shadow/audit does not exist")
	create(t, service("shadow", "audit", 8080))
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "every backendRef resolves")
}

func TestRouteStatusRefusedRoute(t *testing.T) {
	create(t, namespace("bad"), service("bad", "web", 80), service("bad", "web-v1", 80))
	hr := httpRoute("bad", "regex", parent("web", 80), backend("", "web-v1", 80))
	hr.Spec.Rules[0].Name = ptr.To(gatewayv1.SectionName("api"))
	hr.Spec.Rules[0].Matches = []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/api/(v1")}}}
	create(t, hr)
	waitFor(t, hr, "False/UnsupportedValue", "True/ResolvedRefs", `rule 0 ("api"): matches[0].path.value: the regular expression "/api/(v1" does not compile in RE2 syntax`)
}

func TestRouteStatusGRPCRouteWinsItsPort(t *testing.T) {
	create(t, namespace("mixed"), service("mixed", "echo", 9090), service("mixed", "echo-v2", 9090))
	hr := httpRoute("mixed", "web", parent("echo", 9090), backend("", "echo-v2", 9090))
	create(t, hr)
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "")
	gr := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "mixed", Name: "rpc"},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent("echo", 9090)}},
			Rules:           []gatewayv1.GRPCRouteRule{{BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: backend("", "echo-v2", 9090)}}}},
		},
	}
	create(t, gr)
	waitFor(t, gr, "True/Accepted", "True/ResolvedRefs", "")
	waitFor(t, hr, "False/Conflicted", "True/ResolvedRefs", "GRPCRoute mixed/rpc also attaches to port 9090 of Service mixed/echo")
	if err := env.Client.Delete(context.Background(), gr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hr, "True/Accepted", "True/ResolvedRefs", "")
}
