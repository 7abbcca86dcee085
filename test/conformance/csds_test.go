package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/internal/plugin"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/csds"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// serveCSDS serves the plane's status service on a loopback port of its own,
// as the operator does, and returns its address.
func (p *plane) serveCSDS() string {
	p.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Status.ServeListener(ctx, lis) }()
	p.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			p.t.Errorf("CSDS: %v", err)
		}
	})
	return lis.Addr().String()
}

func fetchCSDS(t *testing.T, addr string, req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	return statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(context.Background(), req)
}

// alwaysReject NACKs every response of one type.
func alwaysReject(typeURL, detail string) func(string, []*anypb.Any, []string) string {
	return func(t string, _ []*anypb.Any, _ []string) string {
		if t == typeURL {
			return detail
		}
		return ""
	}
}

func TestClientStatus(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			addr := p.serveCSDS()
			good := p.connect(testkit.WildcardClient(pr.client, testkit.Node("envoy-1", "shop/gw")))
			synced(good, "shop/a:80", "shop/b:80", "shop/c:80")
			good.settled()
			cfg := testkit.WildcardClient(pr.client, testkit.Node("picky", "shop/gw"))
			cfg.Reject = alwaysReject(xdstype.Cluster.URL(), "cluster shop/a:80: bad timeout")
			picky := p.connect(cfg)
			picky.wait("the NACK", func(c *adsclient.Client) bool { return c.Stats().NACKs >= 1 })
			picky.settled()

			var current [xdstype.Count]string
			p.Store.Get(model.Key{Namespace: "shop", Name: "gw"}).Read(func(v snapshot.View) {
				for ty := range xdstype.Count {
					current[ty] = v.TypeVersion(ty)
				}
			})

			resp, err := fetchCSDS(t, addr, &statusv3.ClientStatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			byNode := map[string]*statusv3.ClientConfig{}
			var scope *statusv3.ClientConfig
			for _, cc := range resp.GetConfig() {
				if cc.GetClientScope() != "shop/gw" {
					t.Errorf("client_scope %q, want shop/gw", cc.GetClientScope())
				}
				if cc.GetNode() == nil {
					scope = cc
					continue
				}
				byNode[cc.GetNode().GetId()] = cc
				if got := cc.GetNode().GetMetadata().GetFields()[csds.ProtocolKey].GetStringValue(); got != pr.name {
					t.Errorf("%s: protocol %q, want %q", cc.GetNode().GetId(), got, pr.name)
				}
			}
			if len(byNode) != 2 || scope == nil {
				t.Fatalf("want two proxies and one scope entry, got %v", resp)
			}
			// One entry per type, then (contents were asked for) what the
			// proxy subscribes to: a wildcard of every type.
			// A SotW proxy, like Envoy, never asks for VHDS.
			for i, g := range byNode["envoy-1"].GetGenericXdsConfigs()[:xdstype.Count] {
				wantStatus, wantVersion := statusv3.ConfigStatus_SYNCED, current[i]
				if xdstype.Type(i).Info().DeltaOnly && pr.client == adsclient.SotW {
					wantStatus, wantVersion = statusv3.ConfigStatus_NOT_SENT, ""
				}
				if g.GetConfigStatus() != wantStatus || g.GetVersionInfo() != wantVersion {
					t.Errorf("envoy-1 %s: %v at %q, want %v at %q", g.GetTypeUrl(), g.GetConfigStatus(), g.GetVersionInfo(), wantStatus, wantVersion)
				}
			}
			wantSubs, vhds := []string{"CDS *", "EDS *", "LDS *", "RDS *", "VHDS *"}, `SYNCED`
			if pr.client == adsclient.SotW {
				wantSubs, vhds = wantSubs[:4], `NOT SENT`
			}
			if got, want := subscriptionsOf(t, byNode["envoy-1"]), wantSubs; !slices.Equal(got, want) {
				t.Errorf("envoy-1 subscribes to %q, want %q", got, want)
			}
			cds := byNode["picky"].GetGenericXdsConfigs()[xdstype.Cluster]
			if cds.GetConfigStatus() != statusv3.ConfigStatus_ERROR || cds.GetErrorState().GetDetails() != "cluster shop/a:80: bad timeout" ||
				cds.GetErrorState().GetVersionInfo() != current[xdstype.Cluster] {
				t.Errorf("picky's CDS: %v", cds)
			}
			// The scope: per-type versions, then every resource with its body.
			names := map[string]bool{}
			for _, g := range scope.GetGenericXdsConfigs() {
				ty, _ := xdstype.ByURL(g.GetTypeUrl())
				switch {
				case g.GetName() == "" && g.GetVersionInfo() != current[ty]:
					t.Errorf("scope %s at %q, want %q", ty, g.GetVersionInfo(), current[ty])
				case g.GetName() != "" && g.GetXdsConfig() == nil:
					t.Errorf("%s %s has no body", ty, g.GetName())
				case ty == xdstype.Cluster && g.GetName() != "":
					var c clusterv3.Cluster
					if err := g.GetXdsConfig().UnmarshalTo(&c); err != nil || c.GetName() != g.GetName() {
						t.Errorf("cluster %s: %v, %v", g.GetName(), c.GetName(), err)
					}
					names[g.GetName()] = true
				}
			}
			if len(names) != 3 {
				t.Errorf("scope lists clusters %v, want shop/a:80, shop/b:80, shop/c:80", names)
			}

			// Matchers: a node id selects that proxy only, a scope its entry
			// and proxies; unsupported matchers are refused, not ignored.
			resp, err = fetchCSDS(t, addr, &statusv3.ClientStatusRequest{ExcludeResourceContents: true,
				NodeMatchers: []*matcherv3.NodeMatcher{{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "pick"}}}}})
			if err != nil || len(resp.GetConfig()) != 1 || resp.GetConfig()[0].GetNode().GetId() != "picky" {
				t.Errorf("node_id prefix \"pick\": %v, %v", resp, err)
			}
			resp, err = fetchCSDS(t, addr, &statusv3.ClientStatusRequest{NodeMatchers: []*matcherv3.NodeMatcher{{NodeMetadatas: []*matcherv3.StructMatcher{{
				Path:  []*matcherv3.StructMatcher_PathSegment{{Segment: &matcherv3.StructMatcher_PathSegment_Key{Key: model.ScopeMetadataKey}}},
				Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "shop/other"}}}},
			}}}}})
			if err != nil || len(resp.GetConfig()) != 0 {
				t.Errorf("another scope's matcher: %v, %v", resp, err)
			}
			_, err = fetchCSDS(t, addr, &statusv3.ClientStatusRequest{NodeMatchers: []*matcherv3.NodeMatcher{{NodeMetadatas: []*matcherv3.StructMatcher{{
				Path:  []*matcherv3.StructMatcher_PathSegment{{Segment: &matcherv3.StructMatcher_PathSegment_Key{Key: model.ScopeMetadataKey}}},
				Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_BoolMatch{BoolMatch: true}},
			}}}}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "only string_match and present_match") {
				t.Errorf("bool_match: %v, want InvalidArgument naming what is supported", err)
			}

			// The kubectl plugin, at the same address.
			out := runPlugin(t, "proxy-status", "--address", addr)
			for _, want := range []string{
				// PEER is the address each stream came from; IDENTITY and ZONE
				// are "-" for these anonymous streams that declare no zone.
				`(?m)^envoy-1\s+127\.0\.0\.1:\d+\s+-\s+-\s+shop/gw\s+` + pr.name + `\s+SYNCED\s+SYNCED\s+SYNCED\s+SYNCED\s+` + vhds + `\s+` + regexp.QuoteMeta(addr),
				`(?m)^picky\s+127\.0\.0\.1:\d+\s+-\s+-\s+shop/gw\s+` + pr.name + `\s+NACKED\s`,
				`NACK: picky \(127\.0\.0\.1:\d+\) CDS rejected version ` + current[xdstype.Cluster] + ` .* ago: cluster shop/a:80: bad timeout`,
			} {
				if !regexp.MustCompile(want).MatchString(out) {
					t.Errorf("proxy-status output lacks %s:\n%s", want, out)
				}
			}
			out = runPlugin(t, "proxy-status", "shop/gw", "-o", "wide", "--address", addr)
			if !strings.Contains(out, "SYNCED "+current[xdstype.Endpoint]) {
				t.Errorf("proxy-status -o wide shows no EDS version %s:\n%s", current[xdstype.Endpoint], out)
			}
			var d struct {
				Versions  map[string]string
				Resources []struct {
					Type, Name, Version string
					Resource            map[string]any
				}
			}
			if err := json.Unmarshal([]byte(runPlugin(t, "config-dump", "shop/gw", "--type", "clusters", "--address", addr)), &d); err != nil {
				t.Fatal(err)
			}
			if len(d.Resources) != 3 || d.Versions["CDS"] != current[xdstype.Cluster] || d.Resources[0].Name != "shop/a:80" ||
				d.Resources[0].Resource["@type"] != xdstype.Cluster.URL() || d.Resources[0].Resource["name"] != "shop/a:80" {
				t.Errorf("config-dump --type clusters: %+v", d)
			}
		})
	}
}

