package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/protobuf/encoding/protojson"

	// The translator (imported for explain) registers every message type its
	// resources embed, so that their bodies print as JSON.
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// typeWords are the names --type accepts for each type.
var typeWords = map[string]xdstype.Type{}

func init() {
	for _, t := range xdstype.All() {
		typeWords[strings.ToLower(t.String())] = t
	}
	typeWords["clusters"], typeWords["endpoints"] = typeWords["cds"], typeWords["eds"]
	typeWords["listeners"], typeWords["routes"] = typeWords["lds"], typeWords["rds"]
}

// dump is config-dump's output.
type dump struct {
	Scope     string         `json:"scope"`
	Replica   string         `json:"replica"`
	Versions  map[string]any `json:"versions"`
	Resources []dumpResource `json:"resources"`
}

type dumpResource struct {
	Type     string          `json:"type"`
	Name     string          `json:"name"`
	Version  string          `json:"version"`
	Resource json.RawMessage `json:"resource,omitempty"`
}

// configDump prints what a scope serves: every resource with its version
// and, unless --names-only, its contents as JSON.
func (o *options) configDump(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return usageError("config-dump takes one <namespace>/<scope>")
	}
	if err := checkScope(args[0]); err != nil {
		return err
	}
	only, filtered := xdstype.Type(0), false
	if o.typ != "" {
		t, ok := typeWords[strings.ToLower(o.typ)]
		if !ok {
			return usageError(fmt.Sprintf("--type %q: want clusters, endpoints, listeners or routes", o.typ))
		}
		only, filtered = t, true
	}
	replicas, err := o.query(ctx, &statusv3.ClientStatusRequest{NodeMatchers: scopeMatcher(args[0]), ExcludeResourceContents: o.namesOnly})
	if err != nil {
		return err
	}
	// Every replica that serves the scope serves the same content-hash
	// versions once it has seen the same objects, so the first answer that
	// holds it stands for all; with shards, only its shard's replicas do.
	var (
		r     replica
		scope *statusv3.ClientConfig
	)
	for _, rr := range replicas {
		for _, cc := range rr.resp.GetConfig() {
			if cc.GetNode() == nil && cc.GetClientScope() == args[0] {
				r, scope = rr, cc
			}
		}
		if scope != nil {
			break
		}
	}
	if scope == nil {
		return fmt.Errorf("no replica (of %d asked) serves ProxyScope %s: it does not exist, or is not Accepted (kubectl get proxyscope -n %s)",
			len(replicas), args[0], strings.Split(args[0], "/")[0])
	}
	out := dump{Scope: args[0], Replica: r.name, Versions: map[string]any{}, Resources: []dumpResource{}}
	for _, g := range scope.GetGenericXdsConfigs() {
		t, ok := xdstype.ByURL(g.GetTypeUrl())
		if !ok || (filtered && t != only) {
			continue
		}
		if g.GetName() == "" {
			out.Versions[t.String()] = g.GetVersionInfo()
			continue
		}
		dr := dumpResource{Type: t.String(), Name: g.GetName(), Version: g.GetVersionInfo()}
		if g.GetXdsConfig() != nil {
			if dr.Resource, err = protojson.Marshal(g.GetXdsConfig()); err != nil {
				return fmt.Errorf("%s %s: %w", t, g.GetName(), err)
			}
		}
		out.Resources = append(out.Resources, dr)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	o.printf("%s\n", b)
	return nil
}
