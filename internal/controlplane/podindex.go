package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/xds/auth"
)

// Field indexes of the Pod cache: every address in status.podIPs, and in
// status.hostIPs, in netip's canonical form with IPv4-in-IPv6 unmapped.
const (
	podIPIndex  = "scopeplane.dev/podIP"
	hostIPIndex = "scopeplane.dev/hostIP"
)

// stripPod is the Pod cache's transform: it keeps only what the
// peer-address method reads (identity, phase, deletion, host network and
// addresses), so that a cluster's Pods cost the control plane a few
// hundred bytes each rather than their whole spec and status. Other
// objects (the metadata-only Pods of token bindings) get the default
// transform, trimMeta.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return trimMeta(obj)
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp, CreationTimestamp: p.CreationTimestamp},
		Spec: corev1.PodSpec{ServiceAccountName: p.Spec.ServiceAccountName, NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs,
			HostIP: p.Status.HostIP, HostIPs: p.Status.HostIPs},
	}, nil
}

// addrs parses the addresses given, unmapped; those that do not parse are
// left out (they can match no peer).
func addrs(ips ...string) []string {
	var out []string
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			if c := a.Unmap().String(); !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

func podIPs(p *corev1.Pod) []string {
	ips := []string{p.Status.PodIP}
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return addrs(ips...)
}

func hostIPs(p *corev1.Pod) []string {
	ips := []string{p.Status.HostIP}
	for _, ip := range p.Status.HostIPs {
		ips = append(ips, ip.IP)
	}
	return addrs(ips...)
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// podIndex implements auth.PodIndex from the manager's Pod informer.
type podIndex struct {
	reader client.Reader
	synced func() bool

	mu sync.Mutex
	// watchers are the streams admitted as a Pod, by its UID.
	watchers map[types.UID]map[*podWatcher]struct{}
}

// podWatcher is one stream's: its channel closes when the Pod no longer
// holds addr.
type podWatcher struct {
	addr string
	ch   chan struct{}
	once sync.Once
}

func (w *podWatcher) end() { w.once.Do(func() { close(w.ch) }) }

var _ auth.PodIndex = (*podIndex)(nil)

// newPodIndex registers the Pod informer (transformed by stripPod, see
// CacheOptions) and its address indexes with c.
func newPodIndex(ctx context.Context, c cache.Cache) (*podIndex, error) {
	for field, fn := range map[string]func(*corev1.Pod) []string{podIPIndex: podIPs, hostIPIndex: hostIPs} {
		if err := c.IndexField(ctx, &corev1.Pod{}, field, func(o client.Object) []string { return fn(o.(*corev1.Pod)) }); err != nil {
			return nil, fmt.Errorf("indexing Pods by %s: %w", field, err)
		}
	}
	inf, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("watching Pods: %w", err)
	}
	x := &podIndex{reader: c, synced: inf.HasSynced, watchers: map[types.UID]map[*podWatcher]struct{}{}}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { x.changed(obj, false) },
		DeleteFunc: func(obj any) { x.changed(obj, true) },
	}); err != nil {
		return nil, err
	}
	return x, nil
}

// holds reports whether p may still stand for a stream from addr.
func holds(p *corev1.Pod, addr string) bool {
	return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && !p.Spec.HostNetwork && slices.Contains(podIPs(p), addr)
}

func (x *podIndex) changed(obj any, deleted bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for w := range x.watchers[p.UID] {
		if deleted || !holds(p, w.addr) {
			w.end()
			delete(x.watchers[p.UID], w)
		}
	}
	if len(x.watchers[p.UID]) == 0 {
		delete(x.watchers, p.UID)
	}
}

// Holders implements auth.PodIndex. Until the informer has listed every
// Pod it refuses to answer: an address whose second holder is not listed
// yet would otherwise pass for one held once.
func (x *podIndex) Holders(addr netip.Addr) ([]auth.Pod, bool, error) {
	if !x.synced() {
		return nil, false, errors.New("the Pods are not listed yet")
	}
	key := addr.Unmap().String()
	ctx := context.Background()
	hosts := &corev1.PodList{}
	if err := x.reader.List(ctx, hosts, client.MatchingFields{hostIPIndex: key}); err != nil {
		return nil, false, err
	}
	list := &corev1.PodList{}
	if err := x.reader.List(ctx, list, client.MatchingFields{podIPIndex: key}); err != nil {
		return nil, false, err
	}
	out := make([]auth.Pod, 0, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		out = append(out, auth.Pod{
			Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), ServiceAccount: p.Spec.ServiceAccountName, NodeName: p.Spec.NodeName,
			Running: p.Status.Phase == corev1.PodRunning, Deleting: p.DeletionTimestamp != nil, HostNetwork: p.Spec.HostNetwork,
		})
	}
	return out, len(hosts.Items) > 0, nil
}

// Changed implements auth.PodIndex. The Pod is checked again once the
// watch is in place, so that a change between the stream's admission and
// the watch is not missed.
func (x *podIndex) Changed(uid string, addr netip.Addr) (<-chan struct{}, func()) {
	w := &podWatcher{addr: addr.Unmap().String(), ch: make(chan struct{})}
	id := types.UID(uid)
	x.mu.Lock()
	if x.watchers[id] == nil {
		x.watchers[id] = map[*podWatcher]struct{}{}
	}
	x.watchers[id][w] = struct{}{}
	x.mu.Unlock()
	if pods, node, err := x.Holders(addr); err != nil || node || len(pods) != 1 || pods[0].UID != uid || !pods[0].Running || pods[0].Deleting || pods[0].HostNetwork {
		w.end()
	}
	return w.ch, func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		if ws := x.watchers[id]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(x.watchers, id)
			}
		}
	}
}
