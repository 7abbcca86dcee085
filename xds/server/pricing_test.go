package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/internal/testkit"
	"github.com/scopeplane/scopeplane/xds/feedback"
	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// pricedPair is a control plane serving one Envoy scope over SotW
// (default/sotw) and a copy of it over delta (default/delta), each with one
// proxy driven request by request, so that a test states exactly when
// either answers: what one scope says the other protocol would have sent
// is then checked against what the other scope sent.
type pricedPair struct {
	t     *testing.T
	cp    *controlPlane
	sotw  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	delta discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	// sotwBytes and deltaBytes are what each proxy received.
	sotwBytes, deltaBytes int
}

var (
	pricedSotW  = model.Key{Namespace: "default", Name: "sotw"}
	pricedDelta = model.Key{Namespace: "default", Name: "delta"}
)

func startPricedPair(t *testing.T, services ...*model.Service) *pricedPair {
	t.Helper()
	cp := startEnvoyScopes(t, map[model.Key]model.Protocol{pricedSotW: model.SotW, pricedDelta: model.Delta}, services...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(cp.conn)
	p := &pricedPair{t: t, cp: cp}
	var err error
	if p.sotw, err = client.StreamAggregatedResources(ctx); err != nil {
		t.Fatal(err)
	}
	if p.delta, err = client.DeltaAggregatedResources(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pricedPair) sendSotW(req *discoveryv3.DiscoveryRequest) {
	p.t.Helper()
	req.Node = testkit.Node("sotw-proxy", pricedSotW.String())
	if err := p.sotw.Send(req); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pricedPair) sendDelta(req *discoveryv3.DeltaDiscoveryRequest) {
	p.t.Helper()
	req.Node = testkit.Node("delta-proxy", pricedDelta.String())
	if err := p.delta.Send(req); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pricedPair) recvSotW() *discoveryv3.DiscoveryResponse {
	p.t.Helper()
	resp, err := p.sotw.Recv()
	if err != nil {
		p.t.Fatal(err)
	}
	p.sotwBytes += proto.Size(resp)
	return resp
}

func (p *pricedPair) recvDelta() *discoveryv3.DeltaDiscoveryResponse {
	p.t.Helper()
	resp, err := p.delta.Recv()
	if err != nil {
		p.t.Fatal(err)
	}
	p.deltaBytes += proto.Size(resp)
	return resp
}

// ackSotW answers resp with an ACK naming names.
func (p *pricedPair) ackSotW(resp *discoveryv3.DiscoveryResponse, names ...string) {
	p.t.Helper()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names})
}

func (p *pricedPair) ackDelta(resp *discoveryv3.DeltaDiscoveryResponse) {
	p.t.Helper()
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
}

// totals waits until each scope counted pushes responses (the feedback is
// told after the send returns, so a response may arrive first) and returns
// both scopes' totals.
func (p *pricedPair) totals(sotwPushes, deltaPushes int64) (s, d feedback.Cost) {
	p.t.Helper()
	testkit.Eventually(p.t, "both scopes counted their pushes", func() (bool, string) {
		s, d = p.cp.Feedback.Get(pricedSotW).Total, p.cp.Feedback.Get(pricedDelta).Total
		return s.Pushes >= sotwPushes && d.Pushes >= deltaPushes, fmt.Sprintf("pushes counted: SotW %d of %d, delta %d of %d", s.Pushes, sotwPushes, d.Pushes, deltaPushes)
	})
	return s, d
}

// sync subscribes both proxies to every cluster and to the assignments
// names, and ACKs what they are sent. It returns the SotW proxy's
// assignment response.
func (p *pricedPair) sync(names ...string) *discoveryv3.DiscoveryResponse {
	p.t.Helper()
	cds, eds := xdstype.Cluster.URL(), xdstype.Endpoint.URL()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: cds})
	p.ackSotW(p.recvSotW())
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: names})
	assignments := p.recvSotW()
	p.ackSotW(assignments, names...)
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	p.ackDelta(p.recvDelta())
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names})
	p.ackDelta(p.recvDelta())
	p.totals(2, 2)
	return assignments
}

// same checks that, since before, each scope priced the other protocol at
// what the other scope sent.
func (p *pricedPair) same(what string, before [2]feedback.Cost, pushes [2]int64) {
	p.t.Helper()
	s, d := p.totals(before[0].Pushes+pushes[0], before[1].Pushes+pushes[1])
	sSent, sOther := s.Bytes-before[0].Bytes, s.OtherBytes-before[0].OtherBytes
	dSent, dOther := d.Bytes-before[1].Bytes, d.OtherBytes-before[1].OtherBytes
	if sOther != dSent || dOther != sSent {
		p.t.Errorf("%s: the SotW scope sent %d and priced delta at %d; the delta scope sent %d and priced SotW at %d",
			what, sSent, sOther, dSent, dOther)
	}
}

// pricedAsSotW checks that, since before, the delta scope priced SotW at
// what the SotW scope sent.
func (p *pricedPair) pricedAsSotW(what string, before [2]feedback.Cost, pushes [2]int64) {
	p.t.Helper()
	s, d := p.totals(before[0].Pushes+pushes[0], before[1].Pushes+pushes[1])
	if sSent, dOther := s.Bytes-before[0].Bytes, d.OtherBytes-before[1].OtherBytes; dOther != sSent {
		p.t.Errorf("%s: the SotW scope sent %d; the delta scope priced SotW at %d", what, sSent, dOther)
	}
}

