package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/scopeplane/scopeplane/internal/localapi"
	"github.com/scopeplane/scopeplane/internal/scheme"
	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/auth"
)

// TestPodIndex runs the peer-address Pod index on a manager's cache against
// a real API server: an address names its one Running Pod, as stripped by
// the cache's transform; a second holder, a Node's address or a Pod that is
// not Running names none, while a Pod in a terminal phase (Succeeded,
// Failed) holds no address at all; and a stream's watch ends when its Pod
// stops holding the address, is deleted, or another Pod not in a terminal
// phase lists the address too.
func TestPodIndex(t *testing.T) {
	env, err := localapi.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme.Scheme, Cache: CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	x, err := newPodIndex(ctx, mgr.GetCache())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c := env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	// podIn creates a Pod in ns and gives it the status a kubelet would.
	podIn := func(ns, name, sa, ip, hostIP string, phase corev1.PodPhase, hostNetwork bool) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"big": "label"}},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: "node-1", HostNetwork: hostNetwork,
				Containers: []corev1.Container{{Name: "c", Image: "client", Args: []string{"a long argument list the index does not keep"}}}},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: phase, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: hostIP, HostIPs: []corev1.HostIP{{IP: hostIP}}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod := func(name, sa, ip, hostIP string, phase corev1.PodPhase, hostNetwork bool) *corev1.Pod {
		t.Helper()
		return podIn("shop", name, sa, ip, hostIP, phase, hostNetwork)
	}
	client1 := pod("client", "grpc", "10.1.0.5", "192.168.1.1", corev1.PodRunning, false)
	pod("twin-a", "grpc", "10.1.0.6", "192.168.1.1", corev1.PodRunning, false)
	pod("twin-b", "grpc", "10.1.0.6", "192.168.1.1", corev1.PodRunning, false)
	pod("pending", "grpc", "10.1.0.7", "192.168.1.1", corev1.PodPending, false)
	pod("hostnet", "grpc", "192.168.1.2", "192.168.1.2", corev1.PodRunning, true)
	pending := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "pending"}}

	identity := func(addr string) (*auth.Identity, error) {
		return auth.PeerIdentity(x, netip.MustParseAddr(addr))
	}
	testkit.Eventually(t, "10.1.0.5 names Pod client", func() (bool, string) {
		id, err := identity("10.1.0.5")
		return err == nil && id.PodName == "client" && id.ServiceAccount == "grpc" && id.PodUID == string(client1.UID) && id.NodeName == "node-1", fmt.Sprintf("%+v %v", id, err)
	})
	if id, err := identity("::ffff:10.1.0.5"); err != nil || id.PodName != "client" {
		t.Errorf("the IPv4-mapped address: %+v %v", id, err)
	}
	for addr, why := range map[string]string{
		"10.1.0.6": "two Pods hold it", "10.1.0.7": "its Pod is Pending", "192.168.1.2": "a host-network Pod's, a Node's",
		"192.168.1.1": "a Node's", "10.9.9.9": "no Pod holds it",
	} {
		if id, err := identity(addr); err == nil || id.Namespace != "" {
			t.Errorf("%s (%s) names %+v", addr, why, id)
		}
	}
	// The cache holds the stripped Pod only.
	cached := &corev1.Pod{}
	if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(client1), cached); err != nil {
		t.Fatal(err)
	}
	if len(cached.Spec.Containers) != 0 || len(cached.Labels) != 0 || cached.Spec.ServiceAccountName != "grpc" || len(cached.Status.PodIPs) != 1 {
		t.Errorf("the cached Pod is not stripped to what the index reads: %+v", cached)
	}

	// A stream's watch: its Pod readdressed ends it, and so does a
	// deletion; a watch of a Pod that does not hold the address ends at once.
	gone, stop := x.Changed(string(client1.UID), netip.MustParseAddr("10.1.0.5"))
	defer stop()
	select {
	case <-gone:
		t.Fatal("the watch of a Running holder ended at once")
	default:
	}
	client1.Status.PodIPs, client1.Status.PodIP = []corev1.PodIP{{IP: "10.1.0.8"}}, "10.1.0.8"
	if err := c.Status().Update(ctx, client1); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, "the watch, once the Pod's address changed", gone)
	if err := c.Get(ctx, client.ObjectKeyFromObject(pending), pending); err != nil {
		t.Fatal(err)
	}
	pending.Status.Phase = corev1.PodRunning
	if err := c.Status().Update(ctx, pending); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "10.1.0.7 names Pod pending once Running", func() (bool, string) {
		id, err := identity("10.1.0.7")
		return err == nil && id.PodName == "pending", fmt.Sprintf("%+v %v", id, err)
	})
	gone, stop2 := x.Changed(string(pending.UID), netip.MustParseAddr("10.1.0.7"))
	defer stop2()
	if err := c.Delete(ctx, pending, &client.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, "the watch, once the Pod was deleted", gone)
	stale, stop3 := x.Changed(string(pending.UID), netip.MustParseAddr("10.1.0.7"))
	defer stop3()
	expectClosed(t, "a watch of a Pod that is gone", stale)

	// A Pod in a terminal phase holds no address: one that a completed
	// and a failed Job's Pods of another namespace still list names the
	// Running Pod it was given to.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "batch"}}); err != nil {
		t.Fatal(err)
	}
	podIn("batch", "job-done", "job", "10.1.0.9", "192.168.1.1", corev1.PodSucceeded, false)
	podIn("batch", "job-failed", "job", "10.1.0.9", "192.168.1.1", corev1.PodFailed, false)
	reuser := pod("reuser", "grpc", "10.1.0.9", "192.168.1.1", corev1.PodRunning, false)
	testkit.Eventually(t, "10.1.0.9 names Pod reuser, not the Jobs' Pods done with it", func() (bool, string) {
		id, err := identity("10.1.0.9")
		return err == nil && id.PodName == "reuser" && id.PodUID == string(reuser.UID), fmt.Sprintf("%+v %v", id, err)
	})
	// Its stream goes on while another terminal Pod lists the address,
	// and ends once a Pod that may hold it does: two holders name neither.
	shared, stop4 := x.Changed(string(reuser.UID), netip.MustParseAddr("10.1.0.9"))
	defer stop4()
	podIn("batch", "job-later", "job", "10.1.0.9", "192.168.1.1", corev1.PodSucceeded, false)
	testkit.Eventually(t, "the index lists the third Job's Pod", func() (bool, string) {
		pods, _, err := x.Holders(netip.MustParseAddr("10.1.0.9"))
		return err == nil && len(pods) == 4, fmt.Sprintf("%d Pods list it (%v)", len(pods), err)
	})
	select {
	case <-shared:
		t.Fatal("the watch ended when a Pod in a terminal phase listed the address")
	default:
	}
	podIn("batch", "newcomer", "job", "10.1.0.9", "192.168.1.1", corev1.PodPending, false)
	expectClosed(t, "the watch, once a second Pod holds the address", shared)
	if id, err := identity("10.1.0.9"); err == nil {
		t.Errorf("10.1.0.9, held by two Pods, names %+v", id)
	}
}

func expectClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not end", what)
	}
}
