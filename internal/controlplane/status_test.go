package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/controllers/bootstrapconfig"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/bootstrap"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

func dialXDS(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// proxy runs an ADS client that subscribes to everything, until the test ends.
func proxy(t *testing.T, conn *grpc.ClientConn, p adsclient.Protocol, n *corev3.Node, reject func(string, []*anypb.Any, []string) string) (*adsclient.Client, <-chan error) {
	t.Helper()
	cfg := testkit.WildcardClient(p, n)
	cfg.Reject = reject
	c := adsclient.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- c.Run(ctx, conn); close(finished) }()
	t.Cleanup(func() { cancel(); <-finished })
	return c, done
}

func getScope(t *testing.T, ns, name string) *xdsv1alpha1.ProxyScope {
	t.Helper()
	ps := &xdsv1alpha1.ProxyScope{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, ps); err != nil {
		t.Fatal(err)
	}
	return ps
}

// expectCondition waits until the scope's condition has the status and reason.
func expectCondition(t *testing.T, ns, name, typ string, st metav1.ConditionStatus, reason string) *xdsv1alpha1.ProxyScope {
	t.Helper()
	var ps *xdsv1alpha1.ProxyScope
	testkit.Eventually(t, fmt.Sprintf("%s/%s %s=%s (%s)", ns, name, typ, st, reason), func() (bool, string) {
		ps = getScope(t, ns, name)
		c := meta.FindStatusCondition(ps.Status.Conditions, typ)
		if c == nil {
			return false, "no condition"
		}
		return c.Status == st && c.Reason == reason && c.ObservedGeneration == ps.Generation, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	return ps
}

// expectKstatus reads the scope from the API server as GitOps tools do
// (unstructured) and checks what kstatus computes from it.
func expectKstatus(t *testing.T, ns, name string, want kstatus.Status) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(xdsv1alpha1.GroupVersion.WithKind("ProxyScope"))
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	res, err := kstatus.Compute(u)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != want {
		t.Errorf("kstatus of %s/%s: %s (%s), want %s", ns, name, res.Status, res.Message, want)
	}
}

func TestStatusConditionsAreReachedAndCleared(t *testing.T) {
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "status"}},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "status", Name: "web"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}, {Namespace: "ghost", Names: []xdsv1alpha1.DNSLabel{"web"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
			},
		},
	)
	// A namespace that does not exist and grants nothing is refused as one
	// that exists and grants nothing: status does not tell which exist.
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonRefNotPermitted)
	ps := expectCondition(t, "status", "web", xdsv1alpha1.ConditionReady, metav1.ConditionFalse, xdsv1alpha1.ReasonNotAccepted)
	if ps.Status.BootstrapConfigMap != bootstrap.ConfigMapName("web") || ps.Status.ObservedGeneration != ps.Generation || ps.Status.Version == "" {
		t.Errorf("status fields: %+v", ps.Status)
	}
	expectKstatus(t, "status", "web", kstatus.InProgressStatus) // the namespace may yet appear

	// Drop the missing namespace: nothing matches yet.
	mutate(t, ps, func(ps *xdsv1alpha1.ProxyScope) { ps.Spec.Services = ps.Spec.Services[:1] })
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonNoMatchingServices)
	expectKstatus(t, "status", "web", kstatus.InProgressStatus)

	// A selector the schema cannot reject but the control plane cannot parse.
	mutate(t, ps, func(ps *xdsv1alpha1.ProxyScope) {
		ps.Spec.Services = append(ps.Spec.Services, xdsv1alpha1.ServiceSelection{Selector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Near"}},
		}})
	})
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionAccepted, metav1.ConditionFalse, xdsv1alpha1.ReasonInvalidSelector)
	if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionAccepted); !strings.Contains(c.Message, "spec.services[1].selector") {
		t.Errorf("the InvalidSelector message does not name the selection: %s", c.Message)
	}
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionStalled, metav1.ConditionTrue, xdsv1alpha1.ReasonInvalidSelector)
	expectKstatus(t, "status", "web", kstatus.FailedStatus)
	mutate(t, ps, func(ps *xdsv1alpha1.ProxyScope) { ps.Spec.Services = ps.Spec.Services[:1] })
	create(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "status", Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved)

	// Served before any proxy connects: healthy, and kstatus says Current.
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies)
	if ps.Status.ConnectedProxies == nil || *ps.Status.ConnectedProxies != 0 {
		t.Errorf("connectedProxies = %v, want 0", ps.Status.ConnectedProxies)
	}
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionStalled, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	expectKstatus(t, "status", "web", kstatus.CurrentStatus)

	// A proxy connects and ACKs everything: Ready.
	conn := dialXDS(t)
	good, _ := proxy(t, conn, adsclient.SotW, testkit.Node("good", "status/web"), nil)
	_ = good
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced)
	if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionReady); c.Message != "1 of 1 proxies at version "+ps.Status.Version {
		t.Errorf("Ready message: %q", c.Message)
	}
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	expectKstatus(t, "status", "web", kstatus.CurrentStatus)

	// A second proxy rejects the routes: Degraded, with its error on the CRD.
	nacksBefore := testutil.ToFloat64(metrics.NACKs.WithLabelValues("status/web", xdstype.Route.URL()))
	rejecting := true
	reject := func(typeURL string, _ []*anypb.Any, _ []string) string {
		if typeURL == xdstype.Route.URL() && rejecting {
			return "route config http-10080: unknown cluster"
		}
		return ""
	}
	bad, _ := proxy(t, conn, adsclient.SotW, testkit.Node("picky", "status/web"), reject)
	start := time.Now()
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed)
	t.Logf("the NACK reached the CRD %v after the proxy connected", time.Since(start).Round(time.Millisecond))
	c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionDegraded)
	if !strings.Contains(c.Message, "proxy picky at 127.0.0.1:") || !strings.Contains(c.Message, " rejected "+xdstype.Route.URL()) || !strings.Contains(c.Message, "unknown cluster") {
		t.Errorf("Degraded message: %q", c.Message)
	}
	if len(ps.Status.RecentNACKs) == 0 || ps.Status.RecentNACKs[0].Node != "picky" || ps.Status.RecentNACKs[0].Detail != "route config http-10080: unknown cluster" {
		t.Errorf("recentNACKs: %+v", ps.Status.RecentNACKs)
	}
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionReady, metav1.ConditionFalse, xdsv1alpha1.ReasonPending)
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionStalled, metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed)
	expectKstatus(t, "status", "web", kstatus.FailedStatus)
	if got := testutil.ToFloat64(metrics.NACKs.WithLabelValues("status/web", xdstype.Route.URL())) - nacksBefore; got != 1 {
		t.Errorf("scopeplane_xds_nacks_total grew by %v, want 1 (a NACK is not answered by a resend)", got)
	}
	nacks := 0
	for _, e := range bad.Events() {
		if !e.Accepted {
			nacks++
		}
	}
	if nacks != 1 {
		t.Errorf("the picky proxy NACKed %d responses, want exactly 1: the rejected version must not be resent", nacks)
	}

	// The proxy accepts the next version: Degraded clears, Ready again.
	rejecting = false
	mutate(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "status", Name: "web"}}, func(svc *corev1.Service) {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "admin", Port: 9000})
	})
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced)
	if ptr.Deref(ps.Status.ConnectedProxies, -1) != 2 || ps.Status.SyncedProxies != 2 || ps.Status.Clusters != 2 {
		t.Errorf("counts: connected %v synced %d clusters %d", ps.Status.ConnectedProxies, ps.Status.SyncedProxies, ps.Status.Clusters)
	}
	expectCondition(t, "status", "web", xdsv1alpha1.ConditionStalled, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	expectKstatus(t, "status", "web", kstatus.CurrentStatus)

	// A delta proxy knocks on a SotW scope: refused, and the scope says why.
	_, done := proxy(t, conn, adsclient.Delta, testkit.Node("wrong", "status/web"), nil)
	err := <-done
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "set api_type: GRPC") {
		t.Errorf("a delta stream on a SotW scope ended with %v", err)
	}
	ps = expectCondition(t, "status", "web", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonWrongProtocol)
	if ps.Status.RefusedStreams < 1 {
		t.Errorf("refusedStreams = %d", ps.Status.RefusedStreams)
	}
	expectKstatus(t, "status", "web", kstatus.CurrentStatus) // its own proxies are served; the knocking ones are misconfigured

	// Switching the scope to delta rewrites its bootstrap at once and keeps
	// serving the SotW proxies for the transition (600 s by default)...
	envoyBefore := string(bootstrapOf(t, "status", "web", bootstrap.EnvoyKey))
	mutate(t, ps, func(ps *xdsv1alpha1.ProxyScope) { ps.Spec.Protocol = xdsv1alpha1.ProtocolDelta })
	testkit.Eventually(t, "the Envoy bootstrap switched to DELTA_GRPC", func() (bool, string) {
		cur := string(bootstrapOf(t, "status", "web", bootstrap.EnvoyKey))
		return cur != envoyBefore && strings.Contains(cur, "api_type: DELTA_GRPC"), cur
	})
	testkit.Eventually(t, "status.protocolTransition counts the SotW proxies, good and picky", func() (bool, string) {
		tr := getScope(t, "status", "web").Status.ProtocolTransition
		return tr != nil && tr.From == xdsv1alpha1.ProtocolSotW && tr.Proxies == 2 && time.Until(tr.Until.Time) > 500*time.Second, fmt.Sprintf("%+v", tr)
	})
	if !good.Running() {
		t.Errorf("the SotW stream ended during the transition: %v", good.Err())
	}
	// ...until the transition ends: a window of 0 ends it now.
	mutate(t, ps, func(ps *xdsv1alpha1.ProxyScope) { ps.Spec.ProtocolTransitionSeconds = ptr.To[int32](0) })
	testkit.Eventually(t, "the SotW streams closed with FailedPrecondition", func() (bool, string) {
		return !good.Running(), fmt.Sprint(good.Err())
	})
	testkit.Eventually(t, "status.protocolTransition cleared", func() (bool, string) {
		tr := getScope(t, "status", "web").Status.ProtocolTransition
		return tr == nil, fmt.Sprintf("%+v", tr)
	})
	if status.Code(good.Err()) != codes.FailedPrecondition {
		t.Errorf("a SotW stream after the switch to delta ended with %v", good.Err())
	}
}

