package server

import (
	"strconv"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

type sotwStream = grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]

// sotwType is a stream's state for one resource type.
type sotwType struct {
	requested bool
	wildcard  bool
	names     map[string]struct{}
	// nonce and version of the last response sent; pending until answered.
	nonce   string
	version string
	pending bool
	nacked  bool
	// last lists the resources of the last response; retry, the names of
	// a rejected Endpoints or Routes response, sent again with the next
	// change of the type (never alone: that would loop on the rejection).
	last  []*snapshot.Resource
	retry map[string]struct{}
	// held is what the proxy holds from us: the last full set for
	// Clusters and Listeners, every resource sent for Endpoints and Routes.
	held map[string]*snapshot.Resource
}

func (ts *sotwType) subscribed(name string) bool {
	if ts.wildcard {
		return true
	}
	_, ok := ts.names[name]
	return ok
}

type sotw struct {
	stream
	grpc  sotwStream
	types [xdstype.Count]*sotwType
}

func (st *sotw) base() *stream { return &st.stream }

type sotwResponse struct {
	t       xdstype.Type
	version string
	res     []*snapshot.Resource
	// full marks a full-state response, which replaces what the proxy holds.
	full bool
}

// StreamAggregatedResources serves one State-of-the-World ADS stream.
func (s *Server) StreamAggregatedResources(g sotwStream) error {
	return serve(s, model.SotW, g, func(base stream) handler[*discoveryv3.DiscoveryRequest] {
		return &sotw{stream: base, grpc: g}
	})
}

func (st *sotw) handle(req *discoveryv3.DiscoveryRequest) error {
	t, ok := xdstype.ByURL(req.GetTypeUrl())
	if !ok {
		return unknownType(req.GetTypeUrl())
	}
	if n := len(req.GetResourceNames()); n > st.srv.opts.MaxNamesPerRequest {
		return tooManyNames(n, st.srv.opts.MaxNamesPerRequest)
	}
	ts := st.types[t]
	if ts == nil {
		ts = &sotwType{held: map[string]*snapshot.Resource{}, retry: map[string]struct{}{}}
		st.types[t] = ts
	}
	nonce := req.GetResponseNonce()
	if nonce != "" && nonce != ts.nonce {
		return nil // an answer to a response that was superseded: ignored
	}
	if nonce != "" && ts.pending {
		ts.pending = false
		if d := req.GetErrorDetail(); d != nil {
			// The proxy keeps its last good configuration; the rejected
			// version is not sent again, only a newer one will be.
			ts.nacked = true
			if !t.FullState() {
				for _, r := range ts.last {
					if ts.held[r.Name] == r {
						delete(ts.held, r.Name)
						ts.retry[r.Name] = struct{}{}
					}
				}
			}
			st.srv.fb.NACKed(st.key, st.id, t.URL(), ts.version, d.GetMessage())
		} else {
			// Rejected resources not yet sent again keep the proxy short
			// of the scope's configuration: it stays counted as rejecting.
			ts.nacked = len(ts.retry) > 0
			st.srv.fb.ACK(st.key, st.id, t.URL(), ts.version, !ts.nacked)
		}
	}

	// Most requests are ACKs that repeat the subscription: check that
	// without building anything before parsing it anew.
	changed := !ts.requested || !sameSubscription(req.GetResourceNames(), ts)
	if changed {
		wildcard, names := false, make(map[string]struct{}, len(req.GetResourceNames()))
		for _, n := range req.GetResourceNames() {
			if n == "*" {
				wildcard = true
			} else {
				names[n] = struct{}{}
			}
		}
		if len(names) == 0 && (!ts.requested || ts.wildcard) {
			wildcard = true // legacy wildcard: an empty first request, kept while empty
		}
		changed = !ts.requested || wildcard != ts.wildcard || !sameKeys(names, ts.names)
		ts.wildcard, ts.names = wildcard, names
		for name := range ts.retry {
			if !ts.subscribed(name) {
				delete(ts.retry, name) // no longer wanted, so no longer owed
			}
		}
	}
	fresh := nonce == "" // a first request, or a reconnect: the proxy waits for a response
	ts.requested = true
	if !changed && !fresh {
		st.reportSynced()
		return nil
	}
	if fresh {
		clear(ts.held) // what the proxy holds is unknown to this stream
	}
	var resp *sotwResponse
	st.sc.Read(func(v snapshot.View) {
		if t.FullState() {
			resp = st.fullResponse(v, t, ts, true)
			return
		}
		for name := range ts.held {
			if !ts.subscribed(name) {
				delete(ts.held, name)
			}
		}
		var res []*snapshot.Resource
		add := func(name string) {
			if r := v.Get(t, name); r != nil && ts.held[name] != r {
				res = append(res, r)
			}
		}
		if ts.wildcard {
			v.All(t, func(r *snapshot.Resource) { add(r.Name) })
		} else {
			for name := range ts.names {
				add(name)
			}
		}
		if len(res) > 0 || fresh {
			resp = &sotwResponse{t: t, version: v.TypeVersion(t), res: res}
		}
	})
	if resp != nil {
		return st.send(resp)
	}
	st.reportSynced()
	return nil
}

