package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/controllers/convert"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
)

// kubectlApply applies obj (a manifest) the way `kubectl apply
// --server-side` does after a client-side apply: with field manager
// "kubectl" and kubectl's last-applied-configuration annotation holding
// the manifest itself.
func kubectlApply(ctx context.Context, c client.Client, obj map[string]any) error {
	manifest, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: obj}
	a := u.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[corev1.LastAppliedConfigAnnotation] = string(manifest)
	u.SetAnnotations(a)
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("kubectl"), client.ForceOwnership)
}

// serviceManifest is a Service as users write them: a selector, a few
// ports, labels and an annotation of its own. A headless one holds no
// cluster IP (the test API server has a few hundred to give).
func serviceManifest(ns, name string, headless bool) map[string]any {
	svc := map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"namespace": ns, "name": name,
			"labels":      map[string]any{"app": name, "team": "payments", "tier": "backend"},
			"annotations": map[string]any{"prometheus.io/scrape": "true"}},
		"spec": map[string]any{
			"selector": map[string]any{"app": name, "tier": "backend"},
			"ports": []any{
				map[string]any{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
				map[string]any{"name": "grpc", "port": 9090, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"},
				map[string]any{"name": "metrics", "port": 9100},
			},
		},
	}
	if headless {
		svc["spec"].(map[string]any)["clusterIP"] = "None"
	}
	return svc
}

// sliceManifest is the EndpointSlice the EndpointSlice controller would
// write for serviceManifest with three Pods behind it.
func sliceManifest(ns, name string, i int) map[string]any {
	var endpoints []any
	for e := range 3 {
		endpoints = append(endpoints, map[string]any{
			"addresses":  []any{fmt.Sprintf("10.%d.%d.%d", (i/250)%250, i%250, e+1)},
			"conditions": map[string]any{"ready": true, "serving": true, "terminating": false},
			"nodeName":   fmt.Sprintf("node-%d", (i+e)%50),
			"zone":       fmt.Sprintf("zone-%c", 'a'+(i+e)%3),
			"targetRef":  map[string]any{"kind": "Pod", "namespace": ns, "name": fmt.Sprintf("%s-7d9f8c6b5-%05d", name, e), "uid": fmt.Sprintf("5e0b4a6c-1f2d-4e3a-9b8c-%06d%06d", i, e)},
		})
	}
	return map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"namespace": ns, "name": name + "-x7k2p",
			"labels": map[string]any{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app": name, "team": "payments", "tier": "backend"},
			"annotations": map[string]any{"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-06T02:00:00Z"}},
		"addressType": "IPv4",
		"ports": []any{
			map[string]any{"name": "http", "port": 8080, "protocol": "TCP"},
			map[string]any{"name": "grpc", "port": 9090, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
			map[string]any{"name": "metrics", "port": 9100, "protocol": "TCP"},
		},
		"endpoints": endpoints,
	}
}

