package feedback

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Two replicas' Summaries add up to what one tracker holding all their
// proxies would report.
func TestMergeAddsUpReplicas(t *testing.T) {
	key := model.Key{Namespace: "shop", Name: "web"}
	clock := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	a, b, all := New(time.Minute), New(time.Minute), New(time.Minute)
	for _, tr := range []*Tracker{a, b, all} {
		tr.now = func() time.Time { return clock }
	}
	connect := func(tr *Tracker, node string, p model.Protocol, version string) uint64 {
		id := tr.Connect(key, &corev3.Node{Id: node}, p, "", "", model.Location{})
		tr.AtVersion(key, id, version, time.Time{})
		tr.Sent(key, p, "t", Push{Resources: 1, Bytes: 100, OtherBytes: 80, Connect: true})
		return id
	}
	for i, tr := range []*Tracker{a, b} {
		for j := range 3 {
			node := fmt.Sprintf("r%d-%d", i, j)
			version := []string{"v1", "v1", "v0"}[j]
			connect(tr, node, model.SotW, version)
			connect(all, node, model.SotW, version)
		}
	}
	connect(b, "delta", model.Delta, "v1")
	connect(all, "delta", model.Delta, "v1")
	clock = clock.Add(time.Second)
	for _, tr := range []*Tracker{b, all} {
		id := tr.Connect(key, &corev3.Node{Id: "bad"}, model.SotW, "", "", model.Location{})
		tr.NACKed(key, id, "t", "v1", "bad", HeldBack{Resources: 2})
		tr.Refuse(key, RefusedWrongProto)
	}
	clock = clock.Add(2 * time.Minute) // the pushes' bucket is complete

	got, want := Merge(a.Summary(key), b.Summary(key)), all.Summary(key)
	if c, s := got.Connected("v1"); c != 8 || s != 5 {
		t.Errorf("merged: %d connected, %d at v1; want 8 and 5", c, s)
	}
	if fmt.Sprint(got.Proxies) != fmt.Sprint(want.Proxies) || got.NackingCount != want.NackingCount || fmt.Sprint(got.Nacking) != fmt.Sprint(want.Nacking) {
		t.Errorf("merged proxies %v, nacking %d %v; one tracker: %v, %d %v", got.Proxies, got.NackingCount, got.Nacking, want.Proxies, want.NackingCount, want.Nacking)
	}
	if got.Cost != want.Cost {
		t.Errorf("merged cost %+v, one tracker %+v", got.Cost, want.Cost)
	}
	if got.Refused[RefusedWrongProto] != 1 || !got.LastRefused[RefusedWrongProto].Equal(want.LastRefused[RefusedWrongProto]) || len(got.NACKs) != 1 {
		t.Errorf("merged refusals %v %v, NACKs %v", got.Refused, got.LastRefused, got.NACKs)
	}
	if got.Speaking(model.Delta) != 1 || !got.LastPush.Equal(want.LastPush) {
		t.Errorf("merged: %d delta proxies, last push %v; want 1, %v", got.Speaking(model.Delta), got.LastPush, want.LastPush)
	}
}

// The newest NACKs of all replicas are kept, newest first.
func TestMergeKeepsTheNewestNACKs(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var a, b Summary
	for i := range MaxNACKs {
		a.NACKs = append([]NACK{{Detail: fmt.Sprint("a", i), Time: t0.Add(time.Duration(2*i) * time.Second)}}, a.NACKs...)
		b.NACKs = append([]NACK{{Detail: fmt.Sprint("b", i), Time: t0.Add(time.Duration(2*i+1) * time.Second)}}, b.NACKs...)
	}
	got := Merge(a, b).NACKs
	if len(got) != MaxNACKs || got[0].Detail != fmt.Sprint("b", MaxNACKs-1) || got[1].Detail != fmt.Sprint("a", MaxNACKs-1) {
		t.Fatalf("merged NACKs %v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Time.After(got[i-1].Time) {
			t.Fatalf("merged NACKs not newest first: %v", got)
		}
	}
}
