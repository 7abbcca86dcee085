// Package snapshot turns the catalog's per-scope changes into versioned,
// marshalled resources that every proxy of a scope shares.
//
// Each resource is marshalled once per version and carries a content-hash
// version; each type has its own version, an order-independent digest of its
// (name, version) pairs that updates in O(1) per changed resource. A scope
// keeps a log of which names changed at which revision, so that a stream
// catches up by reading only what changed since it last looked, not by
// comparing every resource: the work after a change is proportional to the
// change, not to the size of the scope.
package snapshot

import (
	"encoding/binary"
	"encoding/hex"
	"hash/fnv"
	"sync"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/catalog"
	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Resource is one versioned resource, marshalled once and shared, read-only,
// by every stream that sends it.
type Resource struct {
	Name    string
	Version string
	// Wire is the resource's Any (see Body) encoded as an entry of a SotW
	// response's resources, which is also the resource field of a delta
	// response's Resource (field 2 in both): tag, length, then the Any.
	// Delta is the whole entry of a delta response's resources: tag,
	// length, the Resource's version and name, then Wire. Wire is Delta's
	// tail and the encoded resource (Value) Wire's, so the bytes are held
	// once, and nothing else holds them: not even an Any, which would add
	// its own struct to every resource of every scope. The ADS server
	// hands Wire or Delta to gRPC's transport as they are, so that every
	// stream's response refers to these bytes instead of carrying its own
	// copy, one buffer per resource; they are gRPC buffers made once here,
	// so that a response's reference costs no allocation either. Their
	// Free does nothing: the bytes are garbage collected, never recycled.
	Wire, Delta mem.Buffer
	// Size is the encoded size of the resource's Any, for pricing
	// responses (package cost).
	Size int
	// valueLen is the length of Value, the tail of Delta.
	valueLen int
	// From is the Service port the resource was translated from, as the
	// translator said (see model.Origin), shared by every resource of that
	// port; nil for a scope's own resource, an Envoy-mode listener or route
	// configuration. The builder sets it; read it through Service.
	From *model.Origin
}

// Value is the encoded resource, shared and read-only.
func (r *Resource) Value() []byte {
	d := r.Delta.ReadOnlyData()
	return d[len(d)-r.valueLen:]
}

// Body is the resource as an Any whose value is Value, shared and
// read-only: a new Any on every call, for the few readers that want one
// (the client status service, tests).
func (r *Resource) Body() *anypb.Any {
	w := r.Wire.ReadOnlyData()
	_, _, n := protowire.ConsumeTag(w)
	msg, _ := protowire.ConsumeBytes(w[n:])
	a := &anypb.Any{}
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 || typ != protowire.BytesType {
			break
		}
		v, m := protowire.ConsumeBytes(msg[n:])
		if m < 0 {
			break
		}
		switch num {
		case 1:
			a.TypeUrl = string(v)
		case 2:
			a.Value = v
		}
		msg = msg[n+m:]
	}
	return a
}

// Service is the Service the resource was translated from, and false for a
// scope's own resource, or for none (r may be nil): the server counts the
// Services proxies ask for, and the status sums each Service's footprint,
// by it rather than by parsing names.
func (r *Resource) Service() (model.Key, bool) {
	if r == nil || r.From == nil {
		return model.Key{}, false
	}
	return r.From.Service, true
}

// Field numbers: of a resource's Any in both a SotW DiscoveryResponse
// (resources) and a delta Resource (resource), which is also the field of
// the Resources of a DeltaDiscoveryResponse; of a delta Resource's version
// and name.
const (
	anyField             = 2
	deltaResourceVersion = 1
	deltaResourceName    = 3
)