// startCache starts a cache with opts on cfg and waits for it to hold the
// informers of objs.
func startCache(ctx context.Context, t testing.TB, cfg *rest.Config, opts cache.Options, objs ...client.Object) cache.Cache {
	t.Helper()
	opts.Scheme = scheme.Scheme
	c, err := cache.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if _, err := c.GetInformer(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	return c
}

// TestCacheDietKeepsWhatIsWritten applies objects as kubectl does (server
// side, with a last-applied annotation) to a real API server and checks
// the manager's cache options: a Service, its EndpointSlice and a
// Namespace are cached without managed fields and the annotation, and the
// Service converts to the same model from the cache as from the API
// server. The control plane then writes from its cached copies (a
// ProxyScope's status, by merge patch; its bootstrap ConfigMap, by
// update), and the API server still holds kubectl's managed fields and
// annotation on both.
func TestCacheDietKeepsWhatIsWritten(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "diet"
	for _, m := range []map[string]any{
		{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns, "labels": map[string]any{"team": "payments"}}},
		serviceManifest(ns, "web", false),
		sliceManifest(ns, "web", 1),
		// A ConfigMap in the way of the scope's bootstrap, labelled as
		// scopeplane's and controlled by nobody: the control plane adopts
		// it and updates it from its cached copy.
		{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"namespace": ns, "name": bootstrap.ConfigMapName("team"),
			"labels": map[string]any{bootstrapconfig.ManagedByLabel: bootstrapconfig.ManagedBy, "owner": "kubectl"}}, "data": map[string]any{"note": "applied"}},
		{"apiVersion": xdsv1alpha1.GroupVersion.String(), "kind": "ProxyScope", "metadata": map[string]any{"namespace": ns, "name": "team"},
			"spec": map[string]any{"listener": map[string]any{"mode": "ProxylessGRPC"}, "services": []any{map[string]any{"names": []any{"web"}}}}},
	} {
		if err := kubectlApply(ctx, env.Client, m); err != nil {
			t.Fatal(err)
		}
	}
	c := startCache(ctx, t, env.Config, controlplane.CacheOptions(),
		&corev1.Service{}, &discoveryv1.EndpointSlice{}, &corev1.Namespace{}, &corev1.ConfigMap{}, &xdsv1alpha1.ProxyScope{})

	// What is read: the cached copies lack what the API server holds.
	key := client.ObjectKey{Namespace: ns, Name: "web"}
	live, cached := &corev1.Service{}, &corev1.Service{}
	for _, r := range []struct {
		c   client.Reader
		svc *corev1.Service
	}{{env.Client, live}, {c, cached}} {
		if err := r.c.Get(ctx, key, r.svc); err != nil {
			t.Fatal(err)
		}
	}
	if len(live.ManagedFields) == 0 || live.Annotations[corev1.LastAppliedConfigAnnotation] == "" || live.Spec.Selector == nil {
		t.Fatalf("the API server's Service lacks what the test strips: %+v", live.ObjectMeta)
	}
	if cached.ManagedFields != nil || cached.Annotations != nil || cached.Spec.Selector != nil || cached.Spec.ClusterIPs != nil {
		t.Errorf("the cached Service keeps what is never read: metadata %+v, spec %+v", cached.ObjectMeta, cached.Spec)
	}
	slicesOf := func(r client.Reader) []*discoveryv1.EndpointSlice {
		var l discoveryv1.EndpointSliceList
		if err := r.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}); err != nil {
			t.Fatal(err)
		}
		var out []*discoveryv1.EndpointSlice
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		return out
	}
	liveSlices, cachedSlices := slicesOf(env.Client), slicesOf(c)
	if len(cachedSlices) != 1 || cachedSlices[0].ManagedFields != nil || cachedSlices[0].Annotations != nil || cachedSlices[0].Endpoints[0].TargetRef != nil {
		t.Errorf("the cached EndpointSlice keeps what is never read: %+v", cachedSlices)
	}
	want := convert.Service(live, liveSlices)
	if len(want.Endpoints) != 3 || len(want.Ports) != 3 {
		t.Fatalf("the API server's Service converts to %+v, not three ports and endpoints", want)
	}
	if got := convert.Service(cached, cachedSlices); !reflect.DeepEqual(got, want) {
		t.Errorf("the cached Service converts to\n%+v\nthe API server's to\n%+v", got, want)
	}
	nsCached := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: ns}, nsCached); err != nil {
		t.Fatal(err)
	}
	if nsCached.ManagedFields != nil || nsCached.Annotations[corev1.LastAppliedConfigAnnotation] != "" || nsCached.Labels["team"] != "payments" {
		t.Errorf("the cached Namespace: %+v", nsCached.ObjectMeta)
	}
	ps := &xdsv1alpha1.ProxyScope{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "team"}, ps); err != nil {
		t.Fatal(err)
	}
	if ps.ManagedFields != nil || ps.Annotations[corev1.LastAppliedConfigAnnotation] != "" {
		t.Errorf("the cached ProxyScope keeps what is never read: %+v", ps.ObjectMeta)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: bootstrap.ConfigMapName("team")}, cm); err != nil {
		t.Fatal(err)
	}
	if cm.ManagedFields != nil || cm.Annotations[corev1.LastAppliedConfigAnnotation] == "" {
		t.Errorf("the cached ConfigMap should lack managed fields and keep its annotations (it is updated whole): %+v", cm.ObjectMeta)
	}

	// What is written: the control plane's status patch and ConfigMap
	// update leave kubectl's managed fields and annotation in place.
	kept := func(o client.Object) (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			return false, err.Error()
		}
		var managers []string
		hasKubectl := false
		for _, f := range o.GetManagedFields() {
			managers = append(managers, f.Manager+"/"+string(f.Operation))
			hasKubectl = hasKubectl || f.Manager == "kubectl" && f.Operation == metav1.ManagedFieldsOperationApply
		}
		state := fmt.Sprintf("managers %v, annotations %d", managers, len(o.GetAnnotations()))
		return hasKubectl && o.GetAnnotations()[corev1.LastAppliedConfigAnnotation] != "", state
	}
	liveCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bootstrap.ConfigMapName("team")}}
	testkit.Eventually(t, "the bootstrap ConfigMap written by the control plane", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(liveCM), liveCM); err != nil {
			return false, err.Error()
		}
		return liveCM.Data[bootstrap.EnvoyKey] != "", fmt.Sprint(liveCM.Data)
	})
	if ok, state := kept(liveCM); !ok {
		t.Errorf("the bootstrap ConfigMap lost kubectl's managed fields or annotation when the control plane updated it: %s", state)
	}
	livePS := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}}
	testkit.Eventually(t, "the ProxyScope status written by the control plane", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(livePS), livePS); err != nil {
			return false, err.Error()
		}
		return livePS.Status.ObservedGeneration == livePS.Generation && len(livePS.Status.Conditions) > 0, fmt.Sprint(livePS.Status.Conditions)
	})
	if ok, state := kept(livePS); !ok {
		t.Errorf("the ProxyScope lost kubectl's managed fields or annotation when the control plane patched its status: %s", state)
	}
}

