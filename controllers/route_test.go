package controllers_test

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
)

// TestRoutesCountInTheInitialSync starts the reconcilers on a cluster
// that holds routes of both kinds (one of them no mesh route): both kinds
// are watched, and the replica is ready only once every route listed at
// cache sync was reconciled.
func TestRoutesCountInTheInitialSync(t *testing.T) {
	svcParent := testkit.ServiceParent("", "api", 0)
	hr := &gatewayv1.HTTPRoute{Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{svcParent}}}}
	hr.Namespace, hr.Name = "routes", "web"
	gw := &gatewayv1.HTTPRoute{Spec: gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "gateway"}}}}}
	gw.Namespace, gw.Name = "routes", "north-south"
	gr := &gatewayv1.GRPCRoute{Spec: gatewayv1.GRPCRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{svcParent}}}}
	gr.Namespace, gr.Name = "routes", "rpc"
	create(t, namespace("routes", nil), service("routes", "api", nil, port("http", 80, intstr.FromInt32(8080), "")), hr, gw, gr)

	sync := startReplica(t, env, catalog.New(), catalog.CrossNamespaceGrant)
	if got := sync.RouteKinds(); !slices.Equal(got, []model.RouteKind{model.HTTPRoute, model.GRPCRoute}) {
		t.Errorf("route kinds watched: %v, want both", got)
	}
	select {
	case <-sync.Synced():
	case <-time.After(testkit.Timeout):
		t.Fatalf("not synced: %v", sync.Check(nil))
	}
}

// TestRoutesNotServed runs the reconcilers against an API server that
// serves ReferenceGrants but no route kinds: they start, watch no routes,
// and the replica syncs.
func TestRoutesNotServed(t *testing.T) {
	bare, err := localapi.StartWithoutRoutes()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Stop() })
	sync := startReplica(t, bare, catalog.New(), catalog.CrossNamespaceGrant)
	if got := sync.RouteKinds(); len(got) != 0 || !sync.GrantsWatched() {
		t.Errorf("route kinds watched: %v, ReferenceGrants watched: %v; want none and true", got, sync.GrantsWatched())
	}
	select {
	case <-sync.Synced():
	case <-time.After(testkit.Timeout):
		t.Fatalf("not synced: %v", sync.Check(nil))
	}
}