// NewResource returns the resource of type t named name at version, from
// its encoded value, laid out in one buffer as Resource says.
func NewResource(t xdstype.Type, name, version string, value []byte) *Resource {
	url := t.URL()
	size := protowire.SizeTag(1) + protowire.SizeBytes(len(url))
	if len(value) > 0 { // proto3 leaves an empty bytes field out
		size += protowire.SizeTag(2) + protowire.SizeBytes(len(value))
	}
	wire := protowire.SizeTag(anyField) + protowire.SizeBytes(size)
	inner := wire + stringSize(deltaResourceVersion, version) + stringSize(deltaResourceName, name)
	b := make([]byte, 0, protowire.SizeTag(anyField)+protowire.SizeBytes(inner))
	b = protowire.AppendTag(b, anyField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(inner))
	b = appendString(b, deltaResourceVersion, version)
	b = appendString(b, deltaResourceName, name)
	w := len(b)
	b = protowire.AppendTag(b, anyField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendString(b, 1, url)
	if len(value) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, value)
	}
	return &Resource{Name: name, Version: version, Wire: mem.SliceBuffer(b[w:]), Delta: mem.SliceBuffer(b), Size: size, valueLen: len(value)}
}

// stringSize is what a string field adds to a message (proto3 leaves an
// empty one out).
func stringSize(field protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(field) + protowire.SizeBytes(len(s))
}

func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, s)
}

type typeState struct {
	res     tree
	digest  uint64
	version string
	// sotwBytes is what all of the type's resources add to a SotW response.
	sotwBytes int
	// inlineBytes is what the type's resources add to a message that
	// carries them inline as its field 2, as a route configuration carries
	// virtual hosts.
	inlineBytes int
}

// count adds (sign 1) or takes out (sign -1) one resource's share of the
// type's digest, SotW bytes and inline bytes. It is the one place the three
// are kept, so that they always describe the same resources: a resource is
// counted when it enters res and taken out when it leaves or is replaced.
func (ts *typeState) count(r *Resource, sign int) {
	ts.digest ^= nameDigest(r.Name, r.Version)
	ts.sotwBytes += sign * cost.SotWEntry(r.Size)
	ts.inlineBytes += sign * inlineEntry(r.Value())
}

// inlineEntry is what one resource of value bytes adds to a message that
// carries it inline as field 2.
func inlineEntry(value []byte) int {
	return protowire.SizeTag(anyField) + protowire.SizeBytes(len(value))
}

type logEntry struct {
	rev  uint64
	typ  xdstype.Type
	name string
}

// Snapshot is the served state of one ProxyScope. Streams read it under its
// read lock through View; the builder writes it.
type Snapshot struct {
	Key model.Key

	mu   sync.RWMutex
	spec *model.Scope
	// resolution is the record of inputs the served state was built from.
	resolution catalog.Resolution
	rev        uint64
	revTime    time.Time // when the change that made rev was observed
	types      [xdstype.Count]typeState
	log        []logEntry
	logBase    uint64 // the log holds every change with a revision > logBase
	wake       chan struct{}
	deleted    bool

	// places holds the views from particular places: assignments that
	// proxies there see instead of the scope-wide ones of the same names.
	places map[model.Place]*placeState
	// version is the scope's version, View.Version.
	version string

	// unservable holds the resources whose latest content is held back;
	// unservableList is the same, sorted, as View.Resolution hands it out.
	unservable     map[typedName]Unservable
	unservableList []Unservable
}

// placeState is the view from one place: the assignments proxies there see
// instead of the scope-wide ones, each a name the scope holds.
type placeState struct {
	res tree
	// digest is the XOR of its (name, version) pairs, what it adds to the
	// scope's version.
	digest uint64
	// delta and sotwDelta are what the view changes in the scope-wide
	// assignments' digest and SotW bytes, for a proxy that sees it: the sum
	// over its names of contribution.
	delta     uint64
	sotwDelta int
	// version is the assignments' type version as seen from the place.
	version string
}

// contribution is what one name of the view changes in the digest and
// the SotW bytes of the scope-wide assignments, which hold base of it.
func (ps *placeState) contribution(base *typeState, name string) (uint64, int) {
	r := ps.res.get(name)
	if r == nil {
		return 0, 0
	}
	d, n := nameDigest(name, r.Version), cost.SotWEntry(r.Size)
	if b := base.res.get(name); b != nil {
		d ^= nameDigest(name, b.Version)
		n -= cost.SotWEntry(b.Size)
	}
	return d, n
}

func newSnapshot(key model.Key) *Snapshot {
	s := &Snapshot{Key: key, wake: make(chan struct{}), unservable: map[typedName]Unservable{}, places: map[model.Place]*placeState{}}
	for t := range s.types {
		s.types[t].version = emptyVersion
	}
	s.version = s.scopeVersion()
	return s
}

