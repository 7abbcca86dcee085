package metrics_test

import (
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// scopeSeries counts the series of the registry that carry a scope label:
// in all, and per scope label value.
func scopeSeries(t *testing.T) (total int, per map[string]int) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	per = map[string]int{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "scope" {
					total++
					per[l.GetValue()]++
				}
			}
		}
	}
	return total, per
}

// reset empties every per-scope series.
func reset() {
	for _, v := range []interface{ Reset() }{metrics.ConnectedProxies, metrics.Pushes, metrics.ResourcesSent, metrics.BytesSent, metrics.OtherProtocolBytes,
		metrics.ConnectBytes, metrics.ConnectOtherProtocolBytes, metrics.HeldBack, metrics.OtherProtocolHeldBack, metrics.NACKs, metrics.NACKsPaced,
		metrics.Refusals, metrics.ScopeCondition, metrics.StatusWriteFailures} {
		v.Reset()
	}
}

// serve records for each of n scopes what a busy scope has: a proxy of
// each protocol, sent clusters, assignments, listeners and routes on
// connecting and once more after, one
// NACK of one of them, the four conditions (Ready False for every
// hundredth scope), and a status write that failed once.
func serve(n int) {
	tr := feedback.New(0)
	for i := range n {
		key := model.Key{Namespace: fmt.Sprintf("tenant-%04d", i%1000), Name: fmt.Sprintf("scope-%05d", i)}
		scope := key.String()
		for _, p := range []model.Protocol{model.SotW, model.Delta} {
			id := tr.Connect(key, &corev3.Node{Id: fmt.Sprint(scope, p)}, p, "127.0.0.1:1", "", model.Location{})
			for _, ty := range []xdstype.Type{xdstype.Cluster, xdstype.Endpoint, xdstype.Listener, xdstype.Route} {
				url := ty.URL()
				tr.Sent(key, p, url, feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 120, Connect: true})
				tr.Sent(key, p, url, feedback.Push{Resources: 1, Bytes: 100, OtherBytes: 120})
			}
			if p == model.SotW {
				tr.NACKed(key, id, xdstype.Cluster.URL(), "v1", "bad", feedback.HeldBack{Resources: 1, OtherResources: 1})
			}
		}
		ready := i%100 != 0
		for cond, healthy := range map[string]bool{"Accepted": true, "Ready": ready, "Degraded": true, "Stalled": true} {
			v := 0.0
			if healthy == (cond == "Accepted" || cond == "Ready") {
				v = 1
			}
			metrics.SetCondition(scope, cond, v, healthy)
		}
		metrics.StatusWriteFailures.WithLabelValues(metrics.Scope(scope)).Inc()
	}
}

// TestScopeSeriesCount counts the series the per-scope metrics make at
// 10,000 scopes: with --metrics-scope-labels=all every scope adds its own,
// with none the series do not grow with the scopes but for an unhealthy
// condition's (which ScopeplaneScopeNotReady names the scope by).
func TestScopeSeriesCount(t *testing.T) {
	const scopes = 10_000
	t.Cleanup(func() {
		reset()
		_ = metrics.SetScopeLabels(metrics.ScopeLabelsAll)
	})
	if err := metrics.SetScopeLabels("some"); err == nil {
		t.Error("--metrics-scope-labels=some accepted")
	}

	reset()
	if err := metrics.SetScopeLabels(metrics.ScopeLabelsAll); err != nil {
		t.Fatal(err)
	}
	serve(scopes)
	all, per := scopeSeries(t)
	perScope := per["tenant-0001/scope-00001"]
	t.Logf("all: %d series per scope, %d in all at %d scopes", perScope, all, scopes)
	if len(per) != scopes || all != perScope*scopes {
		t.Errorf("all: %d series over %d scope values, %d for one scope: not every scope labelled alike", all, len(per), perScope)
	}

	reset()
	if err := metrics.SetScopeLabels(metrics.ScopeLabelsNone); err != nil {
		t.Fatal(err)
	}
	serve(scopes)
	none, per := scopeSeries(t)
	unhealthy := scopes / 100
	t.Logf("none: %d series at %d scopes: %d folded into scope=%q, %d of the %d scopes not Ready", none, scopes, per[metrics.FoldedScope], metrics.FoldedScope, none-per[metrics.FoldedScope], unhealthy)
	if none-per[metrics.FoldedScope] != unhealthy {
		t.Errorf("none: %d series name a scope, want the %d not Ready", none-per[metrics.FoldedScope], unhealthy)
	}
	if per[metrics.FoldedScope] > perScope {
		t.Errorf("none: %d folded series, more than one scope's %d", per[metrics.FoldedScope], perScope)
	}
}
