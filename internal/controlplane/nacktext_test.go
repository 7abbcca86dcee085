package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	xdsv1alpha1 "github.com/scopeplane/scopeplane/api/v1alpha1"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// TestHostileNACKTextReachesStatusCut: a proxy with a 300-character node id
// NACKs with a 10 KiB error_detail. Both are the proxy's to choose, and the
// CRD bounds status.recentNACKs (253 characters of node id, 1,024 of
// detail), so they must arrive cut: otherwise the API server refuses the
// status patch and the scope's status freezes. The detail is made of
// three-byte characters, so that a cut by bytes would split one (grpc-go
// refuses a request whose strings are not UTF-8 before the server sees it,
// so a cut is where broken UTF-8 would come from). The Degraded Event
// carries the message too and must fit the API server's 1,024-byte note.
func TestHostileNACKTextReachesStatusCut(t *testing.T) {
	const ns = "nack-text"
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		},
		&xdsv1alpha1.ProxyScope{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec: xdsv1alpha1.ProxyScopeSpec{
				Services: []xdsv1alpha1.ServiceSelection{{Names: []xdsv1alpha1.DNSLabel{"web"}}},
				Listener: xdsv1alpha1.ListenerSpec{Mode: xdsv1alpha1.ListenerModeEnvoy, Port: ptr.To[int32](10080)},
			},
		},
	)
	expectCondition(t, ns, "web", xdsv1alpha1.ConditionReady, metav1.ConditionTrue, xdsv1alpha1.ReasonNoProxies)

	id := strings.Repeat("ñode-", 60) // 300 characters, 360 bytes
	detail := "unknown cluster: " + strings.Repeat("€", 3500)
	if utf8.RuneCountInString(id) != 300 || len(detail) < 10*1024 {
		t.Fatalf("test input: %d characters of id, %d bytes of detail", utf8.RuneCountInString(id), len(detail))
	}
	wantNode, wantDetail := string([]rune(id)[:253]), string([]rune(detail)[:1024])
	reject := func(typeURL string, _ []*anypb.Any, _ []string) string {
		if typeURL == xdstype.Route.URL() {
			return detail
		}
		return ""
	}
	proxy(t, dialXDS(t), adsclient.SotW, testkit.Node(id, ns+"/web"), reject)

	ps := expectCondition(t, ns, "web", xdsv1alpha1.ConditionDegraded, metav1.ConditionTrue, xdsv1alpha1.ReasonProxyNACKed)
	if len(ps.Status.RecentNACKs) == 0 {
		t.Fatal("status.recentNACKs is empty")
	}
	got := ps.Status.RecentNACKs[0]
	if got.Node != wantNode {
		t.Errorf("recentNACKs[0].node is %d characters (%q...), want the first 253 of the id", utf8.RuneCountInString(got.Node), got.Node[:min(20, len(got.Node))])
	}
	if got.Detail != wantDetail {
		t.Errorf("recentNACKs[0].detail is %d characters, valid UTF-8 %v; want the first 1024 characters of the error_detail",
			utf8.RuneCountInString(got.Detail), utf8.ValidString(got.Detail))
	}
	c := meta.FindStatusCondition(ps.Status.Conditions, xdsv1alpha1.ConditionDegraded)
	if want := "proxy " + wantNode + " at " + got.Peer + " rejected " + xdstype.Route.URL(); got.Peer == "" || !strings.HasPrefix(c.Message, want) || !strings.HasSuffix(c.Message, wantDetail) {
		t.Errorf("the Degraded message does not carry the cut NACK: %.120q...", c.Message)
	}

	testkit.Eventually(t, "a ProxyNACKed Event, its note cut to 1,024 bytes", func() (bool, string) {
		var list eventsv1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range list.Items {
			if e.Regarding.Name == "web" && e.Reason == xdsv1alpha1.ReasonProxyNACKed {
				ok := len(e.Note) <= 1024 && utf8.ValidString(e.Note) && strings.HasPrefix(e.Note, "proxy "+wantNode)
				return ok, fmt.Sprintf("note of %d bytes, valid UTF-8 %v", len(e.Note), utf8.ValidString(e.Note))
			}
		}
		return false, fmt.Sprintf("%d Events in %s, none for the NACK", len(list.Items), ns)
	})
}
