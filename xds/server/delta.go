package server

import (
	"slices"
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

type deltaStream = grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]

// deltaType is a stream's state for one resource type.
type deltaType struct {
	requested bool
	wildcard  bool
	names     map[string]struct{}
	// held is what the proxy holds, name → version, as far as the server
	// knows: seeded from initial_resource_versions, updated on every send,
	// and rolled back when the proxy NACKs.
	held map[string]string
	// inflight holds, per unanswered nonce, the versions its response
	// replaced ("" for absent), to undo them on a NACK.
	inflight map[string]map[string]string
	version  map[string]string // nonce → system_version_info
	nacked   bool
	// retry holds the names a rejected response carried; they are sent
	// again with the next change of the type, never alone (that would loop).
	retry map[string]struct{}
}

func (ts *deltaType) subscribed(name string) bool {
	if ts.wildcard {
		return true
	}
	_, ok := ts.names[name]
	return ok
}

// maxInflight bounds the unanswered responses remembered per type.
const maxInflight = 128

type delta struct {
	stream
	grpc  deltaStream
	types [xdstype.Count]*deltaType
}

func (st *delta) base() *stream { return &st.stream }

type deltaResponse struct {
	t       xdstype.Type
	version string
	res     []*snapshot.Resource
	removed []string
}

// DeltaAggregatedResources serves one delta (incremental) ADS stream.
func (s *Server) DeltaAggregatedResources(g deltaStream) error {
	return serve(s, model.Delta, g, func(base stream) handler[*discoveryv3.DeltaDiscoveryRequest] {
		return &delta{stream: base, grpc: g}
	})
}

func (st *delta) handle(req *discoveryv3.DeltaDiscoveryRequest) error {
	t, ok := xdstype.ByURL(req.GetTypeUrl())
	if !ok {
		return unknownType(req.GetTypeUrl())
	}
	if n := len(req.GetResourceNamesSubscribe()) + len(req.GetResourceNamesUnsubscribe()) + len(req.GetInitialResourceVersions()); n > st.srv.opts.MaxNamesPerRequest {
		return tooManyNames(n, st.srv.opts.MaxNamesPerRequest)
	}
	ts := st.types[t]
	if ts == nil {
		ts = &deltaType{names: map[string]struct{}{}, held: map[string]string{}, inflight: map[string]map[string]string{}, version: map[string]string{}, retry: map[string]struct{}{}}
		st.types[t] = ts
	}
	if nonce := req.GetResponseNonce(); nonce != "" {
		if undo, ok := ts.inflight[nonce]; ok {
			delete(ts.inflight, nonce)
			version := ts.version[nonce]
			delete(ts.version, nonce)
			if d := req.GetErrorDetail(); d != nil {
				// The proxy keeps what it had: roll back what this response
				// changed, and send nothing again until a newer version exists.
				for name, prev := range undo {
					if prev == "" {
						delete(ts.held, name)
					} else {
						ts.held[name] = prev
					}
					ts.retry[name] = struct{}{}
				}
				ts.nacked = true
				st.srv.fb.NACKed(st.key, st.id, t.URL(), version, d.GetMessage())
			} else {
				// Rejected resources not yet sent again keep the proxy short
				// of the scope's configuration: it stays counted as rejecting.
				ts.nacked = len(ts.retry) > 0
				st.srv.fb.ACK(st.key, st.id, t.URL(), version, !ts.nacked)
			}
		}
	}

	first := !ts.requested
	ts.requested = true
	var candidates []string
	if first {
		for name, version := range req.GetInitialResourceVersions() {
			ts.held[name] = version
			candidates = append(candidates, name)
		}
		if len(req.GetResourceNamesSubscribe()) == 0 {
			ts.wildcard = true // legacy wildcard: an empty first subscription
		}
	}
	wasWildcard := ts.wildcard
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			ts.wildcard = true
			continue
		}
		if _, ok := ts.names[n]; !ok {
			ts.names[n] = struct{}{}
			candidates = append(candidates, n)
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			ts.wildcard = false
			continue
		}
		delete(ts.names, n)
		if !ts.subscribed(n) {
			delete(ts.retry, n) // no longer wanted, so no longer owed
		}
	}
	if len(req.GetResourceNamesUnsubscribe()) > 0 || (first && !ts.wildcard) {
		// The proxy drops what it no longer subscribes to. Only a request
		// that narrows the subscription can do that; an ACK does not, and
		// must not cost a pass over everything the proxy holds.
		for name := range ts.held {
			if !ts.subscribed(name) {
				delete(ts.held, name)
			}
		}
	}
	newlyWildcard := ts.wildcard && (first || !wasWildcard)
	if len(candidates) == 0 && !newlyWildcard && !first {
		st.reportSynced()
		return nil
	}
	var resp *deltaResponse
	st.sc.Read(func(v snapshot.View) {
		resp = &deltaResponse{t: t, version: v.TypeVersion(t)}
		seen := map[string]struct{}{}
		consider := func(name string, announceMissing bool) {
			if _, dup := seen[name]; dup {
				return
			}
			seen[name] = struct{}{}
			st.diff(v, t, ts, name, resp, announceMissing)
		}
		if newlyWildcard {
			v.All(t, func(r *snapshot.Resource) { consider(r.Name, false) })
		}
		for _, name := range candidates {
			// A name subscribed explicitly that does not exist is announced
			// as removed, so the proxy does not wait for it.
			_, explicit := ts.names[name]
			consider(name, explicit)
		}
	})
	if len(resp.res) > 0 || len(resp.removed) > 0 || first {
		return st.send(resp)
	}
	st.reportSynced()
	return nil
}

