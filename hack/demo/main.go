// Command demo is `make demo`: it starts a local kube-apiserver and etcd,
// installs the ProxyScope CRD, applies config/samples with kubectl, shows that
// an invalid ProxyScope is refused with a message that says what to change,
// and prints the scopes. With DEMO_ONCE=1 it runs one pass and exits 0 only
// if every step went as expected; otherwise it keeps the API server up until
// Ctrl-C so that kubectl can be pointed at it.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/scopeplane/scopeplane/internal/localapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func run() error {
	step("starting a local kube-apiserver and etcd with the ProxyScope CRD installed")
	env, err := localapi.Start()
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()

	dir, err := os.MkdirTemp("", "scopeplane-demo-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	kubectl := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		fmt.Print(indent(out.String()))
		return out.String(), err
	}

	step("kubectl apply -f config/samples/")
	if _, err := kubectl("", "apply", "-f", filepath.Join(localapi.RepoRoot(), "config", "samples")); err != nil {
		return fmt.Errorf("applying the samples: %w", err)
	}

	step("an invalid ProxyScope is refused with what to change (an Envoy listener without a port)")
	out, err := kubectl(invalidScope, "apply", "-f", "-")
	if err == nil || !strings.Contains(out, "an Envoy listener needs a port") {
		return errors.New("the API server did not refuse the invalid ProxyScope with the expected message")
	}

	step("kubectl get proxyscopes -A")
	out, err = kubectl("", "get", "proxyscopes", "-A")
	if err != nil {
		return fmt.Errorf("listing the scopes: %w", err)
	}
	for _, name := range []string{"storefront", "payments"} {
		if !strings.Contains(out, name) {
			return fmt.Errorf("the sample scope %q is not listed", name)
		}
	}

	if os.Getenv("DEMO_ONCE") != "" {
		step("demo passed")
		return nil
	}
	step("the API server keeps running; in another shell:")
	fmt.Printf("    export KUBECONFIG=%s\n    kubectl get ps -A -o wide\n\nPress Ctrl-C to stop.\n", kubeconfig)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

const invalidScope = `apiVersion: xds.scopeplane.dev/v1alpha1
kind: ProxyScope
metadata:
  name: broken
  namespace: default
spec:
  services: [{names: [web]}]
  listener: {mode: Envoy}
`

func step(msg string) { fmt.Printf("\n==> %s\n", msg) }

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
