// Package conformance checks scopeplane's ADS server against the xDS
// protocol, case by case, for both State of the World and delta: real gRPC
// streams over loopback between the server and the project's Envoy-like
// client (xds/adsclient), fed by the real catalog and snapshot builder.
package conformance

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/auth"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/pipeline"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// plane is a control plane without Kubernetes: changes go into the catalog
// and are versioned synchronously by sync, so a test knows when a change
// is served.
type plane struct {
	*pipeline.Pipeline
	t    *testing.T
	stop func() // stops the server gracefully, once
	conn *grpc.ClientConn
}

func newPlane(t *testing.T) *plane {
	t.Helper()
	p := &plane{t: t, Pipeline: pipeline.New(pipeline.Options{Server: server.Options{MaxNamesPerRequest: 1000, Authenticator: &auth.Authenticator{AllowAnonymous: true}}})}
	srv := p.Server
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(ctx, lis) }()
	p.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		_ = p.conn.Close()
		p.stop()
	})
	return p
}

// envoyScope selects every Service of namespace ns for Envoy proxies, with
// spec.listener.virtualHosts VHDS: Delta proxies fetch the virtual hosts by
// VHDS, SotW ones get them inline (TestEveryServiceIsRoutable covers Delta
// with them inline, the default, too).
func envoyScope(ns, name string, protocol model.Protocol) *model.Scope {
	return &model.Scope{
		Key: model.Key{Namespace: ns, Name: name}, Protocol: protocol,
		Listener:   model.Listener{Mode: model.ListenerEnvoy, Port: 10080, VHDS: true},
		Selections: []model.Selection{{Namespace: ns, Selector: labels.Everything()}},
	}
}

// proxy is a running client.
type proxy struct {
	*adsclient.Client
	t        *testing.T
	protocol adsclient.Protocol
	cancel   context.CancelFunc
	done     chan error
}

func (p *plane) connect(cfg adsclient.Config) *proxy {
	return p.run(adsclient.New(cfg), cfg.Protocol)
}

// run starts (or restarts, keeping its state) a client on a new stream.
func (p *plane) run(c *adsclient.Client, protocol adsclient.Protocol) *proxy {
	p.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	px := &proxy{Client: c, t: p.t, protocol: protocol, cancel: cancel, done: make(chan error, 1)}
	go func() { px.done <- c.Run(ctx, p.conn) }()
	p.t.Cleanup(px.stop)
	return px
}

func (px *proxy) stop() {
	px.cancel()
	for px.Running() {
		time.Sleep(time.Millisecond)
	}
}

// wait blocks until cond holds, or fails the test after 10 seconds.
func (px *proxy) wait(what string, cond func(*adsclient.Client) bool) {
	px.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := px.WaitFor(ctx, cond); err != nil {
		px.t.Fatalf("%s: %v; stream error %v; events:\n%s", what, err, px.Err(), describe(px.Events()))
	}
}

// settled waits until the proxy received nothing for a moment and returns
// its events: a test then asserts that nothing more was sent.
func (px *proxy) settled() []adsclient.Event {
	for {
		n := len(px.Events())
		time.Sleep(150 * time.Millisecond)
		if ev := px.Events(); len(ev) == n {
			return ev
		}
	}
}

func holds(typeURL string, names ...string) func(*adsclient.Client) bool {
	return func(c *adsclient.Client) bool {
		got := keys(c.State(typeURL))
		return slices.Equal(got, names)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func short(typeURL string) string {
	if t, ok := xdstype.ByURL(typeURL); ok {
		return t.String()
	}
	return typeURL
}

// describe renders events one per line: type, names, removals, ACK/NACK.
func describe(evs []adsclient.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s %v", short(e.TypeURL), e.Names)
		if len(e.Removed) > 0 {
			fmt.Fprintf(&b, " removed %v", e.Removed)
		}
		if !e.Accepted {
			fmt.Fprintf(&b, " NACK %q", e.ErrorDetail)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// summary renders events compactly, for comparing with an expected sequence.
func summary(evs []adsclient.Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		s := short(e.TypeURL) + fmt.Sprint(e.Names)
		if len(e.Removed) > 0 {
			s += "-" + fmt.Sprint(e.Removed)
		}
		out = append(out, s)
	}
	return out
}

// rejectOnce NACKs the first response of typeURL it sees.
func rejectOnce(typeURL, detail string) func(string, []*anypb.Any, []string) string {
	done := false
	return func(t string, _ []*anypb.Any, _ []string) string {
		if t == typeURL && !done {
			done = true
			return detail
		}
		return ""
	}
}