// emptyVersion is the version of a type that holds nothing.
const emptyVersion = "0"

// View is a consistent read of a scope as proxies at one location see it,
// valid only inside Snapshot.Read or ReadFrom.
type View struct {
	s *Snapshot
	// node and zone are the place views the location sees, nil where it
	// sees the scope-wide assignments; node's win over zone's.
	node, zone *placeState
}

// Read calls fn with a consistent view of the scope as a proxy that no
// place view covers sees it.
func (s *Snapshot) Read(fn func(v View)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fn(View{s: s})
}

// ReadFrom calls fn with a consistent view of the scope as a proxy at loc
// sees it: of each assignment, its Node's view, else its zone's, else the
// scope-wide one.
func (s *Snapshot) ReadFrom(loc model.Location, fn func(v View)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v := View{s: s}
	if len(s.places) > 0 {
		node, zone := loc.Places()
		v.node, v.zone = s.places[node], s.places[zone]
	}
	fn(v)
}

// Spec is the scope's current spec; nil once the scope is deleted.
func (v View) Spec() *model.Scope {
	if v.s.deleted {
		return nil
	}
	return v.s.spec
}

// Resolution is what the served spec resolved to (generation, counts,
// missing namespaces, or why the spec was rejected) and what of it the
// builder holds back, for the status.
func (v View) Resolution() Resolution {
	return Resolution{Resolution: v.s.resolution, Unservable: v.s.unservableList}
}

// Resolution is the record a scope's status is computed from: the catalog's
// record of what the spec resolved to, and the resources the builder could
// not serve.
type Resolution struct {
	catalog.Resolution
	// Unservable lists the resources whose latest content is held back,
	// sorted by type and name; shared and read-only.
	Unservable []Unservable
}

// Unservable is a resource whose latest content cannot be marshalled or
// fails Envoy's validation. It is held back alone: the scope keeps serving
// its previous version (none if it never had a servable one), and every
// other resource, of its Service too, keeps flowing.
type Unservable struct {
	Type xdstype.Type
	Name string
	// Service is the Service the resource was translated from; zero for a
	// scope-wide resource (an Envoy-mode listener or route configuration).
	Service model.Key
	// Reason is the marshalling or validation error, cut to maxReason bytes.
	Reason string
}

type typedName struct {
	typ  xdstype.Type
	name string
}

// Wake returns a channel that is closed when the scope changes after this
// view (a new revision, a spec change, or deletion). Taking it from the same
// view as the state read means no change can slip in between.
func (v View) Wake() <-chan struct{} { return v.s.wake }

// RevTime is when the control plane observed the change that made the
// current revision, the start of every proxy's convergence to it.
func (v View) RevTime() time.Time { return v.s.revTime }

// Rev is the scope's current revision; it grows with every change.
func (v View) Rev() uint64 { return v.s.rev }

// placed reports whether the view sees a place view of type t's resources.
func (v View) placed(t xdstype.Type) bool {
	return t == xdstype.Endpoint && (v.node != nil || v.zone != nil)
}

// TypeVersion is the version of all resources of one type, as the view
// sees them.
func (v View) TypeVersion(t xdstype.Type) string {
	switch {
	case !v.placed(t):
		return v.s.types[t].version
	case v.zone == nil:
		return v.node.version
	case v.node == nil:
		return v.zone.version
	}
	d, _ := v.overlap()
	return DigestVersion(v.s.types[t].digest ^ v.node.delta ^ v.zone.delta ^ d)
}

// overlap is what the zone's view contributes for the names the Node's
// view covers too, which it must not.
func (v View) overlap() (uint64, int) {
	var d uint64
	var n int
	base := &v.s.types[xdstype.Endpoint]
	v.node.res.all(func(r *Resource) {
		cd, cn := v.zone.contribution(base, r.Name)
		d, n = d^cd, n+cn
	})
	return d, -n
}

// Get returns the current resource of that type and name as the view sees
// it, or nil.
func (v View) Get(t xdstype.Type, name string) *Resource {
	if v.placed(t) {
		if r := v.node.get(name); r != nil {
			return r
		}
		if r := v.zone.get(name); r != nil {
			return r
		}
	}
	return v.s.types[t].res.get(name)
}

