package snapshot

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
)

// tree is a persistent map from names to resources, a hash array mapped
// trie: set and remove return a new tree and leave the old one intact,
// sharing every node but those on the path to the changed name. A stream
// keeps the tree of the revision it brought its proxy to by reference
// (TypeSet), which costs it nothing while the scope moves on, and the
// scope only the nodes that changed since; two trees are compared in time
// proportional to what differs (treeChanges), since shared nodes are equal.
// Its shape depends only on its names (remove collapses what set would not
// have built), so two trees of the same names compare slot by slot.
type tree struct {
	root *tnode
	n    int
}

// tnode is one level of the trie: slots indexed by 5 bits of the name's
// hash, present where bits has a 1, in order. Below the hash's 64 bits
// (shift ≥ 64) a node lists colliding names instead.
type tnode struct {
	bits  uint32
	slots []tslot
}

// tslot is a leaf (res) or a subtree (sub).
type tslot struct {
	hash uint64
	res  *Resource
	sub  *tnode
}

const (
	tbits  = 5
	tmask  = 1<<tbits - 1
	tdepth = 64 // a shift at or beyond it lists collisions
)

// treeSeed keys the trie's hash per process, so that no one can choose
// names that collide and pile up in one slot.
var treeSeed = maphash.MakeSeed()

func nameHash(name string) uint64 { return maphash.String(treeSeed, name) }

// Len is how many names the tree holds.
func (t tree) Len() int { return t.n }

// get returns the resource of that name, or nil.
func (t tree) get(name string) *Resource {
	h, n := nameHash(name), t.root
	for shift := uint(0); n != nil; shift += tbits {
		if shift >= tdepth {
			for _, s := range n.slots {
				if s.res.Name == name {
					return s.res
				}
			}
			return nil
		}
		bit := uint32(1) << (h >> shift & tmask)
		if n.bits&bit == 0 {
			return nil
		}
		s := n.slots[bits.OnesCount32(n.bits&(bit-1))]
		if s.sub == nil {
			if s.res.Name == name {
				return s.res
			}
			return nil
		}
		n = s.sub
	}
	return nil
}

// set returns the tree with r under its name.
func (t tree) set(r *Resource) tree {
	root, added := setNode(t.root, 0, nameHash(r.Name), r)
	if added {
		t.n++
	}
	t.root = root
	return t
}

func setNode(n *tnode, shift uint, h uint64, r *Resource) (*tnode, bool) {
	if shift >= tdepth {
		out := &tnode{slots: make([]tslot, 0, len(n.slotsOrNil())+1)}
		added := true
		for _, s := range n.slotsOrNil() {
			if s.res.Name == r.Name {
				s.res, added = r, false
			}
			out.slots = append(out.slots, s)
		}
		if added {
			out.slots = append(out.slots, tslot{hash: h, res: r})
		}
		return out, added
	}
	if n == nil {
		return &tnode{bits: 1 << (h >> shift & tmask), slots: []tslot{{hash: h, res: r}}}, true
	}
	bit := uint32(1) << (h >> shift & tmask)
	i := bits.OnesCount32(n.bits & (bit - 1))
	if n.bits&bit == 0 {
		out := &tnode{bits: n.bits | bit, slots: make([]tslot, len(n.slots)+1)}
		copy(out.slots, n.slots[:i])
		out.slots[i] = tslot{hash: h, res: r}
		copy(out.slots[i+1:], n.slots[i:])
		return out, true
	}
	out := &tnode{bits: n.bits, slots: append([]tslot(nil), n.slots...)}
	s := &out.slots[i]
	switch {
	case s.sub != nil:
		sub, added := setNode(s.sub, shift+tbits, h, r)
		s.sub = sub
		return out, added
	case s.res.Name == r.Name:
		s.res = r
		return out, false
	}
	// Two names share this slot: push both a level down.
	sub, _ := setNode(nil, shift+tbits, s.hash, s.res)
	sub, _ = setNode(sub, shift+tbits, h, r)
	*s = tslot{sub: sub}
	return out, true
}

// newTree builds the tree of rs, whose names are distinct, at once: the
// tree that setting them one by one would build (its shape depends only on
// its names), without the path copies that every set makes and the next
// one drops. A scope's first revision holds thousands of resources of a
// type, and a start builds every scope's.
func newTree(rs []*Resource) tree {
	leaves := make([]tslot, len(rs))
	for i, r := range rs {
		leaves[i] = tslot{hash: nameHash(r.Name), res: r}
	}
	return tree{root: buildNode(leaves, 0), n: len(rs)}
}

// buildNode builds the node at shift of the leaves whose hashes agree on
// every bit below it: each leaf alone in its slot stays a leaf, two or
// more in one slot go a level down, as setNode would have put them. It
// reorders leaves.
func buildNode(leaves []tslot, shift uint) *tnode {
	switch {
	case len(leaves) == 0:
		return nil
	case shift >= tdepth:
		return &tnode{slots: slices.Clone(leaves)}
	}
	chunk := func(s tslot) uint64 { return s.hash >> shift & tmask }
	slices.SortStableFunc(leaves, func(a, b tslot) int { return cmp.Compare(chunk(a), chunk(b)) })
	n := &tnode{}
	for i := 0; i < len(leaves); {
		j := i + 1
		for j < len(leaves) && chunk(leaves[j]) == chunk(leaves[i]) {
			j++
		}
		n.bits |= 1 << chunk(leaves[i])
		if j-i == 1 {
			n.slots = append(n.slots, leaves[i])
		} else {
			n.slots = append(n.slots, tslot{sub: buildNode(leaves[i:j], shift+tbits)})
		}
		i = j
	}
	return n
}

