package controlplane

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/scopeplane/scopeplane/internal/scheme"
)

// TestTermsRebuildControllersUnderTheSameName checks that every term can
// build the leader-only controllers again on a manager like main's, which
// refuses a second controller of the same name, and that what a term adds
// is kept for the term rather than run by the manager.
func TestTermsRebuildControllersUnderTheSameName(t *testing.T) {
	mgr, err := ctrl.NewManager(&rest.Config{Host: "https://127.0.0.1:1"}, ctrl.Options{
		Scheme: scheme.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	noop := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })
	build := func(m ctrl.Manager) error {
		return ctrl.NewControllerManagedBy(m).Named("term-test").For(&corev1.Namespace{}).Complete(noop)
	}
	for term := range 3 {
		tm := &termManager{Manager: mgr}
		if err := build(tm); err != nil {
			t.Fatalf("term %d: %v", term, err)
		}
		if len(tm.runnables) != 1 {
			t.Fatalf("term %d kept %d runnables, want its one controller", term, len(tm.runnables))
		}
	}
	// The check the terms skip is live on the manager itself.
	if err := build(mgr); err != nil {
		t.Fatalf("the first controller of its name on the manager: %v", err)
	}
	if err := build(mgr); err == nil {
		t.Fatal("the manager took a second controller of the same name: the name check this test relies on is off")
	}
}
