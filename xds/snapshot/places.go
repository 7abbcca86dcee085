package snapshot

import (
	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// marshalPlaces marshals the place views' upserts of an update. An
// assignment that cannot be served is not applied, so its place keeps the
// version it had: it has the endpoints of the scope-wide one of its name,
// which is held back the same way (see Unservable).
func marshalPlaces(u *catalog.Update) map[model.Place][]marshalled {
	if len(u.Places) == 0 {
		return nil
	}
	out := make(map[model.Place][]marshalled, len(u.Places))
	for place, pc := range u.Places {
		for name, msg := range pc.Upserted {
			value, err := servable(msg)
			if err != nil {
				metrics.UnservableResources.WithLabelValues(xdstype.Endpoint.URL()).Inc()
				continue
			}
			out[place] = append(out[place], marshalled{name: name, value: value, hash: hash64(value)})
		}
	}
	return out
}

// placeNames returns the assignment names whose contribution to a place
// view (placeState.contribution) the update can change: those of the
// views' own changes, and of the scope-wide assignments and of the clusters
// their versions follow. all says it can change every name.
func placeNames(u *catalog.Update) (names map[string]struct{}, all bool) {
	if u.Reset {
		return nil, true
	}
	names = map[string]struct{}{}
	add := func(n string) { names[n] = struct{}{} }
	for _, t := range []xdstype.Type{xdstype.Cluster, xdstype.Endpoint} {
		for n := range u.Upserted[t] {
			add(n)
		}
		for _, n := range u.Removed[t] {
			add(n)
		}
	}
	for _, pc := range u.Places {
		for n := range pc.Upserted {
			add(n)
		}
		for _, n := range pc.Removed {
			add(n)
		}
	}
	return names, false
}

// account adds (sign 1) or takes out (sign -1) the contributions of the
// given names, or of all names, to every place view's delta: taken out
// before an update changes them and added after, it keeps the deltas exact
// at a cost proportional to the update.
func (s *Snapshot) account(names map[string]struct{}, all bool, sign int) {
	base := &s.types[xdstype.Endpoint]
	one := func(ps *placeState, name string) {
		d, n := ps.contribution(base, name)
		ps.delta ^= d
		ps.sotwDelta += sign * n
	}
	for _, ps := range s.places {
		if all {
			ps.res.all(func(r *Resource) { one(ps, r.Name) })
			continue
		}
		for name := range names {
			one(ps, name)
		}
	}
}

// placeOrigin is the provenance of a place view's assignment named name:
// that of the scope-wide assignment of the name, which the view shows as
// proxies at the place see it (translate.Resources.Places), as the scope
// holds it or, held back, as the update brings it.
func (s *Snapshot) placeOrigin(u *catalog.Update, name string) *model.Origin {
	if r := s.types[xdstype.Endpoint].res.get(name); r != nil {
		return r.From
	}
	return u.From[xdstype.Endpoint][name]
}

// applyPlaces applies an update's place views, versioned like the
// scope-wide assignments (following the cluster of the same name), and
// returns the log entries of the names whose view changed. clusters are the
// clusters this revision changed: a view's assignment the update left alone
// is re-versioned when its cluster changed, as a scope-wide one is.
func (s *Snapshot) applyPlaces(u *catalog.Update, upserts map[model.Place][]marshalled, clusters map[string]struct{}, rev uint64) []logEntry {
	var changes []logEntry
	parent := &s.types[xdstype.Cluster]
	touched := map[model.Place]map[string]struct{}{}
	put := func(place model.Place, name string, m *Resource) {
		ps := s.places[place]
		if ps == nil {
			ps = &placeState{}
			s.places[place] = ps
		}
		if old := ps.res.get(name); old != nil {
			if old.Version == m.Version {
				return
			}
			ps.digest ^= nameDigest(name, old.Version)
		}
		ps.res = ps.res.set(m)
		ps.digest ^= nameDigest(name, m.Version)
		if touched[place] == nil {
			touched[place] = map[string]struct{}{}
		}
		touched[place][name] = struct{}{}
		changes = append(changes, logEntry{rev: rev, typ: xdstype.Endpoint, name: name})
	}
	remove := func(place model.Place, name string) {
		ps := s.places[place]
		old := ps.get(name)
		if old == nil {
			return
		}
		ps.digest ^= nameDigest(name, old.Version)
		ps.res = ps.res.remove(name)
		if ps.res.Len() == 0 {
			delete(s.places, place)
		}
		changes = append(changes, logEntry{rev: rev, typ: xdstype.Endpoint, name: name})
	}
	if u.Reset {
		for place, ps := range s.places {
			ps.res.all(func(r *Resource) {
				if _, ok := u.Places[place].Upserted[r.Name]; !ok {
					remove(place, r.Name)
				}
			})
		}
	}
	for place, pc := range u.Places {
		for _, name := range pc.Removed {
			remove(place, name)
		}
	}
	for place, ms := range upserts {
		for _, m := range ms {
			version := resourceVersion(m.hash, parent, m.name)
			r := NewResource(xdstype.Endpoint, m.name, version, m.value)
			r.From = s.placeOrigin(u, m.name)
			put(place, m.name, r)
		}
	}
	for name := range clusters {
		for place, ps := range s.places {
			r := ps.res.get(name)
			if r == nil {
				continue
			}
			if _, done := touched[place][name]; done {
				continue
			}
			value := r.Value()
			again := NewResource(xdstype.Endpoint, name, resourceVersion(hash64(value), parent, name), value)
			again.From = r.From
			put(place, name, again)
		}
	}
	return changes
}
