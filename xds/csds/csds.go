// Package csds serves Envoy's Client Status Discovery Service
// (envoy.service.status.v3), the API istioctl's proxy-status reads: what
// every connected proxy of this replica ACKed or NACKed per type, against
// what its scope serves now, and the served resources themselves.
//
// A response holds two kinds of ClientConfig, told apart by their node:
//
//   - one per connected proxy, with the proxy's node (id, cluster, user
//     agent, and in metadata its scope, protocol and when it connected),
//     client_scope set to its ProxyScope, and one generic_xds_config per
//     resource type: the version the proxy last ACKed, config_status SYNCED
//     when that is what the scope serves now, STALE when the proxy is
//     behind, ERROR while it rejects the type, NOT_SENT before any answer;
//     error_state carries its last NACK. Unless the request sets
//     exclude_resource_contents, these are followed by what the proxy
//     subscribes to: per type, an entry named "*" for a wildcard
//     subscription and one per name it asks for, in the type order and
//     sorted by name, with no version or status (the server keeps ACK state
//     per type and version, not per resource). A by-name client, such as
//     gRPC's, holds only the names it asks for.
//   - one per ProxyScope, with no node and client_scope set to the scope:
//     first one entry per type with an empty name and the type's current
//     version, then one entry per served resource with its name, version
//     and (unless the request sets exclude_resource_contents) its body.
//
// Node matchers select what is returned (OR of matchers, as the API says):
// node_id matches proxies only; node_metadatas match the metadata keys
// above (a scope entry has the scope and protocol keys); no matcher returns
// everything. Only string and presence matches are supported; others are
// refused with InvalidArgument rather than ignored.
package csds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Metadata keys the server adds to the nodes it reports.
const (
	// ProtocolKey is the proxy's (or scope's) xDS protocol, SotW or Delta.
	ProtocolKey = "scopeplane.dev/protocol"
	// ConnectedKey is when the proxy's stream was bound to its scope (RFC 3339).
	ConnectedKey = "scopeplane.dev/connected-since"
	// PeerKey is the address the proxy's stream came from (host:port): the
	// gRPC clients of a scope share one node id, and this tells them apart.
	PeerKey = "scopeplane.dev/peer"
	// IdentityKey is who the proxy authenticated as
	// ("system:serviceaccount:<namespace>:<name>", with its pod when the
	// token names one); absent for an anonymous stream.
	IdentityKey = "scopeplane.dev/identity"
	// ZoneSourceKey says how the zone in the node's locality is known:
	// model.LocatedByNode (the Node the proxy's token names) or
	// model.LocatedByBootstrap (what the proxy declares); absent when no
	// zone is known.
	ZoneSourceKey = "scopeplane.dev/zone-source"
	// NodeNameKey is the Kubernetes Node the proxy's token names.
	NodeNameKey = "scopeplane.dev/node-name"
)

// Wildcard is the resource name that stands for a wildcard subscription in
// a proxy's subscription entries, as "*" does in xDS requests.
const Wildcard = "*"

// Server implements ClientStatusDiscoveryService over the replica's
// snapshot store and feedback tracker.
type Server struct {
	store *snapshot.Store
	fb    *feedback.Tracker
}

var _ statusv3.ClientStatusDiscoveryServiceServer = (*Server)(nil)

