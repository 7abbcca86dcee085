package status

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// TestStatusWritesWaitForTheLimiter runs the status controller on a real
// API server over 20 scopes whose status is unwritten, with a write
// limiter of burst 5 that grants nothing more (a token every 30 years):
// once all 20 have asked for a write, exactly 5 statuses are written. A
// new term (as after a change of leader) with the limiter opened writes
// the other 15.
func TestStatusWritesWaitForTheLimiter(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	const ns, scopes, burst = "limited", 20, 5
	create := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
	for i := range scopes {
		create = append(create, &xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("scope-%02d", i)},
			Spec: xdsv1alpha1.ProxyScopeSpec{Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}}}})
	}
	for _, o := range create {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	written := func() int {
		var l xdsv1alpha1.ProxyScopeList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ps := range l.Items {
			if len(ps.Status.Conditions) > 0 {
				n++
			}
		}
		return n
	}
	limiter := rate.NewLimiter(rate.Every(1e9*time.Second), burst)
	r := &Reconciler{Store: snapshot.NewStore(), Feedback: feedback.New(time.Minute), Bootstrap: bootstrapconfig.NewConflicts(),
		Window: 10 * time.Millisecond, Writes: limiter, Workers: scopes}
	// term runs the controller in a manager of its own, as each leader's
	// term does, until the returned function stops it.
	term := func() func() {
		mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
		if err != nil {
			t.Fatal(err)
		}
		r.Client, r.Recorder = mgr.GetClient(), mgr.GetEventRecorder("scopeplane")
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	stop := term()
	testkit.Eventually(t, "the burst's status writes", func() (bool, string) {
		n := written()
		return n >= burst, fmt.Sprintf("%d written", n)
	})
	// Every scope's reconcile has taken or reserved a token: the burst's
	// 5 and 15 waiting, which no token will come for.
	testkit.Eventually(t, "every scope waiting for a write", func() (bool, string) {
		return limiter.Tokens() <= burst-scopes+0.5, fmt.Sprintf("%.2f tokens, %d statuses written", limiter.Tokens(), written())
	})
	if n := written(); n != burst {
		t.Fatalf("%d statuses written with a limiter of burst %d and no rate", n, burst)
	}
	stop()

	limiter.SetLimit(rate.Inf)
	defer term()()
	testkit.Eventually(t, "every status written once the limiter is open", func() (bool, string) {
		n := written()
		return n == scopes, fmt.Sprintf("%d of %d written", n, scopes)
	})
}
