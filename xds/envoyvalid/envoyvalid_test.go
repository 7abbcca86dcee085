package envoyvalid

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	headersessionv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/stateful_session/header/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestMessageEntersAnys checks that what an Any packs is validated, and
// that a packed type this binary does not know is refused, as Envoy
// refuses an extension it lacks; ValidateAll alone passes both.
func TestMessageEntersAnys(t *testing.T) {
	packed, err := anypb.New(&headersessionv3.HeaderBasedSessionState{})
	if err != nil {
		t.Fatal(err)
	}
	r := &routev3.Route{
		Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action:               &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "c"}}},
		TypedPerFilterConfig: map[string]*anypb.Any{"envoy.filters.http.stateful_session": packed},
	}
	if err := r.ValidateAll(); err != nil {
		t.Fatalf("ValidateAll: %v", err)
	}
	if err := Message(r); err == nil || !strings.Contains(err.Error(), "Name") {
		t.Errorf("a header session without a name: %v, want refused", err)
	}
	r.TypedPerFilterConfig["envoy.filters.http.stateful_session"] = &anypb.Any{TypeUrl: "type.googleapis.com/no.such.Filter"}
	if err := Message(r); err == nil {
		t.Error("an unknown packed type passes")
	}
}
