package controlplane_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestMetricsAfterScriptedSequence checks the metric values after a known
// sequence: a proxy syncs, NACKs, converges to a change, a wrong-protocol
// proxy is refused, and the proxy leaves.
func TestMetricsAfterScriptedSequence(t *testing.T) {
	const scope = "metrics/m"
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "metrics"}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "metrics", Name: "api"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: "metrics", Name: "m"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Selector: &metav1.LabelSelector{}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeProxylessGRPC},
			},
		},
	)
	expectCondition(t, "metrics", "m", xdsv1alpha1.ConditionAccepted, metav1.ConditionTrue, xdsv1alpha1.ReasonResolved)
	convergedBefore := histogramCount(t, "SotW")

	conn := dialXDS(t)
	c, _ := proxy(t, conn, adsclient.SotW, testkit.Node("m-1", scope), rejectFirst(xdstype.Route.URL()))
	expectCondition(t, "metrics", "m", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed)

	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		{"connected proxies", testutil.ToFloat64(metrics.ConnectedProxies.WithLabelValues(scope, "SotW")), 1},
		{"CDS pushes", testutil.ToFloat64(metrics.Pushes.WithLabelValues(scope, xdstype.Cluster.URL(), "SotW")), 1},
		{"LDS resources (two API listeners per port)", testutil.ToFloat64(metrics.ResourcesSent.WithLabelValues(scope, xdstype.Listener.URL(), "SotW")), 2},
		{"RDS NACKs", testutil.ToFloat64(metrics.NACKs.WithLabelValues(scope, xdstype.Route.URL())), 1},
		{"EDS bytes match what the proxy received", testutil.ToFloat64(metrics.BytesSent.WithLabelValues(scope, xdstype.Endpoint.URL(), "SotW")),
			float64(c.Stats().ByType[xdstype.Endpoint.URL()].Bytes)},
		// The first sync is all connects, and the RDS NACK held back the
		// one route configuration in either protocol.
		{"connect bytes are the bytes sent so far", testutil.ToFloat64(metrics.ConnectBytes.WithLabelValues(scope, "SotW")), float64(c.Stats().Bytes)},
		{"RDS resources held back by the NACK", testutil.ToFloat64(metrics.HeldBack.WithLabelValues(scope, "SotW")), 1},
		{"and in delta", testutil.ToFloat64(metrics.OtherProtocolHeldBack.WithLabelValues(scope, "SotW")), 1},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}

	// A change the proxy accepts brings it back in sync (recovering from a
	// NACK is not convergence); the next change converges, and is measured.
	addPort := func(name string, port int32) {
		mutate(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "metrics", Name: "api"}}, func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: name, Port: port})
		})
	}
	addPort("admin", 9000)
	ps := expectCondition(t, "metrics", "m", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonSynced)
	if got := testutil.ToFloat64(metrics.Pushes.WithLabelValues(scope, xdstype.Cluster.URL(), "SotW")); got != 2 {
		t.Errorf("CDS pushes after the change: %v, want 2", got)
	}
	addPort("debug", 9001)
	testkit.Eventually(t, "a new version, synced", func() (bool, string) {
		cur := getScope(t, "metrics", "m")
		return cur.Status.Version != ps.Status.Version && cur.Status.SyncedProxies == 1, cur.Status.Version
	})
	if got := testutil.ToFloat64(metrics.OtherProtocolBytes.WithLabelValues(scope, xdstype.Cluster.URL(), "SotW")); got <= 0 {
		t.Errorf("scopeplane_xds_other_protocol_bytes_total for CDS: %v, want the delta responses priced", got)
	}
	if got := histogramCount(t, "SotW"); got <= convergedBefore {
		t.Errorf("convergence observations for SotW: %d, want more than %d", got, convergedBefore)
	}

	// A delta proxy on this SotW scope is refused and counted.
	_, done := proxy(t, conn, adsclient.Delta, testkit.Node("m-2", scope), nil)
	if err := <-done; err == nil {
		t.Error("a delta stream on a SotW scope was not refused")
	}
	if got := testutil.ToFloat64(metrics.Refusals.WithLabelValues(scope, "WrongProtocol")); got != 1 {
		t.Errorf("refusals: %v, want 1", got)
	}
	if got := testutil.ToFloat64(metrics.ScopeCondition.WithLabelValues(scope, xdsv1alpha1.ConditionReady)); got != 1 {
		t.Errorf("scopeplane_scope_condition{condition=Ready}: %v, want 1", got)
	}
	// The gRPC interceptor's standard metrics count the refusal by its code.
	if got := gathered(t, "grpc_server_handled_total", map[string]string{"grpc_method": "DeltaAggregatedResources", "grpc_code": "FailedPrecondition"}); got < 1 {
		t.Errorf("grpc_server_handled_total{DeltaAggregatedResources, FailedPrecondition} = %v, want at least 1", got)
	}
	metrics.SetBuildInfo("test") // main sets it; the in-process control plane does not run main
	checkAlertsAndDashboard(t)
}

// rejectFirst NACKs the first response of typeURL.
func rejectFirst(typeURL string) func(string, []*anypb.Any, []string) string {
	done := false
	return func(t string, _ []*anypb.Any, _ []string) string {
		if t == typeURL && !done {
			done = true
			return "rejected by the test"
		}
		return ""
	}
}

// histogramCount returns how many observations the convergence histogram
// holds for a protocol, read from the registry the metrics endpoint serves.
func histogramCount(t *testing.T, protocol string) uint64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "scopeplane_xds_convergence_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "protocol" && l.GetValue() == protocol {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// checkAlertsAndDashboard parses every expression of the chart's alert rules
// and dashboard with Prometheus' own parser, and checks that each names only
// metrics the control plane exports, as gathered from the registry the
// metrics endpoint serves after the scripted sequence (so every series
// family has samples).
func checkAlertsAndDashboard(t *testing.T) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[f.GetName()+s] = true
			}
		}
	}
	var exprs []string
	rules, err := os.ReadFile("../../charts/scopeplane/files/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(rules, &spec); err != nil {
		t.Fatalf("files/alerts.yaml: %v", err)
	}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	board, err := os.ReadFile("../../charts/scopeplane/files/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(board, &dashboard); err != nil {
		t.Fatalf("files/dashboard.json: %v", err)
	}
	// Grafana substitutes its variables before the query reaches Prometheus.
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$scope", ".*")
	for _, p := range dashboard.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, grafana.Replace(tg.Expr))
		}
	}
	promql := parser.NewParser(parser.Options{})
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions found in the alerts and the dashboard", len(exprs))
	}
	for _, e := range exprs {
		parsed, err := promql.ParseExpr(e)
		if err != nil {
			t.Errorf("%q does not parse: %v", e, err)
			continue
		}
		parser.Inspect(parsed, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && !exported[vs.Name] {
				t.Errorf("%q names %s, which the control plane does not export", e, vs.Name)
			}
			return nil
		})
	}
}

// gathered returns the value of the counter family name whose labels
// include want, read from the registry the metrics endpoint serves.
func gathered(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					match++
				}
			}
			if match == len(want) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
