package snapshot

import (
	"fmt"
	"maps"
	"math/rand/v2"
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
