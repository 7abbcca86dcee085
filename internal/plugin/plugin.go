// Package plugin is kubectl-scopeplane, the kubectl plugin that answers
// "which proxies are behind, and what do they hold?". It reads Envoy's
// Client Status Discovery Service from every control-plane replica (through
// kubectl-style port-forwards to their loopback admin port, or at addresses
// given with --address) and, for explain, the ProxyScope and Service from
// the API server.
package plugin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

const usage = `kubectl scopeplane shows what scopeplane's proxies hold.

Usage:
  kubectl scopeplane proxy-status [<namespace>/<scope>] [-o wide|json]
  kubectl scopeplane config-dump <namespace>/<scope> [--type clusters|endpoints|listeners|routes] [--names-only]
  kubectl scopeplane explain <proxy node id> <namespace>/<service>

Flags (before or after the command):
`

// options are the flags every command shares.
type options struct {
	addresses  []string
	namespace  string
	selector   string
	adminPort  int
	kubeconfig string
	context    string
	output     string
	typ        string
	namesOnly  bool
	stdout     io.Writer
}

// Main runs the plugin and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := &options{stdout: stdout}
	fs := flag.NewFlagSet("kubectl-scopeplane", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { _, _ = fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var addrs string
	fs.StringVar(&addrs, "address", "", "Comma-separated host:port of replicas' admin ports to query directly, instead of port-forwarding to the control plane's pods.")
	fs.StringVar(&o.namespace, "control-plane-namespace", "scopeplane-system", "Namespace the control plane runs in.")
	fs.StringVar(&o.selector, "selector", "app.kubernetes.io/name=scopeplane", "Label selector of the control plane's pods.")
	fs.IntVar(&o.adminPort, "admin-port", 18001, "The pods' admin port (--admin-bind-address).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
	fs.StringVar(&o.context, "context", "", "The kubeconfig context to use.")
	fs.StringVar(&o.output, "o", "", "proxy-status output: wide (versions too) or json (the CSDS responses).")
	fs.StringVar(&o.typ, "type", "", "config-dump: only this type (clusters, endpoints, listeners, routes, or CDS, EDS, LDS, RDS).")
	fs.BoolVar(&o.namesOnly, "names-only", false, "config-dump: names and versions, without the resources' contents.")

	// Flags may come before or after the command and its arguments.
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if addrs != "" {
		o.addresses = strings.Split(addrs, ",")
	}
	if len(positional) == 0 {
		fs.Usage()
		return 2
	}
	var err error
	switch cmd, cmdArgs := positional[0], positional[1:]; cmd {
	case "proxy-status", "ps":
		err = o.proxyStatus(ctx, cmdArgs)
	case "config-dump":
		err = o.configDump(ctx, cmdArgs)
	case "explain":
		err = o.explain(ctx, cmdArgs)
	default:
		err = usageError(fmt.Sprintf("unknown command %q: want proxy-status, config-dump or explain", cmd))
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "error:", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

// usageError is a command line that cannot be run as given.
type usageError string

func (e usageError) Error() string { return string(e) }

func (o *options) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

func (o *options) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(o.stdout, format, args...)
}