// TestBootstrapConfigMapConflict: a ConfigMap someone else made under the
// bootstrap's name is never overwritten; the scope says so on its status
// until the ConfigMap is gone, and then gets its bootstraps. The conflict
// does not stop the scope from serving: Ready is what it would be without
// it, and kstatus computes Current, with or without proxies.
func TestBootstrapConfigMapConflict(t *testing.T) {
	theirs := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "clash", Name: bootstrap.ConfigMapName("edge")},
		Data:       map[string]string{"envoy.yaml": "someone else's"},
	}
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "clash"}},
		theirs,
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "clash", Name: "door"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "clash", Name: "edge"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
			},
		},
	)
	ps := expectCondition(t, "clash", "edge", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict)
	if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionDegraded); !strings.Contains(c.Message, "ConfigMap clash/edge-xds-bootstrap already exists without the label app.kubernetes.io/managed-by=scopeplane") {
		t.Errorf("the conflict message: %s", c.Message)
	}
	if ps.Status.BootstrapConfigMap != "" {
		t.Errorf("status.bootstrapConfigMap names a ConfigMap scopeplane did not write: %q", ps.Status.BootstrapConfigMap)
	}
	expectCondition(t, "clash", "edge", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies)
	expectKstatus(t, "clash", "edge", kstatus.CurrentStatus)
	proxy(t, dialXDS(t), adsclient.SotW, testkit.Node("clash-edge", "clash/edge"), nil)
	expectCondition(t, "clash", "edge", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced)
	expectCondition(t, "clash", "edge", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict)
	expectKstatus(t, "clash", "edge", kstatus.CurrentStatus)
	got := &corev1.ConfigMap{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(theirs), got); err != nil || got.Data["envoy.yaml"] != "someone else's" {
		t.Errorf("the other ConfigMap was changed: %v %v", got.Data, err)
	}

	if err := env.Client.Delete(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	expectCondition(t, "clash", "edge", xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	if !strings.Contains(string(bootstrapOf(t, "clash", "edge", "envoy.yaml")), "clash/edge") {
		t.Error("the bootstrap was not written once the name was free")
	}
	if ps = getScope(t, "clash", "edge"); ps.Status.BootstrapConfigMap != bootstrap.ConfigMapName("edge") {
		t.Errorf("status.bootstrapConfigMap: %q", ps.Status.BootstrapConfigMap)
	}
}

// TestCostIsWrittenAfterProxiesGoQuiet: proxies that connect, sync and then
// say nothing more send no feedback that would wake the status writer once
// their bucket is complete; status.cost still shows their traffic.
func TestCostIsWrittenAfterProxiesGoQuiet(t *testing.T) {
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "quiet"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "quiet", Name: "web"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "quiet", Name: "edge"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
			},
		},
	)
	expectCondition(t, "quiet", "edge", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies)
	conn := dialXDS(t)
	for _, id := range []string{"edge-1", "edge-2"} {
		proxy(t, conn, adsclient.SotW, testkit.Node(id, "quiet/edge"), nil)
	}
	testkit.Eventually(t, "both proxies synced on the status", func() (bool, string) {
		ps := getScope(t, "quiet", "edge")
		return ps.Status.SyncedProxies == 2, fmt.Sprintf("%d synced", ps.Status.SyncedProxies)
	})
	// The proxies stay connected and quiet: only the end of their bucket
	// can bring their initial syncs onto the status.
	testkit.Eventually(t, "status.cost with the initial syncs", func() (bool, string) {
		c := getScope(t, "quiet", "edge").Status.Cost
		if c == nil {
			return false, "no status.cost"
		}
		return c.Pushes >= 8 && c.Connects >= 8 && c.SentBytes > 0 && c.OtherProtocolBytes > 0, fmt.Sprintf("%+v", *c)
	})
}

