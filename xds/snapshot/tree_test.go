package snapshot

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// TestTree checks the persistent tree against a map through random sets
// and removals, that every earlier tree is left intact, and that changed
// names exactly the names whose resources differ between two trees.
func TestTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		trees []tree
		wants []map[string]*Resource
	)
	cur, m := tree{}, map[string]*Resource{}
	for step := range 3000 {
		name := fmt.Sprintf("n%d", rng.IntN(400))
		if rng.IntN(3) == 0 {
			cur = cur.remove(name)
			delete(m, name)
		} else {
			r := &Resource{Name: name, Version: fmt.Sprint(step)}
			cur = cur.set(r)
			m[name] = r
		}
		if step%100 == 0 {
			trees, wants = append(trees, cur), append(wants, maps.Clone(m))
		}
	}
	trees, wants = append(trees, cur), append(wants, m)
	for i, tr := range trees {
		want := wants[i]
		if tr.Len() != len(want) {
			t.Fatalf("tree %d: Len %d, want %d", i, tr.Len(), len(want))
		}
		got := map[string]*Resource{}
		tr.all(func(r *Resource) { got[r.Name] = r })
		if !maps.Equal(got, want) {
			t.Fatalf("tree %d: all differs from the map", i)
		}
		for k := range 450 {
			name := fmt.Sprintf("n%d", k)
			if tr.get(name) != want[name] {
				t.Fatalf("tree %d: get(%s) = %v, want %v", i, name, tr.get(name), want[name])
			}
		}
		if i == 0 {
			continue
		}
		prev := wants[i-1]
		var wantChanged []string
		for k := range 450 {
			name := fmt.Sprintf("n%d", k)
			if prev[name] != want[name] {
				wantChanged = append(wantChanged, name)
			}
		}
		seen := map[string]bool{}
		treeChanges(trees[i-1], tr, func(name string) { seen[name] = true })
		if got := slices.Sorted(maps.Keys(seen)); !slices.Equal(got, slices.Sorted(slices.Values(wantChanged))) {
			t.Fatalf("treeChanges(%d, %d) = %v, want %v", i-1, i, got, wantChanged)
		}
	}
}

// TestTreeCollisions uses a level beyond the hash: names that collide in
// all 64 bits are listed side by side.
func TestTreeCollisions(t *testing.T) {
	a, b := &Resource{Name: "a"}, &Resource{Name: "b"}
	n, _ := setNode(nil, tdepth, 7, a)
	n, _ = setNode(n, tdepth, 7, b)
	if len(n.slots) != 2 {
		t.Fatalf("collision node holds %d, want 2", len(n.slots))
	}
	n, _ = removeNode(n, tdepth, 7, "a")
	if len(n.slots) != 1 || n.slots[0].res != b {
		t.Fatalf("after removal: %+v", n.slots)
	}
}

// TestNewTreeIsTheTreeOfSets checks that building a tree at once gives the
// tree that setting its resources one by one gives, node for node, so that
// either compares with the other slot by slot (treeChanges).
func TestNewTreeIsTheTreeOfSets(t *testing.T) {
	for _, n := range []int{0, 1, 2, 33, 1000, 20000} {
		rs := make([]*Resource, n)
		seq := tree{}
		for i := range rs {
			rs[i] = &Resource{Name: fmt.Sprintf("shop/svc-%d:80", i)}
			seq = seq.set(rs[i])
		}
		bulk := newTree(slices.Clone(rs))
		if !reflect.DeepEqual(bulk, seq) {
			t.Fatalf("%d names: the tree built at once differs from the one set name by name", n)
		}
		changed := 0
		treeChanges(seq, bulk, func(string) { changed++ })
		if changed != 0 {
			t.Errorf("%d names: treeChanges finds %d differences", n, changed)
		}
	}
	// Colliding hashes below the last level, as setNode lists them.
	a, b := tslot{hash: 7, res: &Resource{Name: "a"}}, tslot{hash: 7, res: &Resource{Name: "b"}}
	seq, _ := setNode(nil, tdepth-tbits, 7, a.res)
	seq, _ = setNode(seq, tdepth-tbits, 7, b.res)
	if bulk := buildNode([]tslot{a, b}, tdepth-tbits); !reflect.DeepEqual(bulk, seq) {
		t.Errorf("colliding names: built %+v, set %+v", bulk, seq)
	}
}

// BenchmarkNewTree compares a scope's first revision of a type built at
// once with the same resources set one by one.
func BenchmarkNewTree(b *testing.B) {
	rs := make([]*Resource, 4000)
	for i := range rs {
		rs[i] = &Resource{Name: fmt.Sprintf("shop/svc-%d:80", i)}
	}
	b.Run("at-once", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = newTree(slices.Clone(rs))
		}
	})
	b.Run("one-by-one", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			tr := tree{}
			for _, r := range rs {
				tr = tr.set(r)
			}
		}
	})
}
