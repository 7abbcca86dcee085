package plugin

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Command lines that cannot run fail with exit code 2 and say what to fix,
// before anything is dialled.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		says string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"proxy-status", "a/b/c"}, `"a/b/c" is not <namespace>/<scope>`},
		{[]string{"proxy-status", "/edge"}, `"/edge" is not <namespace>/<scope>`},
		{[]string{"proxy-status", "a/b", "c/d"}, "at most one"},
		{[]string{"proxy-status", "-o", "yaml"}, `-o "yaml": want wide or json`},
		{[]string{"config-dump"}, "config-dump takes one <namespace>/<scope>"},
		{[]string{"config-dump", "a/b", "--type", "secrets"}, `--type "secrets"`},
		{[]string{"explain", "node-1"}, "explain takes <proxy node id> <namespace>/<service>"},
		{[]string{"explain", "node-1", "/svc"}, `"/svc" is not <namespace>/<service>`},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), append(c.args, "--address", "127.0.0.1:1"), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), c.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut.String(), c.says)
		}
	}
}

// The plugin takes kubectl's own flags (k8s.io/cli-runtime's ConfigFlags):
// --kubeconfig and --context choose the cluster, --as and --as-group
// impersonate, and -n gives a bare scope name its namespace; the client
// configuration is the one kubectl would build from them.
func TestKubectlFlags(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://127.0.0.1:6443"}
- name: two
  cluster: {server: "https://127.0.0.2:6443"}
users:
- name: admin
  user: {token: secret}
contexts:
- name: first
  context: {cluster: one, user: admin}
- name: second
  context: {cluster: two, user: admin, namespace: from-context}
current-context: first
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o := &options{stdout: io.Discard}
	root := newCommand(o)
	args := []string{"proxy-status", "edge", "--kubeconfig", kubeconfig, "--context", "second", "--as", "alice", "--as-group", "ops", "-n", "shop", "-o", "wide"}
	cmd, rest, err := root.Find(args)
	if err != nil || cmd.Name() != "proxy-status" {
		t.Fatalf("Find: %v, %v", cmd, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.2:6443" {
		t.Errorf("--context second reaches %s, want cluster two", cfg.Host)
	}
	if cfg.Impersonate.UserName != "alice" || len(cfg.Impersonate.Groups) != 1 || cfg.Impersonate.Groups[0] != "ops" {
		t.Errorf("--as alice --as-group ops impersonates %+v", cfg.Impersonate)
	}
	if got, err := o.qualify(cmd.Flags().Args(), 0); err != nil || len(got) != 1 || got[0] != "shop/edge" {
		t.Errorf("-n shop with scope edge names %q (%v), want shop/edge", got, err)
	}
	if o.output != "wide" {
		t.Errorf("-o wide parsed as %q", o.output)
	}
}

// cobra's completion command writes a script for each shell, and kubectl's
// plugin completion calls the plugin's __complete.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), []string{"completion", shell}, &out, &errOut); code != 0 {
			t.Errorf("completion %s: exit %d: %s", shell, code, errOut.String())
			continue
		}
		if !strings.Contains(out.String(), "__complete") {
			t.Errorf("completion %s: the script does not call __complete:\n%.300s", shell, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"__complete", "config-dump", "--type", ""}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "listeners\n") {
		t.Errorf("__complete config-dump --type: exit %d, %q, %s", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := Main(context.Background(), []string{"--help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "kubectl scopeplane") {
		t.Errorf("--help: exit %d, %q", code, out.String())
	}
}
