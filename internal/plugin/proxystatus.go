package plugin

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// scopeMatcher selects one scope's entry and its proxies.
func scopeMatcher(scope string) []*matcherv3.NodeMatcher {
	return []*matcherv3.NodeMatcher{{NodeMetadatas: []*matcherv3.StructMatcher{{
		Path:  []*matcherv3.StructMatcher_PathSegment{{Segment: &matcherv3.StructMatcher_PathSegment_Key{Key: model.ScopeMetadataKey}}},
		Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: scope}}}},
	}}}}
}

func checkScope(arg string) error {
	if ns, name, ok := strings.Cut(arg, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return usageError(fmt.Sprintf("%q is not <namespace>/<scope>", arg))
	}
	return nil
}

// proxyStatus prints one row per proxy connected to a replica that
// answered: its scope, protocol and, per type, whether it holds what its
// scope serves now. The replicas that did not answer are named on stderr
// (query), and the command succeeds when any replica answered.
func (o *options) proxyStatus(ctx context.Context, args []string) error {
	req := &statusv3.ClientStatusRequest{ExcludeResourceContents: true}
	switch len(args) {
	case 0:
	case 1:
		if err := checkScope(args[0]); err != nil {
			return err
		}
		req.NodeMatchers = scopeMatcher(args[0])
	default:
		return usageError("proxy-status takes at most one <namespace>/<scope>")
	}
	if o.output != "" && o.output != "wide" && o.output != "json" {
		return usageError(fmt.Sprintf("-o %q: want wide or json", o.output))
	}
	replicas, err := o.query(ctx, req)
	if err != nil {
		return err
	}
	if o.output == "json" {
		for _, r := range replicas {
			b, err := protojson.MarshalOptions{Multiline: true}.Marshal(r.resp)
			if err != nil {
				return err
			}
			o.printf("%s\n", b)
		}
		return nil
	}
	tw := tabwriter.NewWriter(o.stdout, 0, 4, 2, ' ', 0)
	header := []string{"NAME", "PEER", "IDENTITY", "ZONE", "SCOPE", "PROTOCOL"}
	for _, t := range xdstype.All() {
		header = append(header, t.String())
	}
	_, _ = fmt.Fprintln(tw, strings.Join(append(header, "REPLICA", "AGE"), "\t"))
	var nacks []string
	rows := 0
	for _, r := range replicas {
		current := currentVersions(r.resp)
		for _, cc := range r.resp.GetConfig() {
			if cc.GetNode() == nil {
				continue
			}
			meta := cc.GetNode().GetMetadata().GetFields()
			peer := cmp.Or(meta[csds.PeerKey].GetStringValue(), "-")
			identity := cmp.Or(meta[csds.IdentityKey].GetStringValue(), "-")
			row := []string{cc.GetNode().GetId(), peer, identity, zoneOf(cc.GetNode()), cc.GetClientScope(), meta[csds.ProtocolKey].GetStringValue()}
			for _, g := range cc.GetGenericXdsConfigs() {
				if g.GetName() != "" {
					continue // a subscription entry, sent with resource contents only
				}
				row = append(row, o.cell(g, current[cc.GetClientScope()][g.GetTypeUrl()]))
				if e := g.GetErrorState(); e != nil && g.GetConfigStatus() == statusv3.ConfigStatus_ERROR {
					t, _ := xdstype.ByURL(g.GetTypeUrl())
					nacks = append(nacks, fmt.Sprintf("%s (%s) %s rejected version %s %s ago: %s", cc.GetNode().GetId(), peer, t,
						e.GetVersionInfo(), since(e.GetLastUpdateAttempt().AsTime()), e.GetDetails()))
				}
			}
			age := ""
			if t, err := time.Parse(time.RFC3339, meta[csds.ConnectedKey].GetStringValue()); err == nil {
				age = since(t)
			}
			_, _ = fmt.Fprintln(tw, strings.Join(append(row, r.name, age), "\t"))
			rows++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rows == 0 {
		o.printf("no proxies connected to the %d replica(s) that answered\n", len(replicas))
	}
	for _, n := range nacks {
		o.printf("NACK: %s\n", n)
	}
	return nil
}

// zoneOf renders where a proxy runs: its zone, then how it is known (the
// Node its token names, or "declared" by its bootstrap); "-" when unknown.
func zoneOf(node *corev3.Node) string {
	meta := node.GetMetadata().GetFields()
	zone, nodeName := node.GetLocality().GetZone(), meta[csds.NodeNameKey].GetStringValue()
	switch {
	case meta[csds.ZoneSourceKey].GetStringValue() == string(model.LocatedByNode):
		return zone + " (node " + nodeName + ")"
	case zone != "":
		return zone + " (declared)"
	case nodeName != "":
		return "- (node " + nodeName + ")"
	}
	return "-"
}

// currentVersions maps scope → type URL → the version the scope serves, from
// the scope entries (no node, empty resource name).
func currentVersions(resp *statusv3.ClientStatusResponse) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, cc := range resp.GetConfig() {
		if cc.GetNode() != nil {
			continue
		}
		m := map[string]string{}
		for _, g := range cc.GetGenericXdsConfigs() {
			if g.GetName() == "" {
				m[g.GetTypeUrl()] = g.GetVersionInfo()
			}
		}
		out[cc.GetClientScope()] = m
	}
	return out
}

// cell is one type's state of a proxy: the status, and with -o wide the
// version it ACKed, followed by the one served when they differ.
func (o *options) cell(g *statusv3.ClientConfig_GenericXdsConfig, current string) string {
	s := strings.ReplaceAll(g.GetConfigStatus().String(), "_", " ")
	if g.GetConfigStatus() == statusv3.ConfigStatus_ERROR {
		s = "NACKED"
	}
	if o.output != "wide" {
		return s
	}
	acked := g.GetVersionInfo()
	if acked == "" {
		acked = "-"
	}
	if current != "" && current != g.GetVersionInfo() {
		return fmt.Sprintf("%s %s→%s", s, acked, current)
	}
	return s + " " + acked
}

func since(t time.Time) string { return duration.HumanDuration(time.Since(t)) }
