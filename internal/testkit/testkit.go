// Package testkit holds what the project's tests share: one polling helper
// with one timeout, builders for model objects and xDS nodes, and the
// test client's usual configuration. It is imported by tests only.
package testkit

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/scopeplane/scopeplane/xds/adsclient"
	"github.com/scopeplane/scopeplane/xds/model"
)

// Timeout bounds every Eventually: long enough for an API server round
// trip on a loaded 2-core machine, short enough to fail a hung test.
const Timeout = 30 * time.Second

// Eventually polls cond until it holds, or fails the test after Timeout
// with what was awaited and cond's last description of the state.
func Eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	EventuallyWithin(t, Timeout, what, cond)
}

// EventuallyWithin is Eventually with a timeout of d, for a condition
// known to take longer than Timeout to come about (one that waits for a
// documented expiry, say).
func EventuallyWithin(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if ok, state := Poll(d, cond); !ok {
		t.Fatalf("%s: not reached within %v; last state: %s", what, d, state)
	}
}

// Poll polls cond until it holds or d has passed, and returns whether it
// held and cond's last description of the state: Eventually for a test
// that must go on after a failure (to shrink a failing step list, say).
func Poll(d time.Duration, cond func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok || time.Now().After(deadline) {
			return ok, state
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Node is an xDS node with id that names scope ("<namespace>/<name>", or
// "" for none) in its metadata, as a bootstrap does.
func Node(id, scope string) *corev3.Node {
	n := &corev3.Node{Id: id}
	if scope != "" {
		n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{model.ScopeMetadataKey: structpb.NewStringValue(scope)}}
	}
	return n
}

// Service is a Service in ns with one HTTP port 80 (target 8080) and a
// ready endpoint per address.
func Service(ns, name string, addrs ...string) *model.Service {
	svc := &model.Service{
		Key:   model.Key{Namespace: ns, Name: name},
		Ports: []model.ServicePort{{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPort: 8080}},
	}
	for _, a := range addrs {
		svc.Endpoints = append(svc.Endpoints, model.Endpoint{
			Address: a, Family: model.IPv4, Ready: true, Serving: true,
			Ports: []model.EndpointPort{{Name: "http", Port: 8080, Protocol: model.ProtocolTCP}},
		})
	}
	return svc
}

// WildcardClient is a test-client configuration that subscribes to every
// type the protocol carries as a wildcard, as Envoy does (VHDS in delta
// only), records events and validates what it receives.
func WildcardClient(p adsclient.Protocol, n *corev3.Node) adsclient.Config {
	cfg := adsclient.WildcardConfig(p, n)
	cfg.RecordEvents = true
	return cfg
}
