package plugin

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
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

// replica is one control-plane replica's CSDS answer.
type replica struct {
	name string
	resp *statusv3.ClientStatusResponse
}

// query asks every replica the same question: at the addresses given with
// --address, or else through a port-forward to the admin port of every
// running control-plane pod (each replica serves only its own proxies).
func (o *options) query(ctx context.Context, req *statusv3.ClientStatusRequest) ([]replica, error) {
	if len(o.addresses) > 0 {
		var out []replica
		for _, addr := range o.addresses {
			resp, err := fetch(ctx, addr, req)
			if err != nil {
				return nil, err
			}
			out = append(out, replica{name: addr, resp: resp})
		}
		return out, nil
	}
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
	var out []replica
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
			continue
		}
		resp, err := o.fetchPod(ctx, cfg, cs, pod, req)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		out = append(out, replica{name: pod.Name, resp: resp})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no running pod in namespace %q matches %q: set --control-plane-namespace and --selector, or --address", o.namespace, o.selector)
	}
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