// New returns a CSDS server reading store and fb.
func New(store *snapshot.Store, fb *feedback.Tracker) *Server {
	return &Server{store: store, fb: fb}
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { statusv3.RegisterClientStatusDiscoveryServiceServer(g, s) }

// FetchClientStatus answers one request.
func (s *Server) FetchClientStatus(_ context.Context, req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	return s.status(req)
}

// StreamClientStatus answers every request of the stream in turn.
func (s *Server) StreamClientStatus(stream statusv3.ClientStatusDiscoveryService_StreamClientStatusServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := s.status(req)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (s *Server) status(req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	sel, err := compile(req.GetNodeMatchers())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node_matchers: %v", err)
	}
	resp := &statusv3.ClientStatusResponse{}
	for _, key := range s.store.Keys() {
		sc := s.store.Get(key)
		if sc == nil {
			continue
		}
		var (
			cur   [xdstype.Count]string
			at    string
			proto model.Protocol
			scope *statusv3.ClientConfig
		)
		sc.Read(func(v snapshot.View) {
			spec := v.Spec()
			if spec == nil || v.Resolution().Invalid != "" {
				return
			}
			proto, at = spec.Protocol, v.Version()
			for t := range xdstype.Count {
				cur[t] = v.TypeVersion(t)
			}
			if sel.matchScope(key, proto) {
				scope = scopeConfig(key, v, !req.GetExcludeResourceContents())
			}
		})
		if proto == "" {
			continue // deleted, or rejected: nothing is served
		}
		if scope != nil {
			resp.Config = append(resp.Config, scope)
		}
		for _, p := range sortedProxies(s.fb.Get(key)) {
			if !sel.matchProxy(key, p) {
				continue
			}
			// A stream that left since Get is reported without them.
			var subs map[string]feedback.Subscription
			if !req.GetExcludeResourceContents() || (p.Protocol == model.SotW && p.AtVersion != at) {
				subs, _ = s.fb.Subscriptions(key, p.ID)
			}
			seen := cur
			if p.Location != (model.Location{}) {
				// Its assignments may be those of its place's view.
				sc.ReadFrom(p.Location, func(v snapshot.View) { seen[xdstype.Endpoint] = v.TypeVersion(xdstype.Endpoint) })
			}
			cc := proxyConfig(key, p, &seen, at, subs)
			if !req.GetExcludeResourceContents() {
				cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, subscriptions(subs)...)
			}
			resp.Config = append(resp.Config, cc)
		}
	}
	return resp, nil
}

// scopeConfig is the served state of a scope, as a ClientConfig with no node.
func scopeConfig(key model.Key, v snapshot.View, contents bool) *statusv3.ClientConfig {
	cc := &statusv3.ClientConfig{ClientScope: key.String()}
	for _, t := range xdstype.All() {
		cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, &statusv3.ClientConfig_GenericXdsConfig{
			TypeUrl: t.URL(), VersionInfo: v.TypeVersion(t), ConfigStatus: statusv3.ConfigStatus_SYNCED,
		})
	}
	for _, t := range xdstype.All() {
		var res []*snapshot.Resource
		v.All(t, func(r *snapshot.Resource) { res = append(res, r) })
		sortResources(res)
		for _, r := range res {
			g := &statusv3.ClientConfig_GenericXdsConfig{
				TypeUrl: t.URL(), Name: r.Name, VersionInfo: r.Version, ConfigStatus: statusv3.ConfigStatus_SYNCED,
			}
			if contents {
				g.XdsConfig = r.Body()
			}
			cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, g)
		}
	}
	return cc
}

// proxyConfig is one proxy's state against its scope's current versions
// (cur per type, at for the scope as a whole).
// current reports whether a proxy's acked version of type t is the type's
// current version cur: for a SotW proxy subscribed by name (subs), the
// version of what its names cover (snapshot.SubsetVersion).
func current(p *feedback.Proxy, t xdstype.Type, acked, cur string, subs map[string]feedback.Subscription) bool {
	if acked == cur {
		return true
	}
	sub, ok := subs[t.URL()]
	if p.Protocol != model.SotW || !ok || sub.Wildcard {
		return false
	}
	var names uint64
	for _, n := range sub.Names {
		names ^= snapshot.NameDigest(n)
	}
	return acked == snapshot.SubsetVersion(cur, names)
}

