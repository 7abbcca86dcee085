package server

import (
	"cmp"
	"strconv"
	"strings"

	"github.com/scopeplane/scopeplane/xds/cost"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/translate"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// otherResponse is what the other protocol would have sent for a
// response: the bytes its resources and removals add, how many resources,
// and in how many responses (0: it would have sent nothing).
type otherResponse struct {
	entries   int
	resources int
	responses int
	// drains counts the responses among them that SotW sends as a
	// make-before-break step, whose version carries the draining suffix.
	drains int
	// pipelined marks the first of them as a SotW by-name response sent
	// while the one before it was unanswered, whose version says so.
	pipelined bool
	// typeURL, when set, heads the responses instead of this response's
	// type: the other protocol carries the change as another type (an
	// Envoy-mode scope's virtual hosts are VHDS resources in delta, inline
	// in the route configuration in SotW). version, when set, is their
	// version: SotW's by-name versions cover the names subscribed, and so
	// differ from delta's, the type's.
	typeURL, version string
	// vhds counts further responses of virtual hosts at vhdsVersion: where
	// SotW sends an inline route configuration when a stream connects,
	// delta sends the route configuration and then its virtual hosts.
	vhds        int
	vhdsVersion string
}

// price is the other protocol's responses in bytes, each with the header
// this response's version and type would have had there, and the nonce the
// other protocol's stream would have numbered it with, counted in *nonces.
func (o otherResponse) price(version, typeURL string, nonces *uint64) int {
	typeURL, version = cmp.Or(o.typeURL, typeURL), cmp.Or(o.version, version)
	n := o.entries
	header := func(version, typeURL string) int {
		*nonces++
		return cost.Header(version, typeURL, strconv.FormatUint(*nonces, 10))
	}
	for i := range o.responses {
		switch {
		case i < o.drains:
			n += header(version+draining, typeURL)
		case i == 0 && o.pipelined:
			n += header(version+pipelined, typeURL)
		default:
			n += header(version, typeURL)
		}
	}
	for range o.vhds {
		n += header(o.vhdsVersion, xdstype.VirtualHost.URL())
	}
	return n
}

// deltaVHDS reports whether the scope's Delta proxies fetch (or, for a SotW
// scope, would fetch) its virtual hosts by VHDS: what a SotW stream prices
// the other protocol's route configurations with. Otherwise Delta carries
// them inline, as SotW does.
func deltaVHDS(v snapshot.View) bool {
	spec := v.Spec()
	return spec != nil && spec.Listener.Mode == model.ListenerEnvoy && spec.Listener.VHDS
}

// envoyMode reports whether the view's scope is in Envoy mode, whose
// virtual hosts are VirtualHost resources in both protocols (see
// translate.VHDS), and whether its route configuration fetches them by
// VHDS rather than carrying them inline.
func envoyMode(v snapshot.View) (envoy, vhds bool) {
	spec := v.Spec()
	if spec == nil || spec.Listener.Mode != model.ListenerEnvoy {
		return false, false
	}
	return true, translate.VHDS(spec)
}

// routeOf is the route configuration a VHDS resource belongs to: its name
// before the last slash.
func routeOf(virtualHost string) string {
	if i := strings.LastIndexByte(virtualHost, '/'); i >= 0 {
		return virtualHost[:i]
	}
	return virtualHost
}

// draining marks the version of a make-before-break response.
const draining = "-draining"

// pipelined marks the version of a by-name response sent while an earlier
// one of its type was unanswered.
const pipelined = "-pipelined"