// fullResponse returns the complete set of a Clusters or Listeners
// subscription, or nil when the proxy already holds exactly that (unless force).
func (st *sotw) fullResponse(v snapshot.View, t xdstype.Type, ts *sotwType, force bool) *sotwResponse {
	var res []*snapshot.Resource
	if ts.wildcard {
		res = make([]*snapshot.Resource, 0, v.Len(t))
		v.All(t, func(r *snapshot.Resource) { res = append(res, r) })
	} else {
		for name := range ts.names {
			if r := v.Get(t, name); r != nil {
				res = append(res, r)
			}
		}
	}
	if !force && len(res) == len(ts.held) {
		same := true
		for _, r := range res {
			if ts.held[r.Name] != r {
				same = false
				break
			}
		}
		if same {
			return nil
		}
	}
	return &sotwResponse{t: t, version: v.TypeVersion(t), res: res, full: true}
}

// push sends what changed in the scope since the stream last looked, in ADS
// order, making before breaking: when clusters go away while listeners or
// routes change, the clusters are first sent with the departing ones still
// in, and removed only after the listeners and routes stopped using them.
func (st *sotw) push() error {
	var (
		resps [xdstype.Count]*sotwResponse
		early *sotwResponse
		err   error
	)
	st.sc.Read(func(v snapshot.View) {
		if err = st.stillServes(v, model.SotW); err != nil {
			return
		}
		for t := range xdstype.Count {
			ts := st.types[t]
			if ts == nil {
				continue
			}
			if t.FullState() {
				touched := false
				if !v.ChangedSince(st.rev, t, func(name string) { touched = touched || ts.subscribed(name) }) {
					touched = true
				}
				if touched {
					resps[t] = st.fullResponse(v, t, ts, false)
				}
				continue
			}
			var res []*snapshot.Resource
			seen := map[string]struct{}{}
			consider := func(name string) {
				if _, dup := seen[name]; dup || !ts.subscribed(name) {
					return
				}
				seen[name] = struct{}{}
				r := v.Get(t, name)
				if r == nil {
					delete(ts.held, name)
				} else if ts.held[name] != r {
					res = append(res, r)
				}
			}
			if !v.ChangedSince(st.rev, t, consider) {
				for name := range ts.held {
					consider(name)
				}
				v.All(t, func(r *snapshot.Resource) { consider(r.Name) })
			}
			if len(res) > 0 {
				for name := range ts.retry {
					consider(name)
				}
				clear(ts.retry)
				resps[t] = &sotwResponse{t: t, version: v.TypeVersion(t), res: res}
			}
		}
		if c := resps[xdstype.Cluster]; c != nil && (resps[xdstype.Listener] != nil || resps[xdstype.Route] != nil) {
			early = makeBeforeBreak(c, st.types[xdstype.Cluster].held)
		}
		st.caughtUp(v)
	})
	if err != nil {
		return err
	}
	var final *sotwResponse
	if early != nil {
		final, resps[xdstype.Cluster] = resps[xdstype.Cluster], early
	}
	for t := range xdstype.Count {
		if resps[t] != nil {
			if err := st.send(resps[t]); err != nil {
				return err
			}
		}
	}
	if final != nil {
		if err := st.send(final); err != nil {
			return err
		}
	}
	st.reportSynced()
	return nil
}

// makeBeforeBreak returns a clusters response that keeps the held clusters
// the final one drops, or nil when nothing is dropped.
func makeBeforeBreak(final *sotwResponse, held map[string]*snapshot.Resource) *sotwResponse {
	keep := make(map[string]struct{}, len(final.res))
	for _, r := range final.res {
		keep[r.Name] = struct{}{}
	}
	union := append([]*snapshot.Resource(nil), final.res...)
	for name, r := range held {
		if _, ok := keep[name]; !ok {
			union = append(union, r)
		}
	}
	if len(union) == len(final.res) {
		return nil
	}
	return &sotwResponse{t: final.t, version: final.version + "-draining", res: union, full: true}
}

func (st *sotw) send(r *sotwResponse) error {
	ts := st.types[r.t]
	st.nonce++
	resp := &discoveryv3.DiscoveryResponse{
		VersionInfo: r.version,
		TypeUrl:     r.t.URL(),
		Nonce:       strconv.FormatUint(st.nonce, 10),
		Resources:   make([]*anypb.Any, len(r.res)),
	}
	for i, res := range r.res {
		resp.Resources[i] = res.Body
	}
	if err := st.grpc.Send(resp); err != nil {
		return err
	}
	ts.nonce, ts.version, ts.pending, ts.last = resp.GetNonce(), r.version, true, r.res
	if r.full {
		clear(ts.held)
	}
	for _, res := range r.res {
		ts.held[res.Name] = res
		delete(ts.retry, res.Name) // sent again: no longer owed
	}
	st.srv.fb.Sent(st.key, model.SotW, r.t.URL(), len(r.res), proto.Size(resp))
	return nil
}

// reportSynced tells feedback the proxy is at the stream's scope version
// once every response was answered and none was rejected.
func (st *sotw) reportSynced() {
	for _, ts := range st.types {
		if ts != nil && (ts.pending || ts.nacked) {
			return
		}
	}
	st.srv.fb.AtVersion(st.key, st.id, st.ver, st.revTime)
}

// sameSubscription reports whether a request's resource names are the
// subscription the stream already has, without allocating.
func sameSubscription(names []string, ts *sotwType) bool {
	if len(names) == 0 {
		return ts.wildcard && len(ts.names) == 0
	}
	star, n := false, 0
	for _, name := range names {
		if name == "*" {
			star = true
			continue
		}
		if _, ok := ts.names[name]; !ok {
			return false
		}
		n++
	}
	// Duplicates in the request would make n overcount; a mismatch is only
	// a slower path, never a wrong answer.
	return n == len(ts.names) && star == ts.wildcard
}

func sameKeys(a, b map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}
