package snapshot

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"hash/fnv"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/keyset"
	"github.com/scopeplane/scopeplane/xds/metrics"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Store holds the served state of every scope.
type Store struct {
	mu      sync.RWMutex
	scopes  map[model.Key]*Snapshot
	changed *keyset.Set
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{scopes: map[model.Key]*Snapshot{}, changed: keyset.New()} }

// Changes holds the scopes whose served state or resolution changed; the
// status writer takes them.
func (st *Store) Changes() *keyset.Set { return st.changed }

// Get returns the scope, or nil when it does not exist (yet).
func (st *Store) Get(key model.Key) *Snapshot {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.scopes[key]
}

// Keys returns the scopes the store holds, in order (rejected scopes
// included: their placeholders carry the resolution that says why).
func (st *Store) Keys() []model.Key {
	st.mu.RLock()
	keys := slices.Collect(maps.Keys(st.scopes))
	st.mu.RUnlock()
	slices.SortFunc(keys, model.Key.Compare)
	return keys
}

// Builder applies the catalog's changes to the store: it is the only writer
// of every Scope.
type Builder struct {
	cat    *catalog.Catalog
	store  *Store
	window time.Duration
	built  chan struct{}
	whole  sync.Once
	// hold, when set, is called before each version after the first, and
	// returns when the catalog holds what its changes need (see SetHold).
	hold func(context.Context)
}

// SetHold makes Run call hold before it takes each batch of changes after
// the first build: a shard's Service caches wait there for a namespace its
// scopes newly reach to be listed (servicecache.Caches.Hold). Call it
// before Run.
func (b *Builder) SetHold(hold func(context.Context)) { b.hold = hold }

// NewBuilder returns a builder from cat into store. Changes that arrive
// within window of each other are applied as one revision per scope, so a
// burst of endpoint updates reaches proxies as one push. Under sustained
// churn the window widens (see nextWait), up to widest times window.
func NewBuilder(cat *catalog.Catalog, store *Store, window time.Duration) *Builder {
	return &Builder{cat: cat, store: store, window: window, built: make(chan struct{})}
}

// Built is closed after the first build that followed synced (see Run):
// from then on the store serves the whole cluster, not a part of it.
func (b *Builder) Built() <-chan struct{} { return b.built }

// Run applies changes until ctx ends. synced is closed when the catalog
// holds the whole cluster; the first build after it closes Built. Nothing
// is built before: nothing is served before (the server waits for Built),
// and building each batch of the initial listing as it arrived would build
// every scope again and again while a start fills the catalog, at a hundred
// thousand Services for minutes.
func (b *Builder) Run(ctx context.Context, synced <-chan struct{}) error {
	var (
		wait time.Duration
		last time.Time // when the last build ended
	)
	for {
		changed := b.cat.Changed()
		if synced != nil {
			changed = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-synced:
			synced = nil
			b.ApplyWhole(b.cat.Take())
			continue
		}
		observed := time.Now()
		wait = nextWait(wait, b.window, observed.Sub(last))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		if b.hold != nil {
			b.hold(ctx)
		}
		b.apply(b.cat.Take(), observed)
		last = time.Now()
	}
}

// widest bounds how far sustained churn widens the coalescing window, as a
// multiple of the configured one: 100 ms for the default 10 ms, Istio's
// debounce.
const widest = 10

// nextWait is how long to gather changes before the next build, the last
// wait having been prev and the last build having ended idle ago. A change
// that comes within the widest window of the last build means changes keep
// coming: the wait doubles, up to widest times base, so that every proxy is
// pushed a few versions a second rather than one per change (each costs a
// response per proxy, whatever it carries). A change after a quiet spell
// waits base again, so a lone change is as quick as ever.
func nextWait(prev, base, idle time.Duration) time.Duration {
	if base <= 0 || idle >= widest*base || prev < base {
		return base
	}
	return min(2*prev, widest*base)
}

// Apply versions and stores one batch of catalog updates. It takes the
// batch: each update is left with its key alone once applied (see apply).
func (b *Builder) Apply(updates []catalog.Update) { b.apply(updates, time.Now()) }

// ApplyWhole is Apply of a batch after which the catalog holds the whole
// cluster: it closes Built, once.
func (b *Builder) ApplyWhole(updates []catalog.Update) {
	b.apply(updates, time.Now())
	b.whole.Do(func() { close(b.built) })
}

