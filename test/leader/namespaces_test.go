package leader

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// createWeb creates namespace ns with a Service "web" and its endpoints.
func createWeb(t *testing.T, env *localapi.Env, ns string) {
	t.Helper()
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.0.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		},
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// scopeOnShard creates, in namespace ns, a scope selecting the Services of
// namespace selects, named so that it falls on shard want of count, and
// returns its key.
func scopeOnShard(t *testing.T, env *localapi.Env, ns, selects string, want, count int) model.Key {
	t.Helper()
	for i := 0; ; i++ {
		k := model.Key{Namespace: ns, Name: fmt.Sprintf("edge-%d", i)}
		if shard.Of(k, count) != want {
			continue
		}
		ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}, Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: []xdsv1alpha1.ServiceSelection{{Namespace: xdsv1alpha1.DNSLabel(selects), Names: []xdsv1alpha1.DNSLabel{"web"}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		}}
		if err := env.Client.Create(context.Background(), ps); err != nil {
			t.Fatal(err)
		}
		return k
	}
}

// cached reports whether replica r's Service caches hold Service ns/web.
func cached(r *replica, ns string) (bool, error) {
	err := r.cp.Services.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web"}, &corev1.Service{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// TestShardsWatchTheNamespacesTheirScopesReach runs two shards of one
// replica each under scopes of their own namespaces. Each replica lists
// and watches Services in its scopes' namespaces only, and never across
// every namespace (its requests to the API server are counted). Then shard 0's
// scope is changed to select another namespace: the replica starts
// watching it and stops watching the old one, and its proxies are never
// served the new spec without the new namespace's Services (the builder
// holds the change until they are listed).
func TestShardsWatchTheNamespacesTheirScopesReach(t *testing.T) {
	env := startEnv(t)
	for _, ns := range []string{"reach-a", "reach-b", "reach-c"} {
		createWeb(t, env, ns)
	}
	onA := scopeOnShard(t, env, "reach-a", "reach-a", 0, 2)
	onB := scopeOnShard(t, env, "reach-b", "reach-b", 1, 2)
	addrs := shardAddresses(2)
	shards := []*replica{
		startShardReplica(t, env, "reach-0", "scopeplane-reach", shard.Shards{Index: 0, Addresses: addrs}),
		startShardReplica(t, env, "reach-1", "scopeplane-reach", shard.Shards{Index: 1, Addresses: addrs}),
	}
	watching := func(want ...[]string) func() (bool, string) {
		return func() (bool, string) {
			for i, r := range shards {
				if !r.ready() {
					return false, r.name + " is not ready"
				}
				if got := r.cp.Services.Namespaces(); !slices.Equal(got, want[i]) {
					return false, fmt.Sprintf("shard %d watches %v, want %v", i, got, want[i])
				}
				for _, ns := range []string{"reach-a", "reach-b", "reach-c", "reach-d"} {
					in, err := cached(r, ns)
					if err != nil {
						return false, err.Error()
					}
					if in != slices.Contains(want[i], ns) {
						return false, fmt.Sprintf("shard %d holds %s/web: %v", i, ns, in)
					}
				}
			}
			return true, ""
		}
	}
	testkit.Eventually(t, "each shard watching its scopes' namespaces only", watching([]string{"reach-a"}, []string{"reach-b"}))
	noClusterWideReads := func() {
		t.Helper()
		for _, r := range shards {
			if n := r.clusterWideReads.Load(); n != 0 {
				t.Errorf("replica %s listed or watched every namespace's Services or EndpointSlices %d times", r.name, n)
			}
		}
	}
	noClusterWideReads()
	selected := func(r *replica, k model.Key) (gen int64, services int) {
		if sn := r.cp.Store.Get(k); sn != nil {
			sn.Read(func(v snapshot.View) {
				res := v.Resolution()
				gen, services = res.Generation, res.SelectedServices
			})
		}
		return gen, services
	}
	if _, n := selected(shards[0], onA); n != 1 {
		t.Fatalf("scope %s selects %d Services, want reach-a/web", onA, n)
	}

	// Every state of scope onA that shard 0 serves, from here on.
	type served struct {
		gen      int64
		services int
	}
	var states []served
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		sn := shards[0].cp.Store.Get(onA)
		for {
			var (
				s    served
				wake <-chan struct{}
			)
			sn.Read(func(v snapshot.View) {
				res := v.Resolution()
				s, wake = served{res.Generation, res.SelectedServices}, v.Wake()
			})
			states = append(states, s)
			select {
			case <-wake:
			case <-watchCtx.Done():
				return
			}
		}
	}()

	// Shard 0's scope now selects reach-c's Services, which reach-c grants.
	ctx := context.Background()
	grant := &gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: "reach-c", Name: "from-reach-a"},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1beta1.Group(xdsv1alpha1.GroupVersion.Group), Kind: "ProxyScope", Namespace: "reach-a"}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: "Service"}},
		},
	}
	if err := env.Client.Create(ctx, grant); err != nil {
		t.Fatal(err)
	}
	ps := &xdsv1alpha1.ProxyScope{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: onA.Namespace, Name: onA.Name}, ps); err != nil {
		t.Fatal(err)
	}
	ps.Spec.Services[0].Namespace = "reach-c"
	if err := env.Client.Update(ctx, ps); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "shard 0 watching reach-c instead of reach-a", watching([]string{"reach-c"}, []string{"reach-b"}))
	testkit.Eventually(t, "scope "+onA.String()+" serving reach-c/web", func() (bool, string) {
		gen, n := selected(shards[0], onA)
		return gen == ps.Generation && n == 1, fmt.Sprintf("generation %d with %d Services", gen, n)
	})
	stopWatch()
	<-watched
	for _, s := range states {
		if s.gen == ps.Generation && s.services != 1 {
			t.Errorf("shard 0 served generation %d of %s with %d Services before reach-c's were listed (every state: %v)", s.gen, onA, s.services, states)
		}
	}
	if _, n := selected(shards[1], onB); n != 1 {
		t.Errorf("scope %s of shard 1 selects %d Services, want reach-b/web", onB, n)
	}

	// A route in a namespace no scope reaches: shard 0, whose leader
	// writes the routes' status, watches its namespace, and resolves it.
	createWeb(t, env, "reach-d")
	hr := &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "reach-d", Name: "to-web"},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{testkit.ServiceParent("", "web", 0)}},
			Rules:           []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: testkit.BackendRef("", "web", 80)}}}},
		},
	}
	if err := env.Client.Create(ctx, hr); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "shard 0 watching the route's namespace too", watching([]string{"reach-c", "reach-d"}, []string{"reach-b"}))
	testkit.Eventually(t, "the route's entry, Accepted and ResolvedRefs", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(hr), hr); err != nil {
			return false, err.Error()
		}
		for _, e := range hr.Status.Parents {
			if len(e.Conditions) == 2 && e.Conditions[0].Reason == "Accepted" && e.Conditions[1].Reason == "ResolvedRefs" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", hr.Status.Parents)
	})
	noClusterWideReads()
}