// diff adds to resp what the proxy needs for one name: the resource when it
// holds another version (or none), or a removal when it holds one that is gone.
func (st *delta) diff(v snapshot.View, t xdstype.Type, ts *deltaType, name string, resp *deltaResponse, announceMissing bool) {
	if !ts.subscribed(name) {
		return
	}
	r := v.Get(t, name)
	held, has := ts.held[name]
	switch {
	case r != nil && (!has || held != r.Version):
		resp.res = append(resp.res, r)
	case r == nil && (has || announceMissing):
		resp.removed = append(resp.removed, name)
	}
}

// push sends what changed in the scope since the stream last looked, in ADS
// order; removed clusters are sent last, after listeners and routes stopped
// using them.
func (st *delta) push() error {
	var (
		resps [xdstype.Count]*deltaResponse
		late  []*deltaResponse
		err   error
	)
	st.sc.Read(func(v snapshot.View) {
		if err = st.stillServes(v, model.Delta); err != nil {
			return
		}
		for t := range xdstype.Count {
			ts := st.types[t]
			if ts == nil {
				continue
			}
			resp := &deltaResponse{t: t, version: v.TypeVersion(t)}
			seen := map[string]struct{}{}
			consider := func(name string) {
				if _, dup := seen[name]; !dup {
					seen[name] = struct{}{}
					st.diff(v, t, ts, name, resp, false)
				}
			}
			if !v.ChangedSince(st.rev, t, consider) {
				for name := range ts.held {
					consider(name)
				}
				if ts.wildcard {
					v.All(t, func(r *snapshot.Resource) { consider(r.Name) })
				} else {
					for name := range ts.names {
						consider(name)
					}
				}
			}
			if len(resp.res) > 0 || len(resp.removed) > 0 {
				for name := range ts.retry {
					consider(name)
				}
				clear(ts.retry)
				resps[t] = resp
			}
		}
		if resps[xdstype.Listener] != nil || resps[xdstype.Route] != nil {
			// Make before break: clusters and their endpoints go away only
			// after the listeners and routes that used them changed.
			for _, t := range []xdstype.Type{xdstype.Cluster, xdstype.Endpoint} {
				if r := resps[t]; r != nil && len(r.removed) > 0 {
					late = append(late, &deltaResponse{t: t, version: r.version, removed: r.removed})
					r.removed = nil
					if len(r.res) == 0 {
						resps[t] = nil
					}
				}
			}
		}
		st.caughtUp(v)
	})
	if err != nil {
		return err
	}
	for t := range xdstype.Count {
		if resps[t] != nil {
			if err := st.send(resps[t]); err != nil {
				return err
			}
		}
	}
	for _, r := range late {
		if err := st.send(r); err != nil {
			return err
		}
	}
	st.reportSynced()
	return nil
}

func (st *delta) send(r *deltaResponse) error {
	ts := st.types[r.t]
	st.nonce++
	nonce := strconv.FormatUint(st.nonce, 10)
	slices.Sort(r.removed)
	resp := &discoveryv3.DeltaDiscoveryResponse{
		SystemVersionInfo: r.version,
		TypeUrl:           r.t.URL(),
		Nonce:             nonce,
		Resources:         make([]*discoveryv3.Resource, len(r.res)),
		RemovedResources:  r.removed,
	}
	for i, res := range r.res {
		resp.Resources[i] = &discoveryv3.Resource{Name: res.Name, Version: res.Version, Resource: res.Body}
	}
	if err := st.grpc.Send(resp); err != nil {
		return err
	}
	undo := make(map[string]string, len(r.res)+len(r.removed))
	for _, res := range r.res {
		undo[res.Name] = ts.held[res.Name]
		ts.held[res.Name] = res.Version
		delete(ts.retry, res.Name) // sent again: no longer owed
	}
	for _, name := range r.removed {
		undo[name] = ts.held[name]
		delete(ts.held, name)
		delete(ts.retry, name)
	}
	if len(ts.inflight) >= maxInflight {
		// A proxy that never answers: forget the oldest bookkeeping rather
		// than grow without bound.
		clear(ts.inflight)
		clear(ts.version)
	}
	ts.inflight[nonce] = undo
	ts.version[nonce] = r.version
	st.srv.fb.Sent(st.key, model.Delta, r.t.URL(), len(r.res), proto.Size(resp))
	return nil
}

// reportSynced tells feedback the proxy is at the stream's scope version
// once every response was answered and none was rejected.
func (st *delta) reportSynced() {
	for _, ts := range st.types {
		if ts != nil && (len(ts.inflight) > 0 || ts.nacked) {
			return
		}
	}
	st.srv.fb.AtVersion(st.key, st.id, st.ver, st.revTime)
}
