package tls_test

import (
	"context"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
)

// caSecret is where the control plane keeps its self-managed CA, as the
// chart names it.
var caSecret = types.NamespacedName{Namespace: "scopeplane-system", Name: "scopeplane-xds-tls"}

// startControlPlane starts a kube-apiserver holding namespaces, and on it
// a control plane serving xDS over TLS from its self-managed CA
// (caSecret), as the chart's defaults do, on a loopback port whose address
// it returns; opts gives the rest (XDSServerAddress defaults to that
// address). Both stop when the test ends, the manager's error reported.
func startControlPlane(t *testing.T, opts controlplane.Options, namespaces ...string) (*localapi.Env, string) {
	t.Helper()
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	for _, ns := range append([]string{caSecret.Namespace}, namespaces...) {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme.Scheme, Cache: controlplane.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// Each test of the package runs a control plane in this process,
		// with the same controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	opts.XDSListener = lis
	if opts.XDSServerAddress == "" {
		opts.XDSServerAddress = lis.Addr().String()
	}
	opts.CoalesceWindow, opts.StatusWindow = 5*time.Millisecond, 50*time.Millisecond
	opts.TLS = controlplane.TLS{Secret: caSecret, Refresh: time.Second}
	if _, err := controlplane.Setup(ctx, mgr, opts); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return env, lis.Addr().String()
}