func proxyConfig(key model.Key, p *feedback.Proxy, cur *[xdstype.Count]string, at string, subs map[string]feedback.Subscription) *statusv3.ClientConfig {
	cc := &statusv3.ClientConfig{
		ClientScope: key.String(),
		Node: &corev3.Node{
			Id: p.Node, Cluster: p.Cluster, UserAgentName: p.UserAgent,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				model.ScopeMetadataKey: structpb.NewStringValue(key.String()),
				ProtocolKey:            structpb.NewStringValue(string(p.Protocol)),
				ConnectedKey:           structpb.NewStringValue(p.Since.UTC().Format(time.RFC3339)),
				PeerKey:                structpb.NewStringValue(p.Peer),
			}},
		},
	}
	if p.Identity != "" {
		cc.Node.Metadata.Fields[IdentityKey] = structpb.NewStringValue(p.Identity)
	}
	if loc := p.Location; loc.Zone != "" || loc.Node != "" {
		cc.Node.Locality = &corev3.Locality{Zone: loc.Zone}
		if loc.Source != "" {
			cc.Node.Metadata.Fields[ZoneSourceKey] = structpb.NewStringValue(string(loc.Source))
		}
		if loc.Node != "" {
			cc.Node.Metadata.Fields[NodeNameKey] = structpb.NewStringValue(loc.Node)
		}
	}
	inSync := p.AtVersion != "" && p.AtVersion == at
	for _, t := range xdstype.All() {
		g := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: t.URL()}
		acked, ok := p.Acked[t.URL()]
		g.VersionInfo = acked
		switch {
		case p.Nacked[t.URL()]:
			g.ConfigStatus, g.ClientStatus = statusv3.ConfigStatus_ERROR, adminv3.ClientResourceStatus_NACKED
		case !ok:
			g.ConfigStatus = statusv3.ConfigStatus_NOT_SENT
		case inSync || current(p, t, acked, cur[t], subs):
			// A proxy at the scope's version holds all of it, even when a
			// type's version moved only in names it does not subscribe to.
			g.ConfigStatus, g.ClientStatus = statusv3.ConfigStatus_SYNCED, adminv3.ClientResourceStatus_ACKED
		default:
			g.ConfigStatus, g.ClientStatus = statusv3.ConfigStatus_STALE, adminv3.ClientResourceStatus_ACKED
		}
		if n, ok := p.LastNACK[t.URL()]; ok {
			g.ErrorState = &adminv3.UpdateFailureState{
				LastUpdateAttempt: timestamppb.New(n.Time), Details: n.Detail, VersionInfo: n.Version,
			}
		}
		cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, g)
	}
	return cc
}

// subscriptions lists what a proxy subscribes to, one entry per name ("*"
// for a wildcard), by type then name.
func subscriptions(subs map[string]feedback.Subscription) []*statusv3.ClientConfig_GenericXdsConfig {
	var out []*statusv3.ClientConfig_GenericXdsConfig
	for _, t := range xdstype.All() {
		sub := subs[t.URL()]
		if sub.Wildcard {
			out = append(out, &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: t.URL(), Name: Wildcard})
		}
		for _, n := range sub.Names {
			out = append(out, &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: t.URL(), Name: n})
		}
	}
	return out
}

func sortedProxies(r feedback.Report) []*feedback.Proxy {
	out := slices.Collect(maps.Values(r.Proxies))
	slices.SortFunc(out, func(a, b *feedback.Proxy) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.ID, b.ID))
	})
	return out
}

func sortResources(res []*snapshot.Resource) {
	slices.SortFunc(res, func(a, b *snapshot.Resource) int { return strings.Compare(a.Name, b.Name) })
}

// selector is a compiled list of node matchers; an empty one matches all.
type selector []nodeMatcher

type nodeMatcher struct {
	id   func(string) bool // nil: any
	meta []metaMatcher
}

type metaMatcher struct {
	key     string
	present bool // match on presence only
	value   func(string) bool
}

