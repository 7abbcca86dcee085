package server

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestHoldingIsTheMapItReplaced drives one subscription through random
// scope revisions, responses (a new stream's first among them),
// rejections, settles and subscription changes
// (names added and removed, to and from a wildcard), next to the plain
// maps a stream used to keep, and checks after every step that what the
// subscription says its proxy holds, and the names it subscribes to, are
// what the maps say.
func TestHoldingIsTheMapItReplaced(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { holdingRun(t, seed) })
	}
}

func holdingRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	const typ, universe = xdstype.Endpoint, 24
	name := func() string { return fmt.Sprintf("default/svc-%d:80", rng.IntN(universe)) }
	key := model.Key{Namespace: "default", Name: "scope"}
	store := snapshot.NewStore()
	b := snapshot.NewBuilder(catalog.New(), store, 0)
	spec := &model.Scope{Key: key, Protocol: model.Delta}
	revise := func() {
		u := catalog.Update{Key: key, Scope: spec}
		u.Upserted[typ] = map[string]proto.Message{}
		for range 1 + rng.IntN(6) {
			n := name()
			if rng.IntN(4) == 0 {
				u.Removed[typ] = append(u.Removed[typ], n)
				continue
			}
			cla := &endpointv3.ClusterLoadAssignment{ClusterName: n}
			for i := range rng.IntN(3) { // a new content, most of the time
				cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{Priority: uint32(i)})
			}
			u.Upserted[typ][n] = cla
		}
		b.Apply([]catalog.Update{u})
	}
	revise()
	var set snapshot.TypeSet
	var served snapshot.Names
	read := func() {
		store.Get(key).Read(func(v snapshot.View) { set, served = v.Set(typ), v.Names(typ) })
	}
	read()

	s := newSubscription(typ)
	held := map[string]*snapshot.Resource{} // what the stream used to keep
	names := map[string]struct{}{}
	wildcard := false
	subscribed := func(n string) bool {
		_, ok := names[n]
		return wildcard || ok
	}
	forget := func() {
		s.forgetUnsubscribed()
		for n := range held {
			if !subscribed(n) {
				delete(held, n)
			}
		}
	}
	for step := range 400 {
		switch rng.IntN(10) {
		case 0:
			revise()
			read()
		case 1: // a response carried the current resource, or a removal
			n := name()
			if r := set.Get(n); r != nil {
				s.sent(r)
				held[n] = r
			} else {
				s.hold(n, nil)
				delete(held, n)
			}
		case 2: // a claimed version the scope does not serve
			n := name()
			r := &snapshot.Resource{Name: n, Version: "claimed"}
			s.hold(n, r)
			held[n] = r
		case 3:
			s.settle(set)
			s.names.share(served)
		case 4: // a full set, as SotW sends one
			s.holdSet(set)
			held = map[string]*snapshot.Resource{}
			set.All(func(r *snapshot.Resource) {
				if subscribed(r.Name) {
					held[r.Name] = r
				}
			})
		case 5: // exactly the names served, as Envoy subscribes, in SotW's way
			next := map[string]struct{}{}
			served.All(func(n string) { next[n] = struct{}{} })
			var added []string
			for n := range next {
				if !s.names.has(n) {
					added = append(added, n)
				}
			}
			s.subscribing(added, wildcard)
			s.names = ownNames(maps.Clone(next))
			s.names.share(served)
			names = next
			forget()
		case 6: // names subscribed, in delta's way
			var added []string
			for range 1 + rng.IntN(universe) {
				added = append(added, name())
			}
			s.subscribing(added, wildcard)
			for _, n := range added {
				s.names.add(n)
				names[n] = struct{}{}
			}
			s.names.share(served)
		case 7: // names unsubscribed
			for range 1 + rng.IntN(4) {
				n := name()
				s.names.remove(n)
				delete(names, n)
			}
			s.names.share(served)
			forget()
		case 8: // to or from a wildcard
			s.subscribing(nil, !wildcard)
			wildcard = !wildcard
			s.wildcard = wildcard
			forget()
		case 9: // a new stream, and often its first response
			s.holdNothing()
			clear(held)
			if rng.IntN(2) == 0 {
				var res []*snapshot.Resource
				set.All(func(r *snapshot.Resource) {
					if subscribed(r.Name) && rng.IntN(8) > 0 { // most often all of it
						res = append(res, r)
						held[r.Name] = r
					}
				})
				s.sentAll(res, set)
			}
		}
		for k := range universe {
			n := fmt.Sprintf("default/svc-%d:80", k)
			if got, want := s.heldRes(n), held[n]; got != want {
				t.Fatalf("step %d: holds %v of %s, the map %v", step, got, n, want)
			}
			if _, want := names[n]; s.names.has(n) != want {
				t.Fatalf("step %d: subscription has %s: %v, the map %v", step, n, !want, want)
			}
		}
		listed := map[string]*snapshot.Resource{}
		s.eachHeld(func(r *snapshot.Resource) { listed[r.Name] = r })
		if !maps.Equal(listed, held) || s.heldCount() != len(held) {
			t.Fatalf("step %d: eachHeld lists %d, the map holds %d", step, len(listed), len(held))
		}
		if s.names.len() != len(names) {
			t.Fatalf("step %d: %d names, the map %d", step, s.names.len(), len(names))
		}
	}
}
