package feedback

import (
	"slices"
	"testing"

	"github.com/scopeplane/scopeplane/xds/model"
)

// Subscriptions follow each change of a stream's subscription, and end
// with the stream.
func TestSubscriptions(t *testing.T) {
	key := model.Key{Namespace: "shop", Name: "gw"}
	const cds, eds = "type.googleapis.com/envoy.config.cluster.v3.Cluster", "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	tr := New(0)
	id := tr.Connect(key, nil, model.SotW, "", "", model.Location{})
	tr.Subscribed(key, id, cds, nil, true)
	tr.Subscribed(key, id, eds, names{"shop/b:80", "shop/a:80"}, false)
	subs, ok := tr.Subscriptions(key, id)
	if !ok || !subs[cds].Wildcard || len(subs[cds].Names) != 0 || subs[eds].Wildcard || !slices.Equal(subs[eds].Names, []string{"shop/a:80", "shop/b:80"}) {
		t.Errorf("after subscribing: %+v, %v", subs, ok)
	}
	tr.Subscribed(key, id, eds, names{"shop/c:80"}, false)
	tr.Subscribed(key, id, cds, nil, false)
	subs, _ = tr.Subscriptions(key, id)
	if _, has := subs[cds]; has || !slices.Equal(subs[eds].Names, []string{"shop/c:80"}) {
		t.Errorf("after resubscribing: %+v", subs)
	}
	tr.Disconnect(key, id)
	if subs, ok := tr.Subscriptions(key, id); ok || subs != nil {
		t.Errorf("a disconnected stream's subscriptions: %+v, %v", subs, ok)
	}
}

// names is a subscription's names as a test hands them over.
type names []string

func (n names) Len() int { return len(n) }

func (n names) All(fn func(string)) {
	for _, name := range n {
		fn(name)
	}
}
