package plugin

import (
	"strings"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/translate"
)

// TestDescribeAction checks that explain tells where an Envoy entry sends
// requests, with what else it does to them: a redirect, mirrors and their
// share, a kept session.
func TestDescribeAction(t *testing.T) {
	web := func(name string) *model.Service {
		return &model.Service{Key: model.Key{Namespace: "shop", Name: name}, Ports: []model.ServicePort{{Port: 80, Protocol: model.ProtocolTCP, TargetPort: 80}}}
	}
	svc := web("web")
	backend := model.RouteBackend{Service: model.Key{Namespace: "shop", Name: "web"}, Port: 80, Weight: 1}
	mirror := model.RouteBackend{Service: model.Key{Namespace: "shop", Name: "audit"}, Port: 80, Weight: 1}
	r := &model.Route{
		Key: model.Key{Namespace: "shop", Name: "r"}, Kind: model.HTTPRoute,
		Parents: []model.RouteParent{{Service: svc.Key}},
		Rules: []model.RouteRule{
			{Matches: []model.RouteMatch{{PathType: model.PathExact, Path: "/old"}}, Redirect: &model.Redirect{Hostname: "example.org", StatusCode: 301}},
			{
				Backends: []model.RouteBackend{backend},
				Mirrors:  []model.RouteMirror{{Backend: mirror, Numerator: 1, Denominator: 1}, {Backend: mirror, Numerator: 5, Denominator: 100}},
				Session:  &model.SessionPersistence{Name: "s"},
			},
		},
	}
	rt := &translate.Routing{Routes: []*model.Route{r}, Backends: map[model.Key]*model.Service{svc.Key: svc, mirror.Service: web("audit")}}
	entries, _ := translate.Entries(svc, 80, rt, model.ListenerEnvoy)
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2", len(entries))
	}
	if got := describeAction(entries[0].Route); got != "redirected (moved permanently)" {
		t.Errorf("redirect: %q", got)
	}
	got := describeAction(entries[1].Route)
	for _, want := range []string{"cluster shop/web:80", "copied to shop/audit:80, copied to shop/audit:80 (5 per hundred)", "a client kept on its endpoint (session persistence)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q does not say %q", got, want)
		}
	}
}
