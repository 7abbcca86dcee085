package apiwatch

import (
	"context"
	"errors"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/scopeplane/scopeplane/xds/metrics"
)

// refused is what client-go returns when nothing listens on the API
// server's port.
var refused = &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/services", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}

func TestListRetriesWhileTheAPIServerIsUnreachable(t *testing.T) {
	calls := 0
	lw := Wrap("TestList", &toolscache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		calls++
		if calls < 3 {
			return nil, refused
		}
		return &corev1.ServiceList{}, nil
	}})
	before := time.Now()
	if _, err := lw.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("list: %v", err)
	}
	if calls != 3 {
		t.Errorf("%d calls, want the two refused and the one answered", calls)
	}
	if age, ok := metrics.WatchAge.Age("TestList"); !ok || age > time.Since(before) {
		t.Errorf("the age after an answered list is %v (recorded %v), want it counted from the answer", age, ok)
	}
}

func TestAnswersReachTheReflector(t *testing.T) {
	for _, err := range []error{apierrors.NewServiceUnavailable("starting"), apierrors.NewTooManyRequests("busy", 1), apierrors.NewForbidden(corev1.Resource("services"), "", nil)} {
		calls := 0
		lw := Wrap("TestAnswers", &toolscache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			calls++
			return nil, err
		}})
		if _, got := lw.ListWithContext(context.Background(), metav1.ListOptions{}); !errors.Is(got, err) || calls != 1 {
			t.Errorf("%v: returned %v after %d calls, want it returned at once", err, got, calls)
		}
	}
}

func TestRetryEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	lw := Wrap("TestCancel", &toolscache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		cancel()
		return nil, refused
	}})
	if _, err := lw.WatchWithContext(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("a watch of an unreachable API server returned no error after its context ended")
	}
}

func TestWatchEventsAreContact(t *testing.T) {
	fake := watch.NewFake()
	lw := Wrap("TestWatch", &toolscache.ListWatch{WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		return fake, nil
	}})
	w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	time.Sleep(10 * time.Millisecond) // so that the bookmark comes measurably after the opening
	opened, _ := metrics.WatchAge.Age("TestWatch")
	go fake.Action(watch.Bookmark, &corev1.Service{})
	if e := <-w.ResultChan(); e.Type != watch.Bookmark {
		t.Fatalf("got %v, want the bookmark passed on", e.Type)
	}
	if age, _ := metrics.WatchAge.Age("TestWatch"); age >= opened {
		t.Errorf("the age after a bookmark is %v, not below the %v it was when the watch opened", age, opened)
	}
}
