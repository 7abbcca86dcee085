package status

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// laggingReader answers reads of one ProxyScope with a copy taken earlier,
// as an informer cache does until it delivers the latest write; every
// other read and every write goes to the API server.
type laggingReader struct {
	client.Client
	stale *xdsv1alpha1.ProxyScope
}

func (l laggingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if ps, ok := obj.(*xdsv1alpha1.ProxyScope); ok && l.stale != nil && key == client.ObjectKeyFromObject(l.stale) {
		l.stale.DeepCopyInto(ps)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// TestStatusWriteNotLostToALaggingCache changes a scope's status and back
// while the cache still shows the status before the first change: the
// change back must be written, though it equals what the cache shows. A
// new leader whose proxies reconnect writes "0 connected" and then, before
// its cache shows that write, the proxies back: compared with the cache,
// the second status looked like no change, and the scope kept saying 0
// until a later change (seconds to a minute, seen at 10,000 scopes).
func TestStatusWriteNotLostToALaggingCache(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	ps := &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "lag", Name: "web"},
		Spec: xdsv1alpha1.ProxyScopeSpec{Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
			Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}}}}
	for _, o := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lag"}}, ps} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	lagging := laggingReader{Client: env.Client}
	r := &Reconciler{Client: lagging, Store: snapshot.NewStore(), Feedback: feedback.New(time.Minute), Bootstrap: bootstrapconfig.NewConflicts(),
		Recorder: &events.FakeRecorder{}}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(ps)}
	onServer := func() xdsv1alpha1.ProxyScopeStatus {
		got := &xdsv1alpha1.ProxyScope{}
		if err := env.Client.Get(ctx, req.NamespacedName, got); err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	reconcile := func() {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	reconcile() // the first status: it names the bootstrap ConfigMap
	if onServer().BootstrapConfigMap == "" {
		t.Fatal("the first status names no bootstrap ConfigMap")
	}
	lagging.stale = &xdsv1alpha1.ProxyScope{}
	if err := env.Client.Get(ctx, req.NamespacedName, lagging.stale); err != nil {
		t.Fatal(err)
	}
	r.Client = lagging
	r.NoBootstrapConfigMaps = true
	reconcile() // written: the status names no ConfigMap now
	if got := onServer().BootstrapConfigMap; got != "" {
		t.Fatalf("the status still names ConfigMap %q", got)
	}
	r.NoBootstrapConfigMaps = false
	reconcile() // back to the first status, which the lagging cache shows
	if onServer().BootstrapConfigMap == "" {
		t.Fatal("the status written last was lost: the server's status names no bootstrap ConfigMap, while the status computed names one; it equalled the lagging cache's copy and was taken for no change")
	}
}
