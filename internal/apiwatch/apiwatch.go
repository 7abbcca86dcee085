// Package apiwatch makes the informers' lists and watches ride out an API
// server outage and says how fresh their data is.
//
// client-go's reflector backs off between failed lists and watches up to
// 30 s, with as much jitter again: after a minute's outage it may wait close
// to a minute more before it looks again, and status writes wait for it.
// Here a list or watch that cannot reach the API server (refused or broken
// connections) is retried within the call, every RetryCap at most, so the
// informers resume within seconds of the API server's return. Answers from
// the API server (429 and 503 included, which are how it sheds load) still
// reach the reflector, whose backoff applies to them.
package apiwatch

import (
	"context"
	"errors"
	"math"
	"net"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// RetryCap is the longest wait between two attempts to reach an
// unreachable API server, and so about the longest an informer stays
// behind after the API server is back.
const RetryCap = 4 * time.Second

// NewInformer is a cache.Options.NewInformer for the kinds scheme knows: a
// shared informer whose lists and watches go through Wrap.
func NewInformer(scheme *runtime.Scheme) func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if gvks, _, err := scheme.ObjectKinds(obj); err == nil && len(gvks) > 0 {
			kind = gvks[0].Kind
		}
		return toolscache.NewSharedIndexInformer(Wrap(kind, lw), obj, resync, idx)
	}
}

// Wrap returns lw with lists and watches retried while the API server is
// unreachable, and every answer of the API server (a list, an opened
// watch, each watch event, bookmarks included) recorded in
// metrics.WatchAge under kind.
func Wrap(kind string, lw toolscache.ListerWatcher) *toolscache.ListWatch {
	inner := toolscache.ToListerWatcherWithContext(lw)
	log := ctrl.Log.WithName("apiwatch").WithValues("kind", kind)
	metrics.WatchAge.Touch(kind) // the age counts from the informer's start until its first list
	return &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return retry(ctx, log, kind, func() (runtime.Object, error) { return inner.ListWithContext(ctx, opts) })
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := retry(ctx, log, kind, func() (watch.Interface, error) { return inner.WatchWithContext(ctx, opts) })
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				metrics.WatchAge.Touch(kind)
				return e, true
			}), nil
		},
	}
}

// retry calls f until it returns anything but an unreachable API server,
// or ctx ends, and records a success as contact.
func retry[T any](ctx context.Context, log logr.Logger, kind string, f func() (T, error)) (T, error) {
	b := wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.25, Steps: math.MaxInt32, Cap: RetryCap}
	var since time.Time
	for {
		v, err := f()
		if err == nil {
			metrics.WatchAge.Touch(kind)
			if !since.IsZero() {
				log.Info("reached the API server again", "after", time.Since(since).Round(time.Millisecond).String())
			}
			return v, nil
		}
		if !Unreachable(err) || ctx.Err() != nil {
			return v, err
		}
		if since.IsZero() {
			since = time.Now()
			log.Info("the API server is unreachable; retrying until it answers", "every", "up to "+RetryCap.String(), "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(b.Step()):
		}
	}
}

// Unreachable reports whether err says the API server could not be reached
// or the connection to it broke (a dial, read or write failed), rather than
// that it answered or that the client is misconfigured (a TLS error).
func Unreachable(err error) bool {
	var opErr *net.OpError
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) || errors.As(err, &opErr)
}
