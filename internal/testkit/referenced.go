package testkit

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// Referenced returns the names of type t that what c holds refers to, and
// which a SotW proxy must therefore subscribe to, as Envoy does: EDS names
// of its EDS clusters (t Endpoint), route configuration names of its
// listeners' HTTP connection managers (t Route); none for other types. A
// SotW response of those types carries only the names asked for, so a proxy
// that stayed subscribed to a name no longer referred to would keep its
// resource after it was deleted.
func Referenced(c *adsclient.Client, t string) (map[string]struct{}, error) {
	out := map[string]struct{}{}
	switch t {
	case xdstype.Endpoint.URL():
		for name, h := range c.State(xdstype.Cluster.URL()) {
			cl, err := adsclient.Decode[*clusterv3.Cluster](h)
			if err != nil {
				return nil, fmt.Errorf("held cluster %q: %w", name, err)
			}
			if cl.GetType() != clusterv3.Cluster_EDS {
				continue
			}
			n := cl.GetEdsClusterConfig().GetServiceName()
			if n == "" {
				n = cl.GetName()
			}
			out[n] = struct{}{}
		}
	case xdstype.Route.URL():
		for name, h := range c.State(xdstype.Listener.URL()) {
			l, err := adsclient.Decode[*listenerv3.Listener](h)
			if err != nil {
				return nil, fmt.Errorf("held listener %q: %w", name, err)
			}
			var hcms []*hcmv3.HttpConnectionManager
			if a := l.GetApiListener().GetApiListener(); a != nil {
				m := &hcmv3.HttpConnectionManager{}
				if err := a.UnmarshalTo(m); err != nil {
					return nil, fmt.Errorf("listener %q api_listener: %w", name, err)
				}
				hcms = append(hcms, m)
			}
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					if tc := f.GetTypedConfig(); tc != nil && tc.MessageIs(&hcmv3.HttpConnectionManager{}) {
						m := &hcmv3.HttpConnectionManager{}
						if err := tc.UnmarshalTo(m); err != nil {
							return nil, fmt.Errorf("listener %q filter %q: %w", name, f.GetName(), err)
						}
						hcms = append(hcms, m)
					}
				}
			}
			for _, m := range hcms {
				if n := m.GetRds().GetRouteConfigName(); n != "" {
					out[n] = struct{}{}
				}
			}
		}
	}
	return out, nil
}