func (n *tnode) slotsOrNil() []tslot {
	if n == nil {
		return nil
	}
	return n.slots
}

// remove returns the tree without name.
func (t tree) remove(name string) tree {
	root, removed := removeNode(t.root, 0, nameHash(name), name)
	if removed {
		t.n--
		t.root = root
	}
	return t
}

// removeNode returns n without name (nil when that empties it) and whether
// it held name. A subtree left with one leaf becomes that leaf, so the
// shape stays the one set would have built.
func removeNode(n *tnode, shift uint, h uint64, name string) (*tnode, bool) {
	if n == nil {
		return nil, false
	}
	if shift >= tdepth {
		for i, s := range n.slots {
			if s.res.Name == name {
				if len(n.slots) == 1 {
					return nil, true
				}
				out := &tnode{slots: append(append([]tslot(nil), n.slots[:i]...), n.slots[i+1:]...)}
				return out, true
			}
		}
		return n, false
	}
	bit := uint32(1) << (h >> shift & tmask)
	if n.bits&bit == 0 {
		return n, false
	}
	i := bits.OnesCount32(n.bits & (bit - 1))
	s := n.slots[i]
	if s.sub == nil {
		if s.res.Name != name {
			return n, false
		}
		if len(n.slots) == 1 {
			return nil, true
		}
		return &tnode{bits: n.bits &^ bit, slots: append(append([]tslot(nil), n.slots[:i]...), n.slots[i+1:]...)}, true
	}
	sub, removed := removeNode(s.sub, shift+tbits, h, name)
	if !removed {
		return n, false
	}
	out := &tnode{bits: n.bits, slots: append([]tslot(nil), n.slots...)}
	switch {
	case sub == nil:
		out.bits &^= bit
		out.slots = append(out.slots[:i], out.slots[i+1:]...)
		if len(out.slots) == 0 {
			return nil, true
		}
	case len(sub.slots) == 1 && sub.slots[0].sub == nil:
		out.slots[i] = sub.slots[0] // a lone leaf moves up
	default:
		out.slots[i] = tslot{sub: sub}
	}
	return out, true
}

// all calls fn for every resource, in no particular order.
func (t tree) all(fn func(*Resource)) { t.root.all(fn) }

func (n *tnode) all(fn func(*Resource)) {
	for _, s := range n.slotsOrNil() {
		if s.sub != nil {
			s.sub.all(fn)
		} else {
			fn(s.res)
		}
	}
}

// treeChanges calls fn for every name whose resource differs between a and b
// (held by one of them only, or as different Resources), possibly more
// than once, skipping the nodes they share.
func treeChanges(a, b tree, fn func(name string)) { changedNodes(a.root, b.root, fn) }

func changedNodes(a, b *tnode, fn func(name string)) {
	if a == b {
		return
	}
	if a == nil || b == nil || a.bits == 0 || b.bits == 0 {
		// One side is empty, or this is the collision level: by name.
		changedByName(a, b, fn)
		return
	}
	for m := a.bits | b.bits; m != 0; m &= m - 1 {
		bit := m & -m
		sa, inA := a.slot(bit)
		sb, inB := b.slot(bit)
		switch {
		case !inA:
			sb.all(fn)
		case !inB:
			sa.all(fn)
		case sa.sub != nil && sb.sub != nil:
			changedNodes(sa.sub, sb.sub, fn)
		case sa.sub == nil && sb.sub == nil:
			if sa.res != sb.res {
				fn(sa.res.Name)
				if sb.res.Name != sa.res.Name {
					fn(sb.res.Name)
				}
			}
		default:
			changedByName(sa.node(), sb.node(), fn)
		}
	}
}

// changedByName is changedNodes for nodes of different shapes.
func changedByName(a, b *tnode, fn func(name string)) {
	inA := map[string]*Resource{}
	a.all(func(r *Resource) { inA[r.Name] = r })
	b.all(func(r *Resource) {
		if prev, ok := inA[r.Name]; !ok || prev != r {
			fn(r.Name)
		}
		delete(inA, r.Name)
	})
	for name := range inA {
		fn(name)
	}
}

// slot returns the slot of bit, if present.
func (n *tnode) slot(bit uint32) (tslot, bool) {
	if n.bits&bit == 0 {
		return tslot{}, false
	}
	return n.slots[bits.OnesCount32(n.bits&(bit-1))], true
}

// all calls fn with the name of every resource under the slot.
func (s tslot) all(fn func(name string)) {
	if s.sub == nil {
		fn(s.res.Name)
		return
	}
	s.sub.all(func(r *Resource) { fn(r.Name) })
}

// node is the slot as a node of its own: its subtree, or one leaf.
func (s tslot) node() *tnode {
	if s.sub != nil {
		return s.sub
	}
	return &tnode{slots: []tslot{s}}
}
