package shard

import (
	"fmt"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// keys are scopes named as teams name them: a few namespaces, many
// similar names, where a weak hash would cluster.
func keys(n int) []model.Key {
	out := make([]model.Key, n)
	for i := range out {
		out[i] = model.Key{Namespace: fmt.Sprintf("team-%d", i%37), Name: fmt.Sprintf("scope-%d", i)}
	}
	return out
}

// TestOfSpreadsEvenly checks that every shard gets its share of 20,000
// scopes within 10%, for every count up to 16.
func TestOfSpreadsEvenly(t *testing.T) {
	ks := keys(20000)
	for count := 1; count <= 16; count++ {
		per := make([]int, count)
		for _, k := range ks {
			s := Of(k, count)
			if s < 0 || s >= count {
				t.Fatalf("Of(%s, %d) = %d, outside the shards", k, count, s)
			}
			per[s]++
		}
		want := len(ks) / count
		for s, n := range per {
			if n < want*9/10 || n > want*11/10 {
				t.Errorf("%d shards: shard %d owns %d scopes, want %d ±10%% (all: %v)", count, s, n, want, per)
			}
		}
	}
}

// TestOfMovesOnlyWhatMust checks consistent hashing's promise: a shard
// added takes about 1/count of the scopes and no scope moves between the
// shards that were there; a shard removed (the last) gives only its own.
func TestOfMovesOnlyWhatMust(t *testing.T) {
	ks := keys(20000)
	for count := 1; count < 12; count++ {
		moved := 0
		for _, k := range ks {
			before, after := Of(k, count), Of(k, count+1)
			if before == after {
				continue
			}
			moved++
			if after != count {
				t.Fatalf("growing %d→%d shards moved %s from shard %d to %d, not to the new shard", count, count+1, k, before, after)
			}
		}
		want := len(ks) / (count + 1)
		if moved < want*9/10 || moved > want*11/10 {
			t.Errorf("growing %d→%d shards moved %d scopes, want about %d", count, count+1, moved, want)
		}
	}
}

func TestOfIsStableAndTakesCountBelowOneAsOne(t *testing.T) {
	k := model.Key{Namespace: "shop", Name: "edge"}
	if Of(k, 7) != Of(model.Key{Namespace: "shop", Name: "edge"}, 7) {
		t.Fatal("the same key landed on two shards")
	}
	for _, c := range []int{-1, 0, 1} {
		if got := Of(k, c); got != 0 {
			t.Errorf("Of(%s, %d) = %d, want 0", k, c, got)
		}
	}
	// The separator keeps namespace and name apart.
	a, b := model.Key{Namespace: "ab", Name: "c"}, model.Key{Namespace: "a", Name: "bc"}
	same := 0
	for c := 2; c < 40; c++ {
		if Of(a, c) == Of(b, c) {
			same++
		}
	}
	if same == 38 {
		t.Error("ab/c and a/bc share a shard at every count: the namespace and the name run together")
	}
}

func TestShardsOwnAndCheck(t *testing.T) {
	if !(Shards{}).Owns(model.Key{Namespace: "a", Name: "b"}) || (Shards{}).Sharded() {
		t.Fatal("the zero Shards must own every scope, unsharded")
	}
	s := Shards{Index: 1, Addresses: []string{"xds-0.ns.svc:18000", "xds-1.ns.svc:18000", "xds-2.ns.svc:18000"}}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	owned := 0
	for _, k := range keys(3000) {
		if s.Owns(k) {
			owned++
			if Of(k, 3) != 1 {
				t.Fatalf("shard 1 owns %s, which Of puts on shard %d", k, Of(k, 3))
			}
		}
	}
	if owned == 0 {
		t.Fatal("shard 1 of 3 owns nothing")
	}
	for _, bad := range []Shards{
		{Index: 3, Addresses: s.Addresses},
		{Index: -1},
		{Index: 1},
		{Addresses: []string{"xds-0:18000", "xds-1"}},
		{Addresses: []string{":18000", "x:1"}},
		{Addresses: []string{"a:0", "b:1"}},
		{Addresses: []string{"a:1", " b:1"}},
		{Addresses: []string{"a:1", "bad host!:1"}},
		{Addresses: []string{"a:1", "b:1", "a:1"}},
		{Addresses: []string{"[::1]:1", "[0::1]:1"}},
		{Addresses: []string{"a:18000", "a:018000"}},
		{Addresses: []string{"10.0.0.1:1", "[::ffff:10.0.0.1]:1"}},
		{Addresses: []string{"a:1", "[fe80::1%eth0]:1"}},
		{N: 3, Addresses: []string{"a:1", "b:1"}},
		{N: -1, Addresses: []string{"a:1", "b:1"}},
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v passed the check", bad)
		}
	}
}

// With more slots than shards, a scope's slot and address do not depend on
// the shard count, slot i belongs to shard i mod the count, and the scopes
// spread as the slots do: evenly over counts that divide the slots.
func TestSlotsKeepTheAddressAcrossCounts(t *testing.T) {
	var addrs []string
	for i := range 24 {
		addrs = append(addrs, fmt.Sprintf("slot-%d.ns.svc:18000", i))
	}
	ks := keys(24000)
	for n := 2; n <= 24; n++ {
		per := make([]int, n)
		for _, k := range ks {
			s := Shards{N: n, Addresses: addrs}
			if s.AddressOf(k) != addrs[Of(k, 24)] {
				t.Fatalf("%d shards: %s at %s, want its slot's %s", n, k, s.AddressOf(k), addrs[Of(k, 24)])
			}
			if s.ShardOf(k) != Of(k, 24)%n {
				t.Fatalf("%d shards: %s on shard %d, want slot %d mod %d", n, k, s.ShardOf(k), Of(k, 24), n)
			}
			per[s.ShardOf(k)]++
		}
		if 24%n != 0 {
			continue
		}
		for i, c := range per {
			if want := len(ks) / n; c < want*9/10 || c > want*11/10 {
				t.Errorf("%d shards of 24 slots: shard %d holds %d scopes, want %d within 10%%", n, i, c, want)
			}
		}
	}
	// One slot per shard is the shard: Of over the count.
	s := Shards{N: 3, Addresses: addrs[:3]}
	for _, k := range ks[:3000] {
		if s.ShardOf(k) != Of(k, 3) || s.AddressOf(k) != addrs[Of(k, 3)] {
			t.Fatalf("one slot per shard: %s on shard %d at %s, want %d", k, s.ShardOf(k), s.AddressOf(k), Of(k, 3))
		}
	}
	if (Shards{Addresses: addrs[:3]}).Count() != 3 {
		t.Fatal("without N, the count is one shard per address")
	}
}