// get returns the place's own assignment of that name; ps may be nil.
func (ps *placeState) get(name string) *Resource {
	if ps == nil {
		return nil
	}
	return ps.res.get(name)
}

// SotWBytes is what every resource of the type adds to a SotW response: a
// wildcard full-state response is Header plus this.
func (v View) SotWBytes(t xdstype.Type) int {
	n := v.s.types[t].sotwBytes
	if !v.placed(t) {
		return n
	}
	if v.node != nil {
		n += v.node.sotwDelta
	}
	if v.zone != nil {
		n += v.zone.sotwDelta
	}
	if v.node != nil && v.zone != nil {
		_, o := v.overlap()
		n += o
	}
	return n
}

// InlineRouteSize is the encoded size, as an Any, of the route
// configuration named name that carries every VirtualHost of the scope
// inline: what a SotW proxy is sent where a delta proxy fetches the virtual
// hosts by VHDS. An Envoy-mode scope's inline route configuration is
// exactly that (see translate.VHDS), so the size is exact.
func (v View) InlineRouteSize(name string) int {
	value := protowire.SizeTag(1) + protowire.SizeBytes(len(name)) + v.s.types[xdstype.VirtualHost].inlineBytes
	url := xdstype.Route.URL()
	return protowire.SizeTag(1) + protowire.SizeBytes(len(url)) + protowire.SizeTag(2) + protowire.SizeBytes(value)
}

// Len returns how many resources of the type the scope holds.
func (v View) Len(t xdstype.Type) int { return v.s.types[t].res.Len() }

// All calls fn for every resource of the type as the view sees it, in no
// particular order.
func (v View) All(t xdstype.Type, fn func(*Resource)) {
	if v.placed(t) {
		v.s.types[t].res.all(func(r *Resource) { fn(v.Get(t, r.Name)) })
		return
	}
	v.s.types[t].res.all(fn)
}

// ChangedSince calls fn for every name of type t that changed (was added,
// updated or removed) after revision rev, possibly more than once. It
// returns false, calling nothing, when the log no longer reaches back to rev:
// the caller must then compare everything it holds.
func (v View) ChangedSince(rev uint64, t xdstype.Type, fn func(name string)) bool {
	if rev < v.s.logBase {
		return false
	}
	// The log is sorted by revision: find the first entry after rev.
	lo, hi := 0, len(v.s.log)
	for lo < hi {
		mid := (lo + hi) / 2
		if v.s.log[mid].rev <= rev {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for _, e := range v.s.log[lo:] {
		if e.typ == t {
			fn(e.name)
		}
	}
	return true
}

// nameDigest is the digest contribution of one (name, version) pair; a
// type's digest is the XOR of its pairs', so it updates in O(1).
func nameDigest(name, version string) uint64 { return PairDigest(name, version) }

// PairDigest is one (name, version) pair's part of a type's digest, which
// is the XOR of its resources' parts and which TypeVersion formats
// (DigestVersion). So pairs held elsewhere, as a reconnecting delta proxy
// declares what it holds, are exactly the resources a view serves of a type
// when there are as many of them and the XOR of their parts formats to the
// view's TypeVersion: one pass over the pairs, nothing looked up. It reads
// bytes as well as strings, so that pairs still encoded in a request are
// digested where they lie. It is FNV-1a of name, a zero byte and version.
func PairDigest[T string | []byte](name, version T) uint64 {
	h := fnvAdd(fnvOffset, name)
	h *= fnvPrime // the zero byte between the two
	return fnvAdd(h, version)
}

// fnvOffset and fnvPrime are FNV-1a's 64-bit offset basis and prime.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvAdd is FNV-1a's hash h continued over b.
func fnvAdd[T string | []byte](h uint64, b T) uint64 {
	for i := range len(b) {
		h ^= uint64(b[i])
		h *= fnvPrime
	}
	return h
}

// DigestVersion is the version a type's digest (the XOR of its pairs'
// PairDigest) is served as.
func DigestVersion(d uint64) string {
	if d == 0 {
		return emptyVersion
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], d)
	return hex.EncodeToString(b[:])
}

// Version is the version of the scope as a whole, the same from every
// place: a digest of its type versions and of every place's view, the "V"
// of "N of M proxies at version V". A proxy is at V when it holds V as its
// location sees it.
func (v View) Version() string { return v.s.version }

// scopeVersion computes Version from the scope's state.
func (s *Snapshot) scopeVersion() string {
	var d uint64
	for t := range xdstype.Count {
		d ^= nameDigest(t.URL(), s.types[t].version)
	}
	for place, ps := range s.places {
		d ^= nameDigest(place.String(), DigestVersion(ps.digest))
	}
	return DigestVersion(d)
}

// NameDigest is one name's part of the digest of a set of names, the XOR
// of its names' parts: a subscription's digest updates in O(1) per name and
// does not depend on the order the proxy lists them in.
func NameDigest(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// SubsetVersion is the version of the resources of a type at typeVersion
// that a by-name subscription whose names digest to names (NameDigest)
// covers. A type's version alone says nothing about which of its resources
// a proxy subscribed to holds; this one denotes both, so that a proxy
// naming it on a new stream, with the same names, provably holds exactly
// what a response would bring it. It is as long as a type version.
func SubsetVersion(typeVersion string, names uint64) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(typeVersion))
	var b [9]byte
	binary.BigEndian.PutUint64(b[1:], names)
	_, _ = h.Write(b[:])
	return DigestVersion(h.Sum64())
}

