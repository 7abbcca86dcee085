package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers"
	"github.com/scopeplane/scopeplane/controllers/servicecache"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestCrossNamespaceWithoutReferenceGrantAPI runs the reconcilers against
// an API server that does not serve ReferenceGrants: with
// --cross-namespace=grant they start, and the other namespace's Service is
// refused with the reason; with allow it is served.
func TestCrossNamespaceWithoutReferenceGrantAPI(t *testing.T) {
	bare, err := localapi.StartWithoutReferenceGrants()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Stop() })
	objs := []client.Object{
		namespace("home", nil), namespace("other", nil),
		service("home", "own", nil, port("http", 80, intstr.FromInt32(8080), "")),
		service("other", "api", nil, port("http", 80, intstr.FromInt32(8080), "")),
		proxyScope("home", "gw", envoyListener,
			xdsv1alpha1.ServiceSelection{Names: []xdsv1alpha1.DNSLabel{"own"}},
			xdsv1alpha1.ServiceSelection{Namespace: "other", Names: []xdsv1alpha1.DNSLabel{"api"}}),
	}
	for _, o := range objs {
		if err := bare.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		mode    catalog.CrossNamespace
		want    []string
		refused []string
	}{
		{catalog.CrossNamespaceGrant, []string{"home/own:80"}, []string{"other"}},
		{catalog.CrossNamespaceAllow, []string{"home/own:80", "other/api:80"}, nil},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			c := catalog.New()
			startReplica(t, bare, c, tc.mode)
			key := model.Key{Namespace: "home", Name: "gw"}
			var last catalog.Resolution
			testkit.Eventually(t, "the scope's clusters and refusals", func() (bool, string) {
				for _, u := range c.Take() {
					if u.Key == key {
						last = u.Resolution
					}
				}
				res, _ := c.Resources(key)
				var got []string
				for n := range res[xdstype.Cluster] {
					got = append(got, n)
				}
				sort.Strings(got)
				ok := slices.Equal(got, tc.want) && slices.Equal(last.RefusedNamespaces, tc.refused) &&
					last.GrantsUnavailable == (tc.mode == catalog.CrossNamespaceGrant)
				return ok, fmt.Sprintf("clusters %v, resolution %+v", got, last)
			})
		})
	}
}

// startReplica runs the reconcilers feeding c in a manager of their own
// on e, until the test ends, and returns the initial sync tracker.
func startReplica(t *testing.T, e *localapi.Env, c *catalog.Catalog, crossNS catalog.CrossNamespace) *controllers.InitialSync {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Controller names are unique per process: TestMain's manager
		// holds them already.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	sync, err := controllers.Setup(ctx, mgr, c, crossNS, shard.Shards{}, servicecache.New(servicecache.ForManager(mgr, cache.Options{}), ctrl.Log))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return sync
}