func (p *pricedPair) mark() [2]feedback.Cost {
	return [2]feedback.Cost{p.cp.Feedback.Get(pricedSotW).Total, p.cp.Feedback.Get(pricedDelta).Total}
}

// TestPricedSotWCarriesThePipelinedVersion checks that a delta scope prices
// a SotW assignment response sent while the one before it is unanswered at
// the version SotW sends then, which is marked as pipelined. The proxy names
// an assignment the scope does not serve, and before it reads the (empty)
// response names one more: a SotW proxy that has read no response of the
// type sends no nonce, and is sent what it subscribes to.
func TestPricedSotWCarriesThePipelinedVersion(t *testing.T) {
	p := startPricedPair(t, testkit.Service("default", "a", "10.0.0.1"))
	cds, eds := xdstype.Cluster.URL(), xdstype.Endpoint.URL()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: cds})
	p.ackSotW(p.recvSotW())
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	p.ackDelta(p.recvDelta())
	p.totals(1, 1)

	before := p.mark()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"default/none:80"}})
	p.recvSotW()
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"default/none:80"}})
	p.recvDelta()
	p.pricedAsSotW("the first assignment request", before, [2]int64{1, 1})

	before = p.mark()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: []string{"default/none:80", "default/a:80"}})
	if second := p.recvSotW(); !strings.HasSuffix(second.GetVersionInfo(), "-pipelined") || len(second.GetResources()) != 1 {
		t.Fatalf("the second SotW response, sent while the first was unanswered: version %q, %d resources", second.GetVersionInfo(), len(second.GetResources()))
	}
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"default/a:80"}})
	if second := p.recvDelta(); len(second.GetResources()) != 1 {
		t.Fatalf("the second delta response: %v", second)
	}
	p.pricedAsSotW("the assignment subscribed while the first was unanswered", before, [2]int64{1, 1})
}

// TestPricedSotWEmptyByNameVersion checks that a delta scope prices the
// SotW assignment response that follows the last Service's removal at the
// version SotW sends: a by-name subscription's version, a digest of the
// type's version and the names, even when the type is empty.
func TestPricedSotWEmptyByNameVersion(t *testing.T) {
	p := startPricedPair(t, testkit.Service("default", "a", "10.0.0.1"))
	assignments := p.sync("default/a:80")

	before := p.mark()
	p.cp.Catalog.DeleteService(model.Key{Namespace: "default", Name: "a"})
	p.cp.Sync()
	// SotW: the clusters go by omission; the proxy then stops naming the
	// assignment and is sent an empty response moving its version.
	clusters := p.recvSotW()
	if clusters.GetTypeUrl() != xdstype.Cluster.URL() || len(clusters.GetResources()) != 0 {
		t.Fatalf("SotW after the removal: %v", clusters)
	}
	p.ackSotW(clusters)
	p.ackSotW(assignments)
	moved := p.recvSotW()
	if moved.GetTypeUrl() != xdstype.Endpoint.URL() || len(moved.GetResources()) != 0 || len(moved.GetVersionInfo()) != 16 {
		t.Fatalf("SotW after the unsubscription: %v", moved)
	}
	p.ackSotW(moved)
	// Delta: the cluster and the assignment are removed.
	for range 2 {
		p.ackDelta(p.recvDelta())
	}
	p.same("the last Service removed", before, [2]int64{2, 2})
}

// TestPricedDeltaAnnouncesMissingNames checks that a SotW scope prices the
// delta response to a proxy subscribing by name to an assignment the scope
// does not serve with its announcement: delta sends the name as removed,
// so that the proxy does not wait for it, where SotW sends nothing of it.
func TestPricedDeltaAnnouncesMissingNames(t *testing.T) {
	p := startPricedPair(t, testkit.Service("default", "a", "10.0.0.1"))
	cds, eds := xdstype.Cluster.URL(), xdstype.Endpoint.URL()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: cds})
	p.ackSotW(p.recvSotW())
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: cds})
	p.ackDelta(p.recvDelta())
	p.totals(1, 1)

	names := []string{"default/a:80", "default/none:80"}
	before := p.mark()
	p.sendSotW(&discoveryv3.DiscoveryRequest{TypeUrl: eds, ResourceNames: names})
	first := p.recvSotW()
	p.ackSotW(first, names...)
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: names})
	if resp := p.recvDelta(); len(resp.GetRemovedResources()) != 1 {
		t.Fatalf("delta did not announce the missing assignment: %v", resp)
	} else {
		p.ackDelta(resp)
	}
	p.same("a subscription naming a missing assignment", before, [2]int64{1, 1})

	// One more missing name, on a stream that has the first.
	names = append(names, "default/gone:80")
	before = p.mark()
	p.ackSotW(first, names...)
	p.recvSotW()
	p.sendDelta(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{"default/gone:80"}})
	p.recvDelta()
	p.same("another missing assignment subscribed", before, [2]int64{1, 1})
}
