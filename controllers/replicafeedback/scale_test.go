package replicafeedback

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

// scaleScopes is how many scopes every replica serves a proxy of in
// TestEveryScopeCountedAtScale: twice what one ConfigMap held.
const scaleScopes = 10_000

// counted is how many of scopes the collector counts want proxies of, all
// at their version of step v (which scopes[i] says), and the first that
// is not.
func counted(c *Collector, scopes []model.Key, versions []int, want int) (int, string) {
	n, first := 0, ""
	for i, key := range scopes {
		s := feedback.Merge(c.Get(key)...)
		if all, synced := s.Connected(contentVersion(i, versions[i])); all == want && synced == want {
			n++
		} else if first == "" {
			first = fmt.Sprintf("%s: %d connected, %d at its version", key, all, synced)
		}
	}
	return n, first
}

// Three replicas each serve a proxy of every one of 10,000 scopes (the
// tenants layout): every replica's report reaches the leader through the
// API server, and every scope counts all three proxies; a change of some
// scopes' versions on one replica reaches the leader; a replica that stops
// leaves every count.
func TestEveryScopeCountedAtScale(t *testing.T) {
	ns := namespace(t, "scale")
	leader := collector(t, Replica{Name: "leader", Namespace: ns})
	scopes := make([]model.Key, scaleScopes)
	versions := make([]int, scaleScopes)
	for i := range scopes {
		scopes[i] = model.Key{Namespace: fmt.Sprintf("tenant-%04d", i%1000), Name: fmt.Sprintf("scope-%05d", i)}
	}
	replicas := []string{"r1", "r2", "r3"}
	trackers := map[string]*feedback.Tracker{}
	ids := map[string][]uint64{}
	stops := map[string]func(){}
	for _, name := range replicas {
		tr := feedback.New(0)
		trackers[name] = tr
		for i, key := range scopes {
			id := tr.Connect(key, &corev3.Node{Id: name + "-" + key.Name}, model.Delta, "127.0.0.1:1", "", model.Location{})
			tr.AtVersion(key, id, contentVersion(i, 0), time.Time{})
			ids[name] = append(ids[name], id)
		}
		p := &Publisher{Client: env.Client, Feedback: tr, Replica: Replica{Name: name, Namespace: ns}, Log: logr.Discard()}
		stops[name] = run(t, p.Start)
	}
	testkit.Eventually(t, "every scope counting the proxies of three replicas", func() (bool, string) {
		n, first := counted(leader, scopes, versions, len(replicas))
		return n == len(scopes), fmt.Sprintf("%d of %d scopes counted from %d replicas; first not: %s", n, len(scopes), leader.Replicas(), first)
	})

	// Every tenth scope's proxies move to a new version on every replica.
	for _, name := range replicas {
		for i := 0; i < len(scopes); i += 10 {
			trackers[name].AtVersion(scopes[i], ids[name][i], contentVersion(i, 1), time.Time{})
		}
	}
	for i := 0; i < len(scopes); i += 10 {
		versions[i] = 1
	}
	testkit.Eventually(t, "a thousand scopes' new versions counted", func() (bool, string) {
		n, first := counted(leader, scopes, versions, len(replicas))
		return n == len(scopes), fmt.Sprintf("%d of %d scopes counted; first not: %s", n, len(scopes), first)
	})

	stops["r1"]()
	testkit.Eventually(t, "a stopped replica's proxies leave every count", func() (bool, string) {
		n, first := counted(leader, scopes, versions, len(replicas)-1)
		return n == len(scopes), fmt.Sprintf("%d of %d scopes counted from %d replicas; first not: %s", n, len(scopes), leader.Replicas(), first)
	})
}

// One replica serves a proxy of each of 50,000 scopes: its report takes
// more than one part, every scope is counted, and a change of one scope
// reaches the leader.
func TestFiftyThousandScopesInParts(t *testing.T) {
	ns := namespace(t, "parts")
	leader := collector(t, Replica{Name: "leader", Namespace: ns})
	const n = 50_000
	scopes := make([]model.Key, n)
	versions := make([]int, n)
	ids := make([]uint64, n)
	tr := feedback.New(0)
	for i := range scopes {
		scopes[i] = model.Key{Namespace: fmt.Sprintf("tenant-%04d", i%1000), Name: fmt.Sprintf("scope-%05d", i)}
		ids[i] = tr.Connect(scopes[i], &corev3.Node{Id: scopes[i].Name}, model.Delta, "127.0.0.1:1", "", model.Location{})
		tr.AtVersion(scopes[i], ids[i], contentVersion(i, 0), time.Time{})
	}
	p := &Publisher{Client: env.Client, Feedback: tr, Replica: Replica{Name: "big", Namespace: ns}, Log: logr.Discard()}
	run(t, p.Start)
	testkit.Eventually(t, "every scope of 50,000 counted", func() (bool, string) {
		got, first := counted(leader, scopes, versions, 1)
		return got == n, fmt.Sprintf("%d of %d scopes counted; first not: %s", got, n, first)
	})
	var parts corev1.ConfigMapList
	if err := env.Client.List(context.Background(), &parts, client.InNamespace(ns), client.HasLabels{PartLabel}); err != nil {
		t.Fatal(err)
	}
	if len(parts.Items) < 2 {
		t.Errorf("%d parts for 50,000 scopes", len(parts.Items))
	}
	for _, cm := range parts.Items {
		t.Logf("%s: %d bytes", cm.Name, len(cm.BinaryData[PartKey]))
	}
	tr.AtVersion(scopes[12345], ids[12345], contentVersion(12345, 1), time.Time{})
	versions[12345] = 1
	testkit.Eventually(t, "one scope's new version counted", func() (bool, string) {
		got, first := counted(leader, scopes, versions, 1)
		return got == n, fmt.Sprintf("%d of %d scopes counted; first not: %s", got, n, first)
	})
}
