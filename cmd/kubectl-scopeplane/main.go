// Command kubectl-scopeplane is the kubectl plugin for scopeplane: put it on
// PATH and run `kubectl scopeplane proxy-status`, `config-dump` or `explain`.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/scopeplane/scopeplane/internal/plugin"
)

func main() {
	os.Exit(plugin.Main(ctrl.SetupSignalHandler(), os.Args[1:], os.Stdout, os.Stderr))
}