// TestBootstrapConfigMapOfARecreatedScope: a ProxyScope deleted and
// re-created under the same name finds its old ConfigMap, labelled as
// scopeplane's and controlled by the deleted scope (the local API server
// has no garbage collector, so it stays for ever; a cluster's stays until
// the collector runs). It is adopted, not reported as a conflict. A
// labelled ConfigMap whose controller still exists is a real conflict,
// and the message names that controller.
func TestBootstrapConfigMapOfARecreatedScope(t *testing.T) {
	ctx := context.Background()
	scope := func(name string) *xdsv1alpha1.ProxyScope {
		return &xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "again", Name: name},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
			},
		}
	}
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "again"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "again", Name: "door"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		scope("phoenix"),
	)
	controlledBy := func(uid types.UID) {
		t.Helper()
		testkit.Eventually(t, "the bootstrap ConfigMap controlled by ProxyScope uid "+string(uid), func() (bool, string) {
			cm := &corev1.ConfigMap{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "again", Name: bootstrap.ConfigMapName("phoenix")}, cm); err != nil {
				return false, err.Error()
			}
			c := metav1.GetControllerOf(cm)
			return c != nil && c.UID == uid && len(cm.OwnerReferences) == 1, fmt.Sprintf("owners %+v", cm.OwnerReferences)
		})
	}
	first := getScope(t, "again", "phoenix")
	controlledBy(first.UID)
	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the first ProxyScope gone", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(first), &xdsv1alpha1.ProxyScope{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	create(t, scope("phoenix"))
	second := getScope(t, "again", "phoenix")
	if second.UID == first.UID {
		t.Fatal("the re-created scope has the old UID")
	}
	controlledBy(second.UID)
	expectCondition(t, "again", "phoenix", xdsv1alpha1.ConditionDegraded, metav1.ConditionFalse, xdsv1alpha1.ReasonAsExpected)
	if ps := getScope(t, "again", "phoenix"); ps.Status.BootstrapConfigMap != bootstrap.ConfigMapName("phoenix") {
		t.Errorf("status.bootstrapConfigMap: %q", ps.Status.BootstrapConfigMap)
	}

	// A labelled ConfigMap that a live ProxyScope controls is not adopted.
	keeper := getScope(t, "again", "phoenix")
	theirs := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "again", Name: bootstrap.ConfigMapName("usurper"),
			Labels: map[string]string{bootstrapconfig.ManagedByLabel: bootstrapconfig.ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: xdsv1alpha1.GroupVersion.String(), Kind: "ProxyScope",
				Name: keeper.Name, UID: keeper.UID, Controller: ptr.To(true)}}},
		Data: map[string]string{"envoy.yaml": "phoenix's"},
	}
	create(t, theirs, scope("usurper"))
	ps := expectCondition(t, "again", "usurper", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonBootstrapConfigMapConflict)
	want := fmt.Sprintf("is controlled by ProxyScope again/phoenix (uid %s)", keeper.UID)
	if c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionDegraded); !strings.Contains(c.Message, want) {
		t.Errorf("the conflict message %q does not name the owner (%q)", c.Message, want)
	}
	got := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(theirs), got); err != nil || got.Data["envoy.yaml"] != "phoenix's" {
		t.Errorf("the other scope's ConfigMap was changed: %v %v", got.Data, err)
	}
}

