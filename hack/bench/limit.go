package main

import (
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// The smallest response stream a server could send is built with short
// versions and nonces: an 8-character version (a 32-bit content hash in
// hex), a 1-character nonce, and no system_version_info in delta.
const (
	limitVersion = "00000000"
	limitNonce   = "1"
)

// limitBytes is the size of the smallest valid response stream that brings
// one proxy of a scope from the old truth to next, given their diff: only
// the changed resources, per type that changed, as the protocol allows.
//
// SotW: a Cluster or Listener change needs the complete set of its type
// (omission is deletion there); an assignment or route change needs only the
// changed resources, and their removal needs no response (the proxy stops
// asking when the cluster or listener goes). Delta: the changed resources,
// each with its version, plus removed_resources.
func limitBytes(p model.Protocol, next *Truth, changes []ResChange) int {
	var byType [xdstype.Count][]ResChange
	for _, c := range changes {
		byType[c.T] = append(byType[c.T], c)
	}
	total := 0
	for t := range xdstype.Count {
		cs := byType[t]
		if len(cs) == 0 {
			continue
		}
		if p == model.SotW {
			resp := &discoveryv3.DiscoveryResponse{VersionInfo: limitVersion, TypeUrl: t.URL(), Nonce: limitNonce}
			if t.FullState() {
				for _, r := range next[t] {
					resp.Resources = append(resp.Resources, &anypb.Any{TypeUrl: t.URL(), Value: r.Body})
				}
			} else {
				for _, c := range cs {
					if c.Present {
						resp.Resources = append(resp.Resources, &anypb.Any{TypeUrl: t.URL(), Value: next[t][c.Name].Body})
					}
				}
				if len(resp.Resources) == 0 {
					continue
				}
			}
			total += proto.Size(resp)
			continue
		}
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: t.URL(), Nonce: limitNonce}
		for _, c := range cs {
			if c.Present {
				resp.Resources = append(resp.Resources, &discoveryv3.Resource{
					Name: c.Name, Version: limitVersion,
					Resource: &anypb.Any{TypeUrl: t.URL(), Value: next[t][c.Name].Body},
				})
			} else {
				resp.RemovedResources = append(resp.RemovedResources, c.Name)
			}
		}
		total += proto.Size(resp)
	}
	return total
}
