package model

import (
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestSelectionMismatchSaysWhy(t *testing.T) {
	svc := &Service{Key: Key{Namespace: "shop", Name: "cart"}, Labels: map[string]string{"tier": "web"}}
	team, _ := labels.Parse("team=shop")
	web, _ := labels.Parse("tier=web")
	db, _ := labels.Parse("tier=db")
	cases := []struct {
		sel      Selection
		nsLabels map[string]string
		nsKnown  bool
		want     string
	}{
		{Selection{Namespace: "shop", Selector: web}, nil, true, ""},
		{Selection{Namespace: "shop", Names: map[string]struct{}{"cart": {}}}, nil, true, ""},
		{Selection{NamespaceSelector: team}, map[string]string{"team": "shop"}, true, ""},
		{Selection{Namespace: "web"}, nil, true, `it selects namespace "web", the Service is in "shop"`},
		{Selection{Namespace: "shop", Names: map[string]struct{}{"b": {}, "a": {}}}, nil, true, `"cart" is not among its names [a b]`},
		{Selection{Namespace: "shop", Selector: db}, nil, true, "the Service's labels {tier=web} do not match selector {tier=db}"},
		{Selection{NamespaceSelector: team}, map[string]string{"team": "ops"}, true, `the labels of namespace "shop" {team=ops} do not match namespaceSelector {team=shop}`},
		{Selection{NamespaceSelector: team}, nil, false, `namespace "shop" does not exist`},
	}
	for _, c := range cases {
		got := c.sel.Mismatch(svc, c.nsLabels, c.nsKnown)
		if got != c.want {
			t.Errorf("%+v: Mismatch = %q, want %q", c.sel, got, c.want)
		}
		if c.sel.Matches(svc, c.nsLabels, c.nsKnown) != (c.want == "") {
			t.Errorf("%+v: Matches disagrees with Mismatch %q", c.sel, got)
		}
	}
}