// apply versions and stores a batch of updates, its scopes in parallel on
// every processor: each scope's revision is its own (its lock, its
// resources, its log), and the marshalling of a start's hundreds of
// thousands of resources is most of a first build. A batch holds one
// update per scope.
//
// Each update is cleared, but for its key, once its scope is applied: a
// start's batch names every resource of every scope in maps of its own
// (55 MB of the live heap at S=100,000 in the teams layout, with the
// messages they point at held by the catalog anyway), and holding all of
// them until the last scope is built put them on top of the finished
// snapshots, at the start's highest resident set.
func (b *Builder) apply(updates []catalog.Update, observed time.Time) {
	start := time.Now()
	var next atomic.Int64
	work := func() {
		for i := next.Add(1) - 1; i < int64(len(updates)); i = next.Add(1) - 1 {
			b.applyScope(&updates[i], observed)
			updates[i] = catalog.Update{Key: updates[i].Key}
		}
	}
	var wg sync.WaitGroup
	for range min(len(updates), runtime.GOMAXPROCS(0)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	metrics.SnapshotBuild.Observe(time.Since(start).Seconds())
	for i := range updates {
		b.store.changed.Add(updates[i].Key)
	}
}

// marshalled is a resource marshalled for the scope, before it is
// versioned: its name, its encoded value and that value's hash, and the
// Service port it was translated from (nil for the scope's own).
type marshalled struct {
	name  string
	value []byte
	hash  uint64
	from  *model.Origin
}

// applyScope applies one scope's update as one revision, in steps: find the
// scope (or forget it), marshal the upserts, then under the scope's lock
// take the spec, remove, upsert, re-version what follows a changed parent,
// apply the place views, and publish the revision if anything changed.
func (b *Builder) applyScope(u *catalog.Update, observed time.Time) {
	sc := b.scopeFor(u)
	if sc == nil {
		return
	}
	// Marshal outside the scope's lock: streams keep reading meanwhile.
	upserts, bad := marshalUpserts(u)
	placeUpserts := marshalPlaces(u)

	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.recordUnservable(u, upserts, bad)
	names, allNames := placeNames(u)
	sc.account(names, allNames, -1)
	specChanged := sc.takeSpec(u)
	r := sc.begin()
	if u.Reset {
		r.removeUnlisted(u)
	}
	r.removeListed(u)
	r.upsert(upserts)
	r.changes = append(r.changes, sc.applyPlaces(u, placeUpserts, r.touched[xdstype.Cluster], r.rev)...)
	sc.account(names, allNames, 1)
	if len(r.changes) == 0 && !specChanged {
		return
	}
	sc.publish(r, observed)
}

// scopeFor returns the scope the update applies to, created if new, or nil
// when the update deletes or rejects it: then the scope is gone from the
// store (a rejected one leaves a placeholder that holds its resolution)
// and its streams are woken to find out.
func (b *Builder) scopeFor(u *catalog.Update) *Snapshot {
	b.store.mu.Lock()
	sc := b.store.scopes[u.Key]
	if u.Scope != nil {
		if sc == nil {
			sc = newSnapshot(u.Key)
			b.store.scopes[u.Key] = sc
		}
		b.store.mu.Unlock()
		return sc
	}
	delete(b.store.scopes, u.Key)
	if u.Resolution.Invalid != "" {
		// A rejected spec serves nothing, but its resolution is kept
		// for the status: a scope without a spec, which the server
		// refuses as it refuses one that does not exist.
		placeholder := newSnapshot(u.Key)
		placeholder.resolution = u.Resolution
		b.store.scopes[u.Key] = placeholder
	}
	b.store.mu.Unlock()
	if sc != nil {
		sc.mu.Lock()
		sc.deleted = true
		sc.wakeLocked()
		sc.mu.Unlock()
	}
	return nil
}

// marshalUpserts marshals the update's upserts as they will be served,
// each with its provenance, and returns apart those that cannot be served
// (see servable), which are held back.
func marshalUpserts(u *catalog.Update) (upserts [xdstype.Count][]marshalled, bad []Unservable) {
	for t := range xdstype.Count {
		for name, msg := range u.Upserted[t] {
			from := u.From[t][name]
			value, err := servable(msg)
			if err != nil {
				var svc model.Key
				if from != nil {
					svc = from.Service
				}
				bad = append(bad, Unservable{Type: t, Name: name, Service: svc, Reason: cutReason(err.Error())})
				metrics.UnservableResources.WithLabelValues(t.URL()).Inc()
				continue
			}
			upserts[t] = append(upserts[t], marshalled{name: name, value: value, hash: hash64(value), from: from})
		}
	}
	return upserts, bad
}

// takeSpec makes the update's spec and resolution the scope's, and reports
// whether the spec changed: a changed spec is a new revision even when no
// resource changed, because the server serves the spec too.
func (s *Snapshot) takeSpec(u *catalog.Update) bool {
	changed := !reflect.DeepEqual(s.spec, u.Scope)
	s.spec = u.Scope
	s.resolution = u.Resolution
	return changed
}

// revision is an update being applied to a scope's resources, under its
// lock: the revision it makes, the names it put per type (whose children
// of the same name follow them), and the log entries of every name it
// changed.
type revision struct {
	s       *Snapshot
	rev     uint64
	touched [xdstype.Count]map[string]struct{}
	changes []logEntry
}

// begin starts the scope's next revision.
func (s *Snapshot) begin() *revision {
	r := &revision{s: s, rev: s.rev + 1}
	for t := range xdstype.Count {
		r.touched[t] = map[string]struct{}{}
	}
	return r
}

// put stores the resource of type t named name at version, unless the
// scope already holds that version (then nothing changed for any proxy).
func (r *revision) put(t xdstype.Type, name string, value []byte, version string, from *model.Origin) {
	ts := &r.s.types[t]
	old := ts.res.get(name)
	if old != nil && old.Version == version && model.SameOrigin(old.From, from) {
		return
	}
	if old != nil {
		ts.count(old, -1)
	}
	res := NewResource(t, name, version, value)
	res.From = from
	ts.res = ts.res.set(res)
	ts.count(res, 1)
	r.touched[t][name] = struct{}{}
	r.changes = append(r.changes, logEntry{rev: r.rev, typ: t, name: name})
}

// putAll is put of every upsert of type t into a scope that holds none of
// the type (a new scope's first revision), with the tree built at once.
func (r *revision) putAll(t xdstype.Type, upserts []marshalled, parent *typeState) {
	ts := &r.s.types[t]
	rs := make([]*Resource, len(upserts))
	for i, m := range upserts {
		res := NewResource(t, m.name, resourceVersion(m.hash, parent, m.name), m.value)
		res.From = m.from
		ts.count(res, 1)
		r.touched[t][m.name] = struct{}{}
		r.changes = append(r.changes, logEntry{rev: r.rev, typ: t, name: m.name})
		rs[i] = res
	}
	ts.res = newTree(rs)
}

// remove drops the resource of type t named name, if the scope holds it.
func (r *revision) remove(t xdstype.Type, name string) {
	ts := &r.s.types[t]
	old := ts.res.get(name)
	if old == nil {
		return
	}
	ts.count(old, -1)
	ts.res = ts.res.remove(name)
	r.changes = append(r.changes, logEntry{rev: r.rev, typ: t, name: name})
}

// removeUnlisted drops, for an update that resets the scope, every
// resource its complete set no longer lists: whatever an earlier scope of
// that name held.
func (r *revision) removeUnlisted(u *catalog.Update) {
	for t := range xdstype.Count {
		r.s.types[t].res.all(func(res *Resource) {
			if _, ok := u.Upserted[t][res.Name]; !ok {
				r.remove(t, res.Name)
			}
		})
	}
}

// removeListed drops the names the update removed.
func (r *revision) removeListed(u *catalog.Update) {
	for t := range xdstype.Count {
		for _, name := range u.Removed[t] {
			r.remove(t, name)
		}
	}
}

// upsert versions and stores the marshalled upserts, type by type in ADS
// order, so that a type whose version follows its parent (assignments
// follow clusters) finds the parent already versioned; a resource whose
// parent this revision changed and it did not is re-versioned (see
// resourceVersion).
func (r *revision) upsert(upserts [xdstype.Count][]marshalled) {
	for t := range xdstype.Count {
		info := t.Info()
		var parent *typeState
		if info.VersionFollowsParent {
			parent = &r.s.types[info.Parent]
		}
		if ts := &r.s.types[t]; ts.res.Len() == 0 && len(upserts[t]) > 1 {
			r.putAll(t, upserts[t], parent)
		} else {
			for _, m := range upserts[t] {
				r.put(t, m.name, m.value, resourceVersion(m.hash, parent, m.name), m.from)
			}
		}
		if parent == nil {
			continue
		}
		for name := range r.touched[info.Parent] {
			if _, done := r.touched[t][name]; done {
				continue
			}
			if res := r.s.types[t].res.get(name); res != nil {
				value := res.Value()
				r.put(t, name, value, resourceVersion(hash64(value), parent, name), res.From)
			}
		}
	}
}

// publish makes the revision the scope's current one: the versions of
// every type, place view and of the scope follow its digests, its changes
// go to the log, and the scope's streams wake to send them.
func (s *Snapshot) publish(r *revision, observed time.Time) {
	s.rev, s.revTime = r.rev, observed
	for t := range xdstype.Count {
		s.types[t].version = DigestVersion(s.types[t].digest)
	}
	for _, ps := range s.places {
		ps.version = DigestVersion(s.types[xdstype.Endpoint].digest ^ ps.delta)
	}
	s.version = s.scopeVersion()
	s.log = append(s.log, r.changes...)
	s.trimLogLocked()
	s.wakeLocked()
}

// servable marshals a resource as it is served, after Envoy's validation
// rules (generated into go-control-plane) accepted it: what fails either
// would be rejected by every proxy, or could not be sent at all.
func servable(msg proto.Message) ([]byte, error) {
	if v, ok := msg.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return nil, err
		}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(msg)
}

