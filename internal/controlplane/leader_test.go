package controlplane

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// countingInformer counts the event handlers registered on it.
type countingInformer struct {
	cache.Informer
	handlers map[toolscache.ResourceEventHandlerRegistration]bool
}

type registration struct {
	toolscache.ResourceEventHandlerRegistration
}

func (i *countingInformer) AddEventHandlerWithOptions(toolscache.ResourceEventHandler, toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	r := &registration{}
	i.handlers[r] = true
	return r, nil
}

func (i *countingInformer) RemoveEventHandler(r toolscache.ResourceEventHandlerRegistration) error {
	delete(i.handlers, r)
	return nil
}

type oneInformer struct {
	cache.Cache
	informer *countingInformer
}

func (c oneInformer) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	return c.informer, nil
}

// TestTermsRemoveTheirEventHandlers checks that the handlers a term's
// controllers register on the shared informers go with the term, also one
// registered after it ended.
func TestTermsRemoveTheirEventHandlers(t *testing.T) {
	shared := &countingInformer{handlers: map[toolscache.ResourceEventHandlerRegistration]bool{}}
	_, _ = shared.AddEventHandlerWithOptions(nil, toolscache.HandlerOptions{}) // an every-replica controller's
	tc := &termCache{Cache: oneInformer{informer: shared}}
	inf, err := tc.GetInformer(context.Background(), &corev1.Namespace{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := inf.AddEventHandlerWithOptions(nil, toolscache.HandlerOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(shared.handlers) != 3 {
		t.Fatalf("%d handlers registered, want 3", len(shared.handlers))
	}
	tc.removeHandlers()
	if len(shared.handlers) != 1 {
		t.Errorf("%d handlers left after the term, want the one registered outside it", len(shared.handlers))
	}
	if _, err := inf.AddEventHandlerWithOptions(nil, toolscache.HandlerOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(shared.handlers) != 1 {
		t.Errorf("a handler registered after the term ended was kept")
	}
}
