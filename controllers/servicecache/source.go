package servicecache

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Source is a controller's watch of every cache's objects of obj's kind
// (a Service or an EndpointSlice), those of namespaces that join later
// included; a namespace that leaves delivers a deletion of each of its
// Services. It ends with the controller's context.
func (c *Caches) Source(obj client.Object, h handler.EventHandler) source.Source {
	return &watch{caches: c, obj: obj, handler: h}
}

type watch struct {
	caches  *Caches
	obj     client.Object
	handler handler.EventHandler
}

// subscription is one started watch: its handler, bound to its queue.
type subscription struct {
	obj     client.Object
	handler toolscache.ResourceEventHandler
}

func (w *watch) String() string {
	return fmt.Sprintf("servicecache: %T", w.obj)
}

// Start subscribes the queue to every cache, and unsubscribes it when ctx
// ends.
func (w *watch) Start(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	s := &subscription{obj: w.obj, handler: toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if obj, ok := o.(client.Object); ok {
				w.handler.Create(ctx, event.CreateEvent{Object: obj}, q)
			}
		},
		UpdateFunc: func(o, n any) {
			oldObj, ok1 := o.(client.Object)
			newObj, ok2 := n.(client.Object)
			if ok1 && ok2 {
				w.handler.Update(ctx, event.UpdateEvent{ObjectOld: oldObj, ObjectNew: newObj}, q)
			}
		},
		DeleteFunc: func(o any) {
			unknown := false
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o, unknown = t.Obj, true
			}
			if obj, ok := o.(client.Object); ok {
				w.handler.Delete(ctx, event.DeleteEvent{Object: obj, DeleteStateUnknown: unknown}, q)
			}
		},
	}}
	c := w.caches
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.byNS {
		if err := n.subscribe(ctx, s); err != nil {
			return err
		}
	}
	c.subs[s] = struct{}{}
	go func() {
		<-ctx.Done()
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.subs, s)
		for _, n := range c.byNS {
			n.unsubscribe(s)
		}
	}()
	return nil
}

// subscribe adds the subscription's handler to the cache's informer of
// its kind.
func (n *nsCache) subscribe(ctx context.Context, s *subscription) error {
	inf, err := n.cache.GetInformer(ctx, s.obj, cache.BlockUntilSynced(false))
	if err != nil {
		return err
	}
	reg, err := inf.AddEventHandler(s.handler)
	if err != nil {
		return err
	}
	n.regs[s] = append(n.regs[s], reg)
	return nil
}

// unsubscribe removes the subscription's handlers from the cache.
func (n *nsCache) unsubscribe(s *subscription) {
	for _, reg := range n.regs[s] {
		if inf, err := n.cache.GetInformer(context.Background(), s.obj, cache.BlockUntilSynced(false)); err == nil {
			_ = inf.RemoveEventHandler(reg)
		}
	}
	delete(n.regs, s)
}
