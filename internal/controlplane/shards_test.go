package controlplane

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/shard"
)

// scopeList is a client.Reader of fixed ProxyScopes, as the cache lists
// them by namespace.
type scopeList []xdsv1alpha1.ProxyScope

func (scopeList) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	panic("not read")
}

func (l scopeList) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := &client.ListOptions{}
	o.ApplyOptions(opts)
	out := list.(*xdsv1alpha1.ProxyScopeList)
	for _, ps := range l {
		if ps.Namespace == o.Namespace {
			out.Items = append(out.Items, ps)
		}
	}
	return nil
}

// otherShardsAdmit admits a client by its address only for a scope of its
// own namespace, of another shard, that opts in and admits its
// ServiceAccount.
func TestOtherShardsAdmit(t *testing.T) {
	shards := shard.Shards{Index: 0, Addresses: []string{"a:1", "b:1"}}
	name := func(want int) string {
		for i := 0; ; i++ {
			k := model.Key{Namespace: "shop", Name: "s" + string(rune('a'+i))}
			if shard.Of(k, 2) == want {
				return k.Name
			}
		}
	}
	scope := func(name string, optIn bool, proxies ...xdsv1alpha1.ServiceAccountName) xdsv1alpha1.ProxyScope {
		return xdsv1alpha1.ProxyScope{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: xdsv1alpha1.ProxyScopeSpec{AdmitByPeerAddress: optIn, Proxies: proxies}}
	}
	id := &auth.Identity{Method: auth.MethodPeerAddress, Namespace: "shop", ServiceAccount: "grpc"}
	for _, tc := range []struct {
		what   string
		scopes scopeList
		want   bool
	}{
		{"another shard's scope opts in", scopeList{scope(name(1), true)}, true},
		{"another shard's scope opts in for another ServiceAccount", scopeList{scope(name(1), true, "envoy")}, false},
		{"another shard's scope does not opt in", scopeList{scope(name(1), false)}, false},
		{"only this shard's scope opts in (the server looks at it itself)", scopeList{scope(name(0), true)}, false},
	} {
		if got := otherShardsAdmit(tc.scopes, shards)(id); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.what, got, tc.want)
		}
	}
	if otherShardsAdmit(scopeList{scope(name(1), true)}, shards)(&auth.Identity{Method: auth.MethodPeerAddress, Namespace: "bank", ServiceAccount: "grpc"}) {
		t.Error("a scope of another namespace admitted the client")
	}
}