// maxReason bounds the error kept for an unservable resource: a
// validation error lists every violation, and may quote the bad value.
const maxReason = 512

func cutReason(r string) string {
	if len(r) > maxReason {
		r = r[:maxReason-len("…")] + "…"
	}
	return strings.ToValidUTF8(r, "")
}

// recordUnservable updates, under the scope's lock, which resources are
// held back: the ones that failed now are; one servable now, removed, or
// gone from a reset scope is not any more.
func (s *Snapshot) recordUnservable(u *catalog.Update, upserts [xdstype.Count][]marshalled, bad []Unservable) {
	if len(bad) == 0 && len(s.unservable) == 0 {
		return
	}
	before := len(s.unservable)
	changed := len(bad) > 0
	for k := range s.unservable {
		_, upserted := u.Upserted[k.typ][k.name]
		if (u.Reset && !upserted) || slices.Contains(u.Removed[k.typ], k.name) {
			delete(s.unservable, k)
		}
	}
	for t := range xdstype.Count {
		for _, m := range upserts[t] {
			delete(s.unservable, typedName{t, m.name})
		}
	}
	for _, b := range bad {
		s.unservable[typedName{b.Type, b.Name}] = b
	}
	if !changed && len(s.unservable) == before {
		return
	}
	list := slices.Collect(maps.Values(s.unservable))
	slices.SortFunc(list, func(a, b Unservable) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), strings.Compare(a.Name, b.Name))
	})
	s.unservableList = list
}

