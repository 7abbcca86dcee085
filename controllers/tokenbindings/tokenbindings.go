// Package tokenbindings tells whether the ServiceAccount and the Pod a
// proxy's token was issued for still exist, so that a token verified
// locally is refused once they are deleted (or re-created, with another
// UID), as the API server's TokenReview would, and a stream authenticated
// with it ends then.
//
// It watches ServiceAccounts' and Pods' metadata only: a Pod object carries
// its spec and status, kilobytes each, of which the UID is all that is
// needed here.
package tokenbindings

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/scopeplane/scopeplane/xds/auth"
)

// +kubebuilder:rbac:groups="",resources=pods;serviceaccounts,verbs=get;list;watch

// Bindings implements auth.Bindings from metadata-only informers.
type Bindings struct {
	reader client.Reader
	synced func() bool

	mu sync.Mutex
	// watchers are the streams to tell, by the UID of an object their
	// token is bound to.
	watchers map[types.UID]map[*watcher]struct{}
}

// watcher is one stream's channel; it may be watched under two UIDs (the
// ServiceAccount's and the Pod's) and is closed once.
type watcher struct {
	ch   chan struct{}
	once sync.Once
}

var _ auth.Bindings = (*Bindings)(nil)

func meta(kind string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	return m
}

// New registers metadata-only informers of ServiceAccounts and Pods with c
// and returns what checks tokens' bindings against them.
func New(ctx context.Context, c cache.Cache) (*Bindings, error) {
	b := &Bindings{reader: c, watchers: map[types.UID]map[*watcher]struct{}{}}
	var synced []func() bool
	for _, kind := range []string{"ServiceAccount", "Pod"} {
		inf, err := c.GetInformer(ctx, meta(kind))
		if err != nil {
			return nil, fmt.Errorf("watching %ss' metadata: %w", kind, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: b.deleted}); err != nil {
			return nil, err
		}
		synced = append(synced, inf.HasSynced)
	}
	b.synced = func() bool { return synced[0]() && synced[1]() }
	return b, nil
}

func (b *Bindings) deleted(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for w := range b.watchers[o.GetUID()] {
		w.once.Do(func() { close(w.ch) })
	}
	delete(b.watchers, o.GetUID())
}

// Check implements auth.Bindings. Until the informers have listed every
// ServiceAccount and Pod nothing is refused: a replica that just started
// cannot tell a missing object from one not listed yet.
func (b *Bindings) Check(id *auth.Identity) error {
	if !b.synced() {
		return nil
	}
	if id.ServiceAccountUID != "" {
		sa := meta("ServiceAccount")
		err := b.reader.Get(context.Background(), client.ObjectKey{Namespace: id.Namespace, Name: id.ServiceAccount}, sa)
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("its ServiceAccount %s/%s no longer exists", id.Namespace, id.ServiceAccount)
		case err != nil:
			return fmt.Errorf("its ServiceAccount %s/%s cannot be looked up: %w", id.Namespace, id.ServiceAccount, err)
		case string(sa.UID) != id.ServiceAccountUID:
			return fmt.Errorf("its ServiceAccount %s/%s was deleted and created again: request a new token", id.Namespace, id.ServiceAccount)
		}
	}
	if id.PodUID != "" {
		pod := meta("Pod")
		err := b.reader.Get(context.Background(), client.ObjectKey{Namespace: id.Namespace, Name: id.PodName}, pod)
		switch {
		case apierrors.IsNotFound(err) || err == nil && string(pod.UID) != id.PodUID:
			return fmt.Errorf("the Pod %s/%s it is bound to no longer exists", id.Namespace, id.PodName)
		case err != nil:
			return fmt.Errorf("the Pod %s/%s it is bound to cannot be looked up: %w", id.Namespace, id.PodName, err)
		}
	}
	return nil
}

// Gone implements auth.Bindings.
func (b *Bindings) Gone(id *auth.Identity) (<-chan struct{}, func()) {
	uids := []types.UID{types.UID(id.ServiceAccountUID), types.UID(id.PodUID)}
	w := &watcher{ch: make(chan struct{})}
	b.mu.Lock()
	for _, uid := range uids {
		if uid == "" {
			continue
		}
		if b.watchers[uid] == nil {
			b.watchers[uid] = map[*watcher]struct{}{}
		}
		b.watchers[uid][w] = struct{}{}
	}
	b.mu.Unlock()
	return w.ch, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, uid := range uids {
			if ws := b.watchers[uid]; ws != nil {
				delete(ws, w)
				if len(ws) == 0 {
					delete(b.watchers, uid)
				}
			}
		}
	}
}
