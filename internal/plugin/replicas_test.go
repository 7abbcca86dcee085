package plugin

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// startReplica serves CSDS on a loopback port as a control-plane replica
// does, from its own catalog, snapshot store and proxy feedback: it serves
// the scopes and has the named proxies (node ids) connected to them. stop
// ends it as a killed replica ends: its port then refuses connections.
func startReplica(t *testing.T, scope model.Key, proxies ...string) (addr string, stop func()) {
	t.Helper()
	cat := catalog.New()
	store := snapshot.NewStore()
	cat.UpsertScope(&model.Scope{Key: scope, Protocol: model.SotW, Listener: model.Listener{Mode: model.ListenerProxylessGRPC},
		Selections: []model.Selection{{Namespace: scope.Namespace}}})
	snapshot.NewBuilder(cat, store, 0).Apply(cat.Take())
	fb := feedback.New(time.Minute)
	for _, id := range proxies {
		fb.Connect(scope, &corev3.Node{Id: id}, model.SotW, "127.0.0.1:40000", "", model.Location{})
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = csds.New(store, fb).ServeListener(ctx, lis)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// proxy-status across replicas shows the rows of every replica that
// answers and names, on stderr, each one that does not: a replica down (a
// leader just killed) takes only its own proxies out of the view. It fails
// only when no replica answers.
func TestProxyStatusWithAReplicaDown(t *testing.T) {
	scope := model.Key{Namespace: "shop", Name: "edge"}
	live, _ := startReplica(t, scope, "on-live")
	gone, stopGone := startReplica(t, scope, "on-gone")
	run := func(args ...string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		code = Main(context.Background(), append(args, "--address", live+","+gone), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	row := func(node, replica string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + node + `\s+127\.0\.0\.1:40000\s.*\sshop/edge\s+SotW\s.*\s` + regexp.QuoteMeta(replica) + `\s`)
	}

	code, out, errOut := run("proxy-status")
	if code != 0 || !row("on-live", live).MatchString(out) || !row("on-gone", gone).MatchString(out) || errOut != "" {
		t.Fatalf("both replicas up: exit %d, stderr %q; want both proxies:\n%s", code, errOut, out)
	}

	stopGone()
	for _, args := range [][]string{{"proxy-status"}, {"proxy-status", "shop/edge", "-o", "wide"}} {
		code, out, errOut = run(args...)
		if code != 0 || !row("on-live", live).MatchString(out) || strings.Contains(out, "on-gone") {
			t.Errorf("%v with %s down: exit %d; want 0 and only on-live's row:\n%s", args, gone, code, out)
		}
		if want := "warning: replica " + gone + " did not answer, so its proxies are missing: CSDS at " + gone; !strings.Contains(errOut, want) ||
			strings.Contains(errOut, live) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v with %s down: stderr %q; want one line naming it: %q", args, gone, errOut, want)
		}
	}
	code, out, errOut = run("proxy-status", "-o", "json")
	if code != 0 || !strings.Contains(out, `"on-live"`) || strings.Contains(out, "on-gone") || !strings.Contains(errOut, gone) {
		t.Errorf("-o json with %s down: exit %d, stderr %q:\n%s", gone, code, errOut, out)
	}
	// config-dump and explain need one answer (the proxy's replica's, for
	// explain's first step).
	if code, out, errOut = run("config-dump", "shop/edge", "--names-only"); code != 0 || !strings.Contains(out, `"replica": "`+live+`"`) || !strings.Contains(errOut, gone) {
		t.Errorf("config-dump with %s down: exit %d, stderr %q:\n%s", gone, code, errOut, out)
	}
	if code, _, errOut = run("explain", "on-gone", "shop/web"); code != 1 || !strings.Contains(errOut, `no proxy with node id "on-gone" is connected to any of the 1 replica(s) that answered`) {
		t.Errorf("explain of a proxy on the replica that is down: exit %d, stderr %q", code, errOut)
	}

	addr, stopLive := startReplica(t, scope)
	stopLive()
	var out2, errOut2 bytes.Buffer
	code = Main(context.Background(), []string{"proxy-status", "--address", gone + "," + addr}, &out2, &errOut2)
	if code != 1 || strings.Count(errOut2.String(), "did not answer") != 2 || !strings.Contains(errOut2.String(), "error: none of the 2 replica(s) answered") {
		t.Errorf("no replica up: exit %d, stderr %q; want 1, a line per replica and the error", code, errOut2.String())
	}
}

// A bare scope name takes the namespace kubectl would give it: -n's, or
// else the kubeconfig's current (or --context's) context's, or default
// when the context names none. The replica is asked about that scope.
func TestBareScopeNameTakesTheContextNamespace(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: admin
  user: {token: secret}
contexts:
- name: shop
  context: {cluster: one, user: admin, namespace: shop}
- name: plain
  context: {cluster: one, user: admin}
current-context: shop
`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := startReplica(t, model.Key{Namespace: "shop", Name: "edge"}, "shop-proxy")
	for _, c := range []struct {
		args  []string
		scope string // the scope asked about; "" when it has no proxy
	}{
		{[]string{"proxy-status", "edge"}, "shop/edge"},
		{[]string{"proxy-status", "edge", "--context", "plain"}, ""}, // default/edge
		{[]string{"proxy-status", "edge", "--context", "plain", "-n", "shop"}, "shop/edge"},
		{[]string{"proxy-status", "edge", "-n", "other"}, ""},
		{[]string{"proxy-status", "shop/edge", "--context", "plain"}, "shop/edge"},
	} {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), append(c.args, "--kubeconfig", kubeconfig, "--address", addr), &out, &errOut)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", c.args, code, errOut.String())
			continue
		}
		if shown := strings.Contains(out.String(), "shop-proxy"); shown != (c.scope != "") {
			t.Errorf("%v: shows shop/edge's proxy %v, want %v:\n%s", c.args, shown, c.scope != "", out.String())
		}
	}
	var out, errOut bytes.Buffer
	code := Main(context.Background(), []string{"config-dump", "edge", "--kubeconfig", kubeconfig, "--address", addr, "--names-only"}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), `"scope": "shop/edge"`) {
		t.Errorf("config-dump edge in context shop: exit %d, %s%s", code, out.String(), errOut.String())
	}
	code = Main(context.Background(), []string{"config-dump", "edge", "--kubeconfig", kubeconfig, "--context", "plain", "--address", addr}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "no replica (of 1 asked) serves ProxyScope default/edge") {
		t.Errorf("config-dump edge in context plain: exit %d, %s; want default/edge", code, errOut.String())
	}
}

// With shards, a scope is served by its shard's replicas only: config-dump
// takes its answer from a replica that serves the scope, wherever it is in
// the order asked, and fails only when none does.
func TestConfigDumpFindsTheScopesShard(t *testing.T) {
	first, _ := startReplica(t, model.Key{Namespace: "shop", Name: "cart"})
	second, _ := startReplica(t, model.Key{Namespace: "shop", Name: "edge"})
	var out, errOut bytes.Buffer
	code := Main(context.Background(), []string{"config-dump", "shop/edge", "--address", first + "," + second, "--names-only"}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), `"replica": "`+second+`"`) {
		t.Errorf("config-dump of the second replica's scope: exit %d, stderr %q:\n%s", code, errOut.String(), out.String())
	}
	out.Reset()
	errOut.Reset()
	code = Main(context.Background(), []string{"config-dump", "shop/none", "--address", first + "," + second}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "no replica (of 2 asked) serves ProxyScope shop/none") {
		t.Errorf("config-dump of a scope no replica serves: exit %d, stderr %q", code, errOut.String())
	}
}