// cacheBehind is a client whose cache has not seen any ConfigMap yet: a
// Get of one finds nothing, as right after another writer created it.
type cacheBehind struct{ client.Client }

func (c cacheBehind) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.ConfigMap); ok {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestBootstrapConfigMapNotCachedYetIsNoConflict checks that a scope whose
// ConfigMap name is taken by one of scopeplane's own, which the cache does
// not show yet, is not told the ConfigMap lacks scopeplane's label: it is
// tried again shortly, when the cache shows who controls it.
func TestBootstrapConfigMapNotCachedYetIsNoConflict(t *testing.T) {
	ctx := context.Background()
	owner := &xdsv1alpha1.ProxyScope{
		ObjectMeta: metav1.ObjectMeta{Namespace: "behind", Name: "owner"},
		Spec: xdsv1alpha1.ProxyScopeSpec{
			Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}},
			Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
		},
	}
	late := owner.DeepCopy()
	late.Name = "late"
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "behind"}}, owner)
	owner = getScope(t, "behind", "owner")
	create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "behind", Name: bootstrap.ConfigMapName("late"),
		Labels: map[string]string{bootstrapconfig.ManagedByLabel: bootstrapconfig.ManagedBy},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: xdsv1alpha1.GroupVersion.String(), Kind: "ProxyScope",
			Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}}}, late)
	r := &bootstrapconfig.Reconciler{Client: cacheBehind{env.Client}, APIReader: env.Client, XDSServer: "xds.invalid:1", Conflicts: bootstrapconfig.NewConflicts()}
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "behind", Name: "late"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Conflicts.Get(model.Key{Namespace: "behind", Name: "late"}); got != "" {
		t.Errorf("conflict %q for a ConfigMap the cache has not seen yet", got)
	}
	if res.RequeueAfter <= 0 {
		t.Errorf("not tried again: %+v", res)
	}
}
