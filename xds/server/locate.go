package server

import (
	"math"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Zones tells the topology zone of a Kubernetes Node.
type Zones interface {
	// Zone is the Node's topology.kubernetes.io/zone label; ok is false
	// when the Node is not known (yet, or any more) or has no such label.
	Zone(node string) (zone string, ok bool)
}

// locate says where a new stream's proxy runs, from what is most trusted:
// the Node its authenticated token names, through that Node's zone label;
// otherwise the zone its bootstrap declares (node.locality.zone), which
// nothing verifies, cut to what a zone label holds. A token's Node that is
// not known falls back to the bootstrap too, still naming the Node.
func (s *Server) locate(id *auth.Identity, node *corev3.Node) model.Location {
	var loc model.Location
	if id != nil && id.NodeName != "" {
		loc.Node = id.NodeName
		if s.opts.Zones != nil {
			if zone, ok := s.opts.Zones.Zone(id.NodeName); ok {
				loc.Zone, loc.Source = zone, model.LocatedByNode
				return loc
			}
		}
	}
	if zone := node.GetLocality().GetZone(); zone != "" {
		loc.Zone, loc.Source = feedback.Cut(zone, feedback.MaxZoneChars, math.MaxInt), model.LocatedByBootstrap
	}
	return loc
}
