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
	// watchers are the streams admitted as a Pod, by its UID, and by the
	// address they were admitted from.
	watchers map[types.UID]map[*podWatcher]struct{}
	byAddr   map[string]map[*podWatcher]struct{}
}

// podWatcher is one stream's: its channel closes when the Pod of uid no
// longer holds addr, or another Pod does too.
type podWatcher struct {
	uid  types.UID
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
	x := &podIndex{reader: c, synced: inf.HasSynced, watchers: map[types.UID]map[*podWatcher]struct{}{}, byAddr: map[string]map[*podWatcher]struct{}{}}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { x.changed(obj, false) },
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

// terminal reports whether p's phase is one it never leaves, in which it
// holds no address: Succeeded or Failed.
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// changed ends the watches of streams admitted as p that it no longer
// stands for, and, when p is not in a terminal phase, those of streams
// admitted as another Pod from an address p lists: the address has two
// holders now, and names neither.
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
			x.unwatch(w)
		}
	}
	if deleted || terminal(p) {
		return
	}
	for _, addr := range podIPs(p) {
		for w := range x.byAddr[addr] {
			if w.uid != p.UID {
				w.end()
				x.unwatch(w)
			}
		}
	}
}

// unwatch forgets w; x.mu is held.
func (x *podIndex) unwatch(w *podWatcher) {
	for _, m := range []map[*podWatcher]struct{}{x.watchers[w.uid], x.byAddr[w.addr]} {
		delete(m, w)
	}
	if len(x.watchers[w.uid]) == 0 {
		delete(x.watchers, w.uid)
	}
	if len(x.byAddr[w.addr]) == 0 {
		delete(x.byAddr, w.addr)
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
			Running: p.Status.Phase == corev1.PodRunning, Terminal: terminal(p), Deleting: p.DeletionTimestamp != nil, HostNetwork: p.Spec.HostNetwork,
		})
	}
	return out, len(hosts.Items) > 0, nil
}

// Changed implements auth.PodIndex. The address is looked up again once
// the watch is in place, so that a change between the stream's admission
// and the watch is not missed.
func (x *podIndex) Changed(uid string, addr netip.Addr) (<-chan struct{}, func()) {
	w := &podWatcher{uid: types.UID(uid), addr: addr.Unmap().String(), ch: make(chan struct{})}
	x.mu.Lock()
	if x.watchers[w.uid] == nil {
		x.watchers[w.uid] = map[*podWatcher]struct{}{}
	}
	x.watchers[w.uid][w] = struct{}{}
	if x.byAddr[w.addr] == nil {
		x.byAddr[w.addr] = map[*podWatcher]struct{}{}
	}
	x.byAddr[w.addr][w] = struct{}{}
	x.mu.Unlock()
	if id, err := auth.PeerIdentity(x, addr); err != nil || id.PodUID != uid {
		w.end()
	}
	return w.ch, func() {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.unwatch(w)
	}
}
