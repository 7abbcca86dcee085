// Command scopeplane is a Kubernetes operator that is an Envoy xDS control
// plane: it turns Services, EndpointSlices and ProxyScopes into one scoped
// snapshot per ProxyScope and serves it over ADS.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/controlplane"
	"github.com/scopeplane/scopeplane/xds/metrics"
)

// version is the binary's version, set at build time from the Helm chart's
// appVersion (make build, the Dockerfile), so the chart and the binary agree.
var version = "dev"

func main() {
	var (
		metricsAddr string
		probeAddr   string
		leaderElect bool
		leaderNS    string
		xdsAddr     string
		xdsServer   string
		window      time.Duration
		adminAddr   string
		pprofAddr   string
		showVersion bool
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address /healthz and /readyz bind to.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader among replicas; only the leader writes ProxyScope status, every replica serves xDS.")
	flag.StringVar(&leaderNS, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's namespace).")
	flag.StringVar(&xdsAddr, "xds-bind-address", ":18000", "Address the ADS gRPC server (SotW and delta) binds to.")
	flag.StringVar(&xdsServer, "xds-server-address", "127.0.0.1:18000", "host:port proxies dial to reach this control plane, written into each scope's bootstrap ConfigMap (in a cluster: the xDS Service's DNS name).")
	flag.DurationVar(&window, "coalesce-window", 10*time.Millisecond, "How long to wait after a change for more changes before pushing them as one version.")
	flag.StringVar(&adminAddr, "admin-bind-address", "127.0.0.1:18001", "Loopback address of the admin gRPC service: Envoy's Client Status Discovery Service (proxy status and config dumps, what kubectl scopeplane reads through port-forward); empty disables it.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address net/http/pprof binds to; empty (the default) disables it.")
	flag.BoolVar(&showVersion, "version", false, "Print the version and exit.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	if showVersion {
		fmt.Println("scopeplane", version, runtime.Version())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	if adminAddr != "" {
		if err := controlplane.CheckAdminAddress(adminAddr); err != nil {
			log.Error(err, "--admin-bind-address")
			os.Exit(2)
		}
	}

	scheme := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(xdsv1alpha1.AddToScheme(scheme))

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controlplane.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "scopeplane.xds.scopeplane.dev",
		LeaderElectionNamespace: leaderNS,
	})
	if err != nil {
		log.Error(err, "creating the manager")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if _, err := controlplane.Setup(ctx, mgr, controlplane.Options{
		XDSAddress: xdsAddr, XDSServerAddress: xdsServer, CoalesceWindow: window, AdminAddress: adminAddr,
	}); err != nil {
		log.Error(err, "setting up the control plane")
		os.Exit(1)
	}
	metrics.SetBuildInfo(version)
	log.Info("starting scopeplane", "version", version)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "running the manager")
		os.Exit(1)
	}
}