// TypeSet is the resources of one type as one location saw them at one
// revision. It is immutable: a stream keeps the set it brought its proxy to
// by reference, for as long as the proxy holds it, at no cost per resource;
// the scope's later revisions share all of it but what changed.
type TypeSet struct {
	scope tree
	// node and zone are the place views the location saw, empty where it
	// saw the scope-wide assignments (see View.Get).
	node, zone tree
}

// Set returns the resources of type t as the view sees them.
func (v View) Set(t xdstype.Type) TypeSet {
	s := TypeSet{scope: v.s.types[t].res}
	if v.placed(t) {
		if v.node != nil {
			s.node = v.node.res
		}
		if v.zone != nil {
			s.zone = v.zone.res
		}
	}
	return s
}

// Get returns the resource of that name in the set, or nil.
func (s TypeSet) Get(name string) *Resource {
	if r := s.node.get(name); r != nil {
		return r
	}
	if r := s.zone.get(name); r != nil {
		return r
	}
	return s.scope.get(name)
}

// Len is how many resources the set holds.
func (s TypeSet) Len() int { return s.scope.Len() }

// All calls fn for every resource of the set, in no particular order.
func (s TypeSet) All(fn func(*Resource)) {
	if s.node.Len() == 0 && s.zone.Len() == 0 {
		s.scope.all(fn)
		return
	}
	s.scope.all(func(r *Resource) { fn(s.Get(r.Name)) })
}

// Changes calls fn for every name whose resource may differ between a and
// b, possibly more than once, in time proportional to what differs.
func Changes(a, b TypeSet, fn func(name string)) {
	treeChanges(a.scope, b.scope, fn)
	treeChanges(a.node, b.node, fn)
	treeChanges(a.zone, b.zone, fn)
}

// Names is the names of one type a scope served at one revision:
// immutable, like TypeSet, so that every stream subscribed to exactly
// those names (as Envoy subscribes to the assignment of every cluster)
// keeps one set by reference instead of a copy each.
type Names struct{ t tree }

// Names returns the names of type t the scope serves.
func (v View) Names(t xdstype.Type) Names { return Names{v.s.types[t].res} }

// Has reports whether the set holds name.
func (n Names) Has(name string) bool { return n.t.get(name) != nil }

// Len is how many names the set holds.
func (n Names) Len() int { return n.t.Len() }

// All calls fn for every name of the set, in no particular order.
func (n Names) All(fn func(name string)) { n.t.all(func(r *Resource) { fn(r.Name) }) }

// NameChanges calls fn for every name held by only one of a and b, and
// possibly others, in time proportional to how the two differ.
func NameChanges(a, b Names, fn func(name string)) { treeChanges(a.t, b.t, fn) }