// trimLogLocked keeps the change log at most about twice the size of the
// scope: a stream further behind than that compares everything instead.
func (s *Snapshot) trimLogLocked() {
	limit := 1024
	for t := range xdstype.Count {
		limit += 2 * s.types[t].res.Len()
	}
	if len(s.log) <= limit {
		return
	}
	cut := len(s.log) - limit/2
	// Never split one revision: a reader must see all of it or none.
	for cut < len(s.log) && s.log[cut].rev == s.log[cut-1].rev {
		cut++
	}
	s.logBase = s.log[cut-1].rev
	s.log = append([]logEntry(nil), s.log[cut:]...)
}

func (s *Snapshot) wakeLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

func hash64(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// ContentVersion is the version the builder gives a resource of that
// encoded value whose version follows no parent.
func ContentVersion(value []byte) string { return versionOf(hash64(value)) }

func versionOf(h uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h)
	return hex.EncodeToString(b[:])
}

// resourceVersion is the version of a resource whose content hashes to h.
// For a type whose version follows its parent (parent non-nil), the version
// of the parent of the same name is mixed in, so that the resource gets a
// new version, and is sent again, whenever its parent changes: Envoy
// finishes warming a changed cluster only with an EDS response after it.
func resourceVersion(h uint64, parent *typeState, name string) string {
	if parent != nil {
		if p := parent.res.get(name); p != nil {
			return versionOf(h ^ hash64([]byte(p.Version)))
		}
	}
	return versionOf(h)
}
