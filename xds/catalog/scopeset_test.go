package catalog

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// TestScopeSetIsASet checks scopeSet against a map through random adds
// and removes that take it past its slice and back down, and that keys
// survives removing every scope it lists.
func TestScopeSetIsASet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() model.Key { return model.Key{Namespace: "ns", Name: fmt.Sprint(rng.IntN(3 * scopeSetFew))} }
	var s scopeSet
	want := map[model.Key]struct{}{}
	for step := range 5000 {
		k := key()
		if rng.IntN(2) == 0 {
			s.add(k)
			want[k] = struct{}{}
		} else {
			s.remove(k)
			delete(want, k)
		}
		got := slices.Collect(s.all())
		if s.len() != len(want) || len(got) != len(want) {
			t.Fatalf("step %d: len %d, all yields %d, want %d", step, s.len(), len(got), len(want))
		}
		for _, g := range got {
			if _, ok := want[g]; !ok || !s.has(g) {
				t.Fatalf("step %d: %v is not in the set", step, g)
			}
		}
		if probe := key(); s.has(probe) != (func() bool { _, ok := want[probe]; return ok })() {
			t.Fatalf("step %d: has(%v) = %v", step, probe, s.has(probe))
		}
	}
	for _, big := range []bool{false, true} {
		var s scopeSet
		n := scopeSetFew
		if big {
			n = 4 * scopeSetFew
		}
		for i := range n {
			s.add(model.Key{Namespace: "ns", Name: fmt.Sprint(i)})
		}
		for _, k := range s.keys() {
			s.remove(k)
		}
		if s.len() != 0 || len(slices.Collect(s.all())) != 0 {
			t.Errorf("%d scopes: %d left after removing every key listed", n, s.len())
		}
	}
}