func compile(ms []*matcherv3.NodeMatcher) (selector, error) {
	var sel selector
	for i, m := range ms {
		var nm nodeMatcher
		if m.GetNodeId() != nil {
			f, err := compileString(m.GetNodeId())
			if err != nil {
				return nil, fmt.Errorf("[%d].node_id: %w", i, err)
			}
			nm.id = f
		}
		for j, sm := range m.GetNodeMetadatas() {
			mm, err := compileMeta(sm)
			if err != nil {
				return nil, fmt.Errorf("[%d].node_metadatas[%d]: %w", i, j, err)
			}
			nm.meta = append(nm.meta, mm)
		}
		sel = append(sel, nm)
	}
	return sel, nil
}

func compileMeta(sm *matcherv3.StructMatcher) (metaMatcher, error) {
	path := sm.GetPath()
	if len(path) != 1 || path[0].GetKey() == "" {
		return metaMatcher{}, errors.New("path must be one key (the reported metadata is flat)")
	}
	mm := metaMatcher{key: path[0].GetKey()}
	v := sm.GetValue()
	switch {
	case v.GetStringMatch() != nil:
		f, err := compileString(v.GetStringMatch())
		if err != nil {
			return metaMatcher{}, err
		}
		mm.value = f
	case v.GetPresentMatch():
		mm.present = true
	default:
		return metaMatcher{}, errors.New("only string_match and present_match are supported")
	}
	return mm, nil
}

func compileString(m *matcherv3.StringMatcher) (func(string) bool, error) {
	fold := func(s string) string { return s }
	if m.GetIgnoreCase() {
		fold = strings.ToLower
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		want := fold(p.Exact)
		return func(s string) bool { return fold(s) == want }, nil
	case *matcherv3.StringMatcher_Prefix:
		want := fold(p.Prefix)
		return func(s string) bool { return strings.HasPrefix(fold(s), want) }, nil
	case *matcherv3.StringMatcher_Suffix:
		want := fold(p.Suffix)
		return func(s string) bool { return strings.HasSuffix(fold(s), want) }, nil
	case *matcherv3.StringMatcher_Contains:
		want := fold(p.Contains)
		return func(s string) bool { return strings.Contains(fold(s), want) }, nil
	case *matcherv3.StringMatcher_SafeRegex:
		// RE2, as Envoy's safe_regex; the whole value must match.
		re, err := regexp.Compile(`^(?:` + p.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return nil, fmt.Errorf("safe_regex: %w", err)
		}
		return re.MatchString, nil
	default:
		return nil, errors.New("string matcher needs exact, prefix, suffix, contains or safe_regex")
	}
}

func (sel selector) matchProxy(key model.Key, p *feedback.Proxy) bool {
	if len(sel) == 0 {
		return true
	}
	meta := map[string]string{model.ScopeMetadataKey: key.String(), ProtocolKey: string(p.Protocol),
		ConnectedKey: p.Since.UTC().Format(time.RFC3339)}
	for _, m := range sel {
		if (m.id == nil || m.id(p.Node)) && m.matchMeta(meta) {
			return true
		}
	}
	return false
}

// matchScope matches a scope entry: only matchers without a node_id can.
func (sel selector) matchScope(key model.Key, p model.Protocol) bool {
	if len(sel) == 0 {
		return true
	}
	meta := map[string]string{model.ScopeMetadataKey: key.String(), ProtocolKey: string(p)}
	for _, m := range sel {
		if m.id == nil && m.matchMeta(meta) {
			return true
		}
	}
	return false
}

func (m nodeMatcher) matchMeta(meta map[string]string) bool {
	for _, mm := range m.meta {
		v, ok := meta[mm.key]
		if !ok || (!mm.present && !mm.value(v)) {
			return false
		}
	}
	return true
}

// ServeListener serves CSDS on lis until ctx ends. The listener should be
// on a loopback address: the service is unauthenticated and shows every
// scope's configuration, so it is reached through kubectl port-forward,
// which the pods/portforward RBAC permission guards.
func (s *Server) ServeListener(ctx context.Context, lis net.Listener) error {
	g := grpc.NewServer()
	s.Register(g)
	return server.ServeUntil(ctx, g, lis, g.Stop)
}
