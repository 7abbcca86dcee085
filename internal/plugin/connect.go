package plugin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
)

// replica is one control-plane replica's CSDS answer, or why it gave none.
type replica struct {
	name string
	resp *statusv3.ClientStatusResponse
	err  error
}

// query asks every replica the same question and returns the answers of
// those that gave one. Each replica serves only its own proxies, so one
// that does not answer (a replica restarting, a leader just killed) takes
// only its proxies out of the view: query names it on stderr, a line per
// replica, and fails only when no replica answered.
func (o *options) query(ctx context.Context, req *statusv3.ClientStatusRequest) ([]replica, error) {
	all, err := o.ask(ctx, req)
	if err != nil {
		return nil, err
	}
	var answered []replica
	for _, r := range all {
		if r.err != nil {
			o.warnf("replica %s did not answer, so its proxies are missing: %v\n", r.name, r.err)
			continue
		}
		answered = append(answered, r)
	}
	if len(answered) == 0 {
		return nil, fmt.Errorf("none of the %d replica(s) answered", len(all))
	}
	return answered, nil
}

// ask queries every replica at once: at the addresses given with
// --address, or else through a port-forward to the admin port of every
// control-plane pod. A pod that is not running yet (Pending, or Unknown) is
// a replica that cannot answer; a finished one (Succeeded, Failed: an
// evicted pod left behind) is none. The replicas come back in a stable
// order: as given, or by pod name.
func (o *options) ask(ctx context.Context, req *statusv3.ClientStatusRequest) ([]replica, error) {
	var out []replica
	var askers []func() (*statusv3.ClientStatusResponse, error)
	if len(o.addresses) > 0 {
		for _, addr := range o.addresses {
			out = append(out, replica{name: addr})
			askers = append(askers, func() (*statusv3.ClientStatusResponse, error) { return fetch(ctx, addr, req) })
		}
	} else {
		cfg, err := o.restConfig()
		if err != nil {
			return nil, err
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		pods, err := cs.CoreV1().Pods(o.namespace).List(ctx, metav1.ListOptions{LabelSelector: o.selector})
		if err != nil {
			return nil, fmt.Errorf("listing the control plane's pods in namespace %q: %w", o.namespace, err)
		}
		slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
		for i := range pods.Items {
			pod := &pods.Items[i]
			switch pod.Status.Phase {
			case corev1.PodSucceeded, corev1.PodFailed:
				continue
			case corev1.PodRunning:
				askers = append(askers, func() (*statusv3.ClientStatusResponse, error) { return o.fetchPod(ctx, cfg, cs, pod, req) })
			default:
				askers = append(askers, func() (*statusv3.ClientStatusResponse, error) {
					return nil, fmt.Errorf("pod %s/%s is %s", pod.Namespace, pod.Name, cmp.Or(string(pod.Status.Phase), "without a phase"))
				})
			}
			out = append(out, replica{name: pod.Name})
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no pod in namespace %q matches %q: set --control-plane-namespace and --selector, or --address", o.namespace, o.selector)
		}
	}
	var wg sync.WaitGroup
	for i, ask := range askers {
		wg.Go(func() { out[i].resp, out[i].err = ask() })
	}
	wg.Wait()
	return out, nil
}

// fetchPod forwards a local port to the pod's admin port, as kubectl
// port-forward does (WebSocket first, SPDY as the fallback), and queries it.
func (o *options) fetchPod(ctx context.Context, cfg *rest.Config, cs *kubernetes.Clientset, pod *corev1.Pod, req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	dialer, err := portForwardDialer(cfg, u)
	if err != nil {
		return nil, err
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", o.adminPort)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		return nil, fmt.Errorf("port-forward to the admin port %d: %w", o.adminPort, err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil {
		return nil, err
	}
	return fetch(ctx, fmt.Sprintf("127.0.0.1:%d", ports[0].Local), req)
}

func portForwardDialer(cfg *rest.Config, u *url.URL) (httpstream.Dialer, error) {
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	spdyDialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
	if err != nil {
		return nil, err
	}
	return portforward.NewFallbackDialerForStreaming(ws, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	}), nil
}

// fetch sends one CSDS request to addr.
func fetch(ctx context.Context, addr string, req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("CSDS at %s: %w", addr, err)
	}
	return resp, nil
}
