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
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/scheme"
)

// options are the flags every command shares.
type options struct {
	// kube is kubectl's own flags (--kubeconfig, --context, -n, --as, ...),
	// from k8s.io/cli-runtime, so that the plugin reaches the cluster as
	// kubectl does.
	kube      *genericclioptions.ConfigFlags
	addresses []string
	namespace string
	selector  string
	adminPort int
	output    string
	typ       string
	namesOnly bool
	stdout    io.Writer
	// stderr takes what is said beside the output: the replicas that did
	// not answer.
	stderr io.Writer
}

// Main runs the plugin and returns its exit code: 0, 1 when the command
// failed, 2 for a command line that cannot run.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newCommand(&options{stdout: stdout, stderr: stderr})
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		_, _ = fmt.Fprintln(stderr, "error:", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

// newCommand is the plugin's command tree. kubectl runs it as
// "kubectl scopeplane" (the display name), and cobra adds "completion"
// (shell completion scripts) and "__complete", which kubectl calls through a
// kubectl_complete-scopeplane executable on PATH to complete the plugin's
// arguments.
func newCommand(o *options) *cobra.Command {
	o.kube = genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:   "kubectl-scopeplane",
		Short: "Show what scopeplane's proxies hold",
		Long: `kubectl scopeplane shows what scopeplane's proxies hold, from the CSDS of every
control-plane replica (through port-forwards to their loopback admin port, or at the
addresses of --address) and, for explain, the ProxyScope and Service from the API server.
A <scope> is <namespace>/<name>, or a <name> in the namespace of -n or, without it, of
the kubeconfig's context (default when it names none), as kubectl does.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl scopeplane"},
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(fmt.Sprintf("unknown command %q: want proxy-status, config-dump or explain", args[0]))
			}
			_ = cmd.Help()
			return usageError("a command is required: proxy-status, config-dump or explain")
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err.Error()) })
	flags := root.PersistentFlags()
	o.kube.AddFlags(flags)
	var addrs string
	flags.StringVar(&addrs, "address", "", "Comma-separated host:port of replicas' admin ports to query directly, instead of port-forwarding to the control plane's pods.")
	flags.StringVar(&o.namespace, "control-plane-namespace", "scopeplane-system", "Namespace the control plane runs in.")
	flags.StringVar(&o.selector, "selector", "app.kubernetes.io/name=scopeplane", "Label selector of the control plane's pods.")
	flags.IntVar(&o.adminPort, "admin-port", 18001, "The pods' admin port (--admin-bind-address).")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		if addrs != "" {
			o.addresses = strings.Split(addrs, ",")
		}
	}

	ps := &cobra.Command{
		Use:               "proxy-status [<scope>]",
		Aliases:           []string{"ps"},
		Short:             "Which proxies each replica serves, and whether they are at the current version",
		ValidArgsFunction: o.completeScopes(1),
		RunE:              o.qualified(0, o.proxyStatus),
	}
	ps.Flags().StringVarP(&o.output, "output", "o", "", "Output: wide (versions too) or json (the CSDS responses).")
	dump := &cobra.Command{
		Use:               "config-dump <scope>",
		Short:             "What a scope serves: every resource with its version and contents",
		ValidArgsFunction: o.completeScopes(1),
		RunE:              o.qualified(0, o.configDump),
	}
	dump.Flags().StringVar(&o.typ, "type", "", "Only this type (clusters, endpoints, listeners, routes, or CDS, EDS, LDS, RDS).")
	dump.Flags().BoolVar(&o.namesOnly, "names-only", false, "Names and versions, without the resources' contents.")
	explain := &cobra.Command{
		Use:   "explain <proxy node id> <namespace>/<service>",
		Short: "Why a proxy holds, or lacks, what it does for a Service",
		RunE:  o.qualified(1, o.explain),
	}
	// The flags' completions cannot fail: a failed registration is a
	// programming error that the completion test shows.
	_ = ps.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"wide", "json"}, cobra.ShellCompDirectiveNoFileComp))
	_ = dump.RegisterFlagCompletionFunc("type", cobra.FixedCompletions([]cobra.Completion{"clusters", "endpoints", "listeners", "routes"}, cobra.ShellCompDirectiveNoFileComp))
	for _, c := range []*cobra.Command{ps, dump, explain} {
		c.Args = cobra.ArbitraryArgs // each command says what it takes
		root.AddCommand(c)
	}
	return root
}

// qualify gives the argument at i a namespace when it names none, as
// kubectl does: the one of -n, or else the kubeconfig's current context's
// (default when the context names none), so that "proxy-status edge -n shop"
// names shop/edge. The kubeconfig is read only for a bare name.
func (o *options) qualify(args []string, i int) ([]string, error) {
	if i >= len(args) || strings.Contains(args[i], "/") {
		return args, nil
	}
	ns, _, err := o.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("the namespace of %q (give <namespace>/%s or -n): kubeconfig: %w", args[i], args[i], err)
	}
	out := slices.Clone(args)
	out[i] = ns + "/" + args[i]
	return out, nil
}

// qualified runs a command with its argument at i qualified (qualify).
func (o *options) qualified(i int, run func(context.Context, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		args, err := o.qualify(args, i)
		if err != nil {
			return err
		}
		return run(cmd.Context(), args)
	}
}

// completeScopes completes the first argument with the ProxyScopes the
// user can list: <namespace>/<name>, or only names with -n.
func (o *options) completeScopes(max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		cfg, err := o.restConfig()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		list := &xdsv1alpha1.ProxyScopeList{}
		ns := ""
		if o.kube.Namespace != nil {
			ns = *o.kube.Namespace
		}
		if err := c.List(cmd.Context(), list, client.InNamespace(ns)); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var out []cobra.Completion
		for _, ps := range list.Items {
			name := ps.Namespace + "/" + ps.Name
			if ns != "" {
				name = ps.Name
			}
			if strings.HasPrefix(name, toComplete) {
				out = append(out, name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// usageError is a command line that cannot be run as given.
type usageError string

func (e usageError) Error() string { return string(e) }

// restConfig is the client configuration kubectl would use with the same
// flags: kubeconfig, context, impersonation (--as, --as-group), server and
// the rest of k8s.io/cli-runtime's ConfigFlags.
func (o *options) restConfig() (*rest.Config, error) {
	cfg, err := o.kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

func (o *options) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(o.stdout, format, args...)
}

func (o *options) warnf(format string, args ...any) {
	_, _ = fmt.Fprintf(o.stderr, "warning: "+format, args...)
}