// heapServices is how many Services (with one EndpointSlice of three
// endpoints each) BenchmarkCacheHeapPerService caches.
const heapServices = 2000

// BenchmarkCacheHeapPerService measures the heap the manager's cache holds
// per Service and its EndpointSlice, with the cache options of before the
// diet (managed fields, annotations and whole objects kept) and with
// CacheOptions, on an API server of its own holding heapServices Services
// applied as kubectl applies them. It reports B/Service; it asserts
// nothing about time. Run it with
//
//	go test -run '^$' -bench CacheHeap -benchtime 1x ./internal/controlplane
func BenchmarkCacheHeapPerService(b *testing.B) {
	own, err := localapi.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = own.Stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "heap"
	if err := kubectlApply(ctx, own.Client, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}); err != nil {
		b.Fatal(err)
	}
	work := make(chan int)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			var err error
			for i := range work {
				name := fmt.Sprintf("svc-%05d", i)
				if err == nil {
					err = kubectlApply(ctx, own.Client, serviceManifest(ns, name, true))
				}
				if err == nil {
					err = kubectlApply(ctx, own.Client, sliceManifest(ns, name, i))
				}
			}
			errs <- err
		}()
	}
	for i := range heapServices {
		work <- i
	}
	close(work)
	for range 8 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	// Before the diet: the same options without the transforms this
	// package adds for Services, EndpointSlices and every kind's metadata.
	before := controlplane.CacheOptions()
	before.DefaultTransform = nil
	for o := range before.ByObject {
		switch o.(type) {
		case *corev1.Service, *discoveryv1.EndpointSlice:
			delete(before.ByObject, o)
		}
	}
	for _, v := range []struct {
		name string
		opts cache.Options
	}{{"before", before}, {"diet", controlplane.CacheOptions()}} {
		b.Run(v.name, func(b *testing.B) {
			var total uint64
			for range b.N {
				heap := func() uint64 {
					var m runtime.MemStats
					runtime.GC()
					runtime.GC()
					runtime.ReadMemStats(&m)
					return m.HeapAlloc
				}
				cctx, stop := context.WithCancel(ctx)
				start := heap()
				c := startCache(cctx, b, own.Config, v.opts, &corev1.Service{}, &discoveryv1.EndpointSlice{})
				var l corev1.ServiceList
				if err := c.List(cctx, &l, client.InNamespace(ns)); err != nil || len(l.Items) != heapServices {
					b.Fatalf("the cache lists %d Services (%v), not %d", len(l.Items), err, heapServices)
				}
				l = corev1.ServiceList{}
				if held := heap(); held > start {
					total += held - start
				}
				runtime.KeepAlive(c)
				stop()
			}
			perService := float64(total) / float64(b.N) / heapServices
			b.ReportMetric(perService, "B/Service")
			b.Logf("%s: the cache holds %.0f bytes per Service with its EndpointSlice (%d Services)", v.name, perService, heapServices)
		})
	}
}