func runPlugin(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := plugin.Main(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("kubectl scopeplane %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String()
}

// subscriptionsOf lists a proxy entry's subscription entries as "<type> <name>".
func subscriptionsOf(t *testing.T, cc *statusv3.ClientConfig) []string {
	t.Helper()
	var out []string
	for _, g := range cc.GetGenericXdsConfigs() {
		if g.GetName() == "" {
			continue
		}
		ty, _ := xdstype.ByURL(g.GetTypeUrl())
		out = append(out, ty.String()+" "+g.GetName())
		if g.GetVersionInfo() != "" || g.GetConfigStatus() != statusv3.ConfigStatus_UNKNOWN {
			t.Errorf("a subscription entry claims a version or status: %v", g)
		}
	}
	return out
}

// A by-name proxy holds only what it asks for, so the client status names,
// per type, what each proxy subscribes to: explain must not take a proxy in
// sync on a type to hold every resource of the type.
func TestClientStatusNamesSubscriptions(t *testing.T) {
	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			p := world(t, pr.scope)
			addr := p.serveCSDS()
			cfg := adsclient.Config{Protocol: pr.client, Node: testkit.Node("by-name", "shop/gw"), Types: xdstype.URLs(),
				Wildcard: map[string]bool{xdstype.Listener.URL(): true},
				Names: map[string][]string{
					xdstype.Cluster.URL():  {"shop/a:80"},
					xdstype.Endpoint.URL(): {"shop/a:80"},
					xdstype.Route.URL():    {"http-10080"},
				}}
			px := p.connect(cfg)
			px.wait("cluster shop/a:80 alone", func(c *adsclient.Client) bool {
				_, eds := c.State(xdstype.Endpoint.URL())["shop/a:80"]
				return holds(xdstype.Cluster.URL(), "shop/a:80")(c) && eds && holds(xdstype.Route.URL(), "http-10080")(c)
			})

			proxyEntry := func(req *statusv3.ClientStatusRequest) *statusv3.ClientConfig {
				t.Helper()
				req.NodeMatchers = []*matcherv3.NodeMatcher{{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "by-name"}}}}
				resp, err := fetchCSDS(t, addr, req)
				if err != nil || len(resp.GetConfig()) != 1 {
					t.Fatalf("by-name's status: %v, %v", resp, err)
				}
				return resp.GetConfig()[0]
			}
			want := []string{"CDS shop/a:80", "EDS shop/a:80", "LDS *", "RDS http-10080"}
			if got := subscriptionsOf(t, proxyEntry(&statusv3.ClientStatusRequest{})); !slices.Equal(got, want) {
				t.Errorf("by-name subscribes to %q, want %q", got, want)
			}
			if got := proxyEntry(&statusv3.ClientStatusRequest{ExcludeResourceContents: true}).GetGenericXdsConfigs(); len(got) != int(xdstype.Count) {
				t.Errorf("without contents, the proxy entry has %d entries, want one per type: %v", len(got), got)
			}

			// The subscription follows the proxy's requests.
			if err := px.Subscribe(xdstype.Cluster.URL(), "shop/b:80"); err != nil {
				t.Fatal(err)
			}
			if err := px.Unsubscribe(xdstype.Cluster.URL(), "shop/a:80"); err != nil {
				t.Fatal(err)
			}
			px.wait("cluster shop/b:80 alone", holds(xdstype.Cluster.URL(), "shop/b:80"))
			want = []string{"CDS shop/b:80", "EDS shop/a:80", "LDS *", "RDS http-10080"}
			testkit.Eventually(t, "the new subscription reported", func() (bool, string) {
				got := subscriptionsOf(t, proxyEntry(&statusv3.ClientStatusRequest{}))
				return slices.Equal(got, want), fmt.Sprintf("%q, want %q", got, want)
			})
		})
	}
}
