package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/scopeplane/scopeplane/xds/model"
	"github.com/scopeplane/scopeplane/xds/server"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// fuzzMaxNames is the server's MaxNamesPerRequest in FuzzRequests, small so
// that oversized name lists are cheap to make.
const fuzzMaxNames = 32

var fuzzServer struct {
	once sync.Once
	cp   *controlPlane
	err  error
}

// fuzzControlPlane serves a small world for every input of the process: a
// SotW scope in Envoy mode and a delta scope in ProxylessGRPC mode over two
// Services, one with endpoints and a gRPC port, one ExternalName.
func fuzzControlPlane(tb testing.TB) *controlPlane {
	fuzzServer.once.Do(func() {
		w := newWorld()
		w.namespaces["fz"] = map[string]string{"env": "prod"}
		a := &model.Service{Key: model.Key{Namespace: "fz", Name: "a"}, Labels: map[string]string{"app": "a"},
			Ports: []model.ServicePort{
				{Name: "http", Port: 80, Protocol: model.ProtocolTCP, TargetPort: 8080},
				{Name: "grpc", Port: 9090, Protocol: model.ProtocolTCP, AppProtocol: "grpc", TargetPort: 9090},
			},
			Endpoints: []model.Endpoint{
				{Address: "10.0.0.1", Family: model.IPv4, Ready: true, Serving: true, Zone: "z1",
					Ports: []model.EndpointPort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9090}}},
				{Address: "10.0.0.2", Family: model.IPv4, Serving: true, Terminating: true,
					Ports: []model.EndpointPort{{Name: "http", Port: 8080}}},
			}}
		b := &model.Service{Key: model.Key{Namespace: "fz", Name: "b"}, ExternalName: "b.example.com",
			Ports: []model.ServicePort{{Name: "https", Port: 443}}}
		w.services[a.Key], w.services[b.Key] = a, b
		for _, sc := range []*model.Scope{
			{Key: model.Key{Namespace: "fz", Name: "sotw"}, Generation: 1, Protocol: model.SotW,
				Listener: model.Listener{Mode: model.ListenerEnvoy, Port: 8080}, Selections: []model.Selection{{Namespace: "fz"}}},
			{Key: model.Key{Namespace: "fz", Name: "delta"}, Generation: 1, Protocol: model.Delta,
				Listener: model.Listener{Mode: model.ListenerProxylessGRPC}, Selections: []model.Selection{{Namespace: "fz"}}},
		} {
			w.scopes[sc.Key] = sc
		}
		fuzzServer.cp, fuzzServer.err = startControlPlane(w, server.Options{MaxNamesPerRequest: fuzzMaxNames})
	})
	if fuzzServer.err != nil {
		tb.Fatal(fuzzServer.err)
	}
	return fuzzServer.cp
}

// fuzzDict holds strings that mean something to the server: resource names
// of the fuzz world in both listener modes, the wildcard, and near misses.
var fuzzDict = []string{
	"*", "fz/a:80", "fz/a:9090", "fz/b:443", "http-8080", "http-80",
	"a.fz.svc.cluster.local:9090", "a.fz:9090", "a.fz.svc.cluster.local:80", "a.fz:80",
	"fz/ghost:1", "nope", "", "0", "1",
}

var fuzzTypes = []string{
	xdstype.Cluster.URL(), xdstype.Endpoint.URL(), xdstype.Listener.URL(), xdstype.Route.URL(),
	"", "type.googleapis.com/envoy.config.cluster.v3.Unknown", "type.googleapis.com/envoy.api.v2.Cluster",
}

// fuzzReader turns fuzz bytes into request fields; it reads zeros once the
// bytes run out, so every input decodes.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// str is a dictionary word, a few raw bytes (made valid UTF-8, which proto
// strings must be), the empty string, or a long run.
func (r *fuzzReader) str() string {
	switch r.byte() % 8 {
	case 5:
		n := int(r.byte() % 16)
		raw := make([]byte, 0, n)
		for range n {
			raw = append(raw, r.byte())
		}
		return strings.ToValidUTF8(string(raw), "?")
	case 6:
		return ""
	case 7:
		return strings.Repeat("x", int(r.byte()%64)*64)
	default:
		return fuzzDict[int(r.byte())%len(fuzzDict)]
	}
}

// names is a list of names; a count byte of 240 or more makes a list longer
// than the server allows.
func (r *fuzzReader) names() []string {
	c := r.byte()
	if c >= 240 {
		out := make([]string, fuzzMaxNames+1+int(c-240)*10)
		for i := range out {
			out[i] = "n-" + strconv.Itoa(i)
		}
		return out
	}
	out := make([]string, int(c%5))
	for i := range out {
		out[i] = r.str()
	}
	return out
}

func (r *fuzzReader) typeURL() string {
	c := int(r.byte()) % (len(fuzzTypes) + 1)
	if c == len(fuzzTypes) {
		return r.str()
	}
	return fuzzTypes[c]
}

// node returns a node of one of nine kinds, and the code the server must
// refuse a first request with (OK: it must not refuse on the node; Unknown:
// any refusal, or none).
func (r *fuzzReader) node(delta bool, kind byte) (*corev3.Node, codes.Code) {
	meta := func(v *structpb.Value) *corev3.Node {
		return &corev3.Node{Id: "fuzz", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{model.ScopeMetadataKey: v}}}
	}
	own, other := "fz/sotw", "fz/delta"
	if delta {
		own, other = other, own
	}
	switch kind % 9 {
	case 0:
		return meta(structpb.NewStringValue(own)), codes.OK
	case 1:
		return meta(structpb.NewStringValue(other)), codes.FailedPrecondition
	case 2:
		return meta(structpb.NewStringValue("fz/ghost")), codes.NotFound
	case 3:
		return nil, codes.InvalidArgument
	case 4:
		return &corev3.Node{Id: "fuzz"}, codes.InvalidArgument
	case 5:
		return meta(structpb.NewNumberValue(7)), codes.InvalidArgument
	case 6:
		return meta(structpb.NewStringValue("fz/sotw/x")), codes.InvalidArgument
	case 7:
		return meta(structpb.NewStringValue(r.str())), codes.Unknown // any refusal, or none
	default:
		return meta(structpb.NewStructValue(&structpb.Struct{})), codes.InvalidArgument
	}
}

// streamLog is what the reading side saw.
type streamLog struct {
	mu        sync.Mutex
	nonces    map[string]string // type URL → last nonce
	requested map[string]bool   // type URLs requested so far
	responses int
	problems  []string
	got       chan struct{}
}

func (l *streamLog) nonce(t string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nonces[t]
}

func (l *streamLog) request(t string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requested[t] = true
}

func (l *streamLog) response(t, nonce string, anys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.responses++
	l.nonces[t] = nonce
	if !l.requested[t] {
		l.problems = append(l.problems, fmt.Sprintf("a response of type %q, which was never requested", t))
	}
	if !slices.Contains(fuzzTypes[:4], t) {
		l.problems = append(l.problems, fmt.Sprintf("a response of type %q, which scopeplane does not serve", t))
	}
	for _, a := range anys {
		if a != t {
			l.problems = append(l.problems, fmt.Sprintf("a %s response carrying a %s", t, a))
		}
	}
	select {
	case l.got <- struct{}{}:
	default:
	}
}

// FuzzRequests sends a fuzzed sequence of SotW or delta requests — any type
// URL, long and odd name lists, stale and invented nonces, error details,
// initial resource versions, missing or malformed node metadata — on a real
// stream. The server must not panic, must refuse only with
// InvalidArgument, NotFound or FailedPrecondition (exactly the one the first
// request's node calls for), and must end the stream cleanly once the proxy
// closes its side.
//
// Input format (see fuzzReader): byte 0 picks the protocol (bit 0: delta)
// and, in the rest, the kind of node the first request carries (see node).
// Then, until the input ends (at most 16 requests), each request is a type
// byte, a name count and the names (resource_names, or delta's
// resource_names_subscribe), a flags byte and the fields the flags ask for,
// in this order: bit 0 version_info (SotW); bit 1 error_detail (a code byte
// and a message); bits 2-3 the nonce: none, the last one received for the
// type, a small number (a byte), any string; bit 4 another node kind (a
// byte) on a later request; bit 5 resource_names_unsubscribe (delta); bit 6
// initial_resource_versions (delta: names, then a version for each); bit 7
// wait up to 20ms for a response before sending. A string is a selector
// byte then a dictionary index, a length and raw bytes, nothing (empty), or
// a length in 64-byte runs; a name count of 240 or more makes a list longer
// than the server allows.
func FuzzRequests(f *testing.F) {
	// The same inputs as testdata/fuzz/FuzzRequests, named there.
	for _, name := range slices.Sorted(maps.Keys(fuzzSeeds)) {
		f.Add(fuzzSeeds[name])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cp := fuzzControlPlane(t)
		if err := fuzzStream(cp, data); err != nil {
			t.Fatal(err)
		}
	})
}

// fuzzStream plays one input on a new stream and judges how it ended.
func fuzzStream(cp *controlPlane, data []byte) error {
	r := &fuzzReader{b: data}
	head := r.byte()
	delta := head&1 == 1
	firstNode, want := r.node(delta, head>>1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(cp.conn)
	log := &streamLog{nonces: map[string]string{}, requested: map[string]bool{}, got: make(chan struct{}, 1)}

	var (
		send      func(t string) error
		closeSend func() error
		recvDone  = make(chan error, 1)
	)
	if delta {
		stream, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					recvDone <- err
					return
				}
				var anys []string
				for _, res := range resp.GetResources() {
					if res.GetResource() != nil {
						anys = append(anys, res.GetResource().GetTypeUrl())
					}
				}
				log.response(resp.GetTypeUrl(), resp.GetNonce(), anys)
			}
		}()
		closeSend = stream.CloseSend
		first := true
		send = func(t string) error {
			req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: t, ResourceNamesSubscribe: r.names()}
			flags := r.byte()
			fuzzCommon(r, flags, log, t, &req.ResponseNonce, &req.ErrorDetail, nil)
			if first {
				req.Node = firstNode
			} else if flags&0x10 != 0 {
				req.Node, _ = r.node(delta, r.byte())
			}
			first = false
			if flags&0x20 != 0 {
				req.ResourceNamesUnsubscribe = r.names()
			}
			if flags&0x40 != 0 {
				req.InitialResourceVersions = map[string]string{}
				for _, n := range r.names() {
					req.InitialResourceVersions[n] = r.str()
				}
			}
			fuzzWait(flags, log)
			log.request(t)
			return stream.Send(req)
		}
	} else {
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					recvDone <- err
					return
				}
				var anys []string
				for _, a := range resp.GetResources() {
					anys = append(anys, a.GetTypeUrl())
				}
				log.response(resp.GetTypeUrl(), resp.GetNonce(), anys)
			}
		}()
		closeSend = stream.CloseSend
		first := true
		send = func(t string) error {
			req := &discoveryv3.DiscoveryRequest{TypeUrl: t, ResourceNames: r.names()}
			flags := r.byte()
			fuzzCommon(r, flags, log, t, &req.ResponseNonce, &req.ErrorDetail, &req.VersionInfo)
			if first || flags&0x10 == 0 {
				req.Node = firstNode // Envoy sends the node on every SotW request
			} else {
				req.Node, _ = r.node(delta, r.byte())
			}
			first = false
			fuzzWait(flags, log)
			log.request(t)
			return stream.Send(req)
		}
	}

	for i := 0; i < 16 && (i == 0 || len(r.b) > 0); i++ {
		if err := send(r.typeURL()); err != nil {
			break // the server ended the stream; Recv has the status
		}
	}
	_ = closeSend()
	var end error
	select {
	case end = <-recvDone:
	case <-time.After(15 * time.Second):
		return errors.New("the stream did not end 15s after the client closed its side")
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.problems) > 0 {
		return fmt.Errorf("bad responses: %s", strings.Join(log.problems, "; "))
	}
	got := codes.OK
	if !errors.Is(end, io.EOF) {
		got = endCode(end)
	}
	switch got {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
	default:
		return fmt.Errorf("want the stream to end with OK, InvalidArgument, NotFound or FailedPrecondition: %w", end)
	}
	if want != codes.OK && want != codes.Unknown {
		if got != want {
			return fmt.Errorf("the first request's node calls for %s: %w", want, end)
		}
		if log.responses > 0 {
			return fmt.Errorf("a refused stream received %d responses", log.responses)
		}
	}
	return nil
}

// fuzzCommon fills the fields both protocols share: version_info (SotW),
// error_detail and the response nonce.
func fuzzCommon(r *fuzzReader, flags byte, log *streamLog, t string, nonce *string, detail **rpcstatus.Status, version *string) {
	if flags&0x01 != 0 && version != nil {
		*version = r.str()
	}
	if flags&0x02 != 0 {
		*detail = &rpcstatus.Status{Code: int32(r.byte() % 17), Message: r.str()}
	}
	switch (flags >> 2) & 3 {
	case 1:
		*nonce = log.nonce(t)
	case 2:
		*nonce = strconv.Itoa(int(r.byte() % 10))
	case 3:
		*nonce = r.str()
	}
}

// fuzzWait gives the server a moment to answer before the next request, so
// that "the last nonce received" means something.
func fuzzWait(flags byte, log *streamLog) {
	if flags&0x80 == 0 {
		return
	}
	select {
	case <-log.got:
	case <-time.After(20 * time.Millisecond):
	}
}

// fuzzSeeds are the seed corpus, one valid or refused conversation each:
// they are also committed under testdata/fuzz/FuzzRequests.
var fuzzSeeds = map[string][]byte{
	// SotW, Envoy mode: CDS, EDS by name, LDS, RDS, each waited for and
	// ACKed with the last nonce, then a NACK of CDS.
	"sotw-envoy-sync-ack-nack": {0x00, 0, 0, 0x80, 1, 2, 0, 1, 0, 2, 0x84, 2, 0, 0x80, 3, 1, 0, 4, 0x84, 0, 0, 0x04, 0, 0, 0x06, 3, 0, 11},
	// Delta, proxyless: wildcard CDS with initial_resource_versions (one
	// current name, one unknown), LDS, RDS by name, an EDS unsubscription,
	// then an ACK.
	"delta-proxyless-reconnect": {0x01, 0, 1, 0, 0, 0x40, 2, 0, 1, 0, 11, 0, 13, 6, 2, 1, 0, 0, 0x80, 3, 1, 0, 6, 0x84, 1, 0, 0xa0, 1, 0, 2, 0, 0, 0x04},
	"sotw-wrong-protocol":       {0x02, 0, 0, 0},
	"delta-wrong-protocol":      {0x03, 0, 0, 0},
	"sotw-unknown-scope":        {0x04, 0, 0, 0},
	"sotw-no-node":              {0x06, 0, 0, 0},
	"delta-no-metadata":         {0x09, 0, 0, 0},
	"sotw-metadata-number":      {0x0a, 0, 0, 0},
	"sotw-metadata-malformed":   {0x0c, 0, 0, 0},
	"sotw-metadata-random":      {0x0e, 5, 4, 'a', '/', 'b', 'c', 0, 0, 0},
	"delta-metadata-struct":     {0x11, 0, 0, 0},
	// A valid first request, then an unknown type URL.
	"sotw-unknown-type":               {0x00, 0, 0, 0x80, 5, 0, 0},
	"sotw-too-many-names":             {0x00, 0, 0xf3, 0},
	"delta-too-many-initial-versions": {0x01, 0, 0, 0x40, 0xf0},
	// NACKs with a guessed and a garbage nonce, invalid UTF-8 in the message.
	"sotw-stale-nonces-nack": {0x00, 0, 0, 0x80, 0, 0, 0x0a, 0, 6, 1, 0, 0, 0x0e, 5, 5, 3, 0xff, 'x', 0xc3, 7, 3},
	// Delta: a node on a later request, then "*" unsubscribed.
	"delta-later-node-unsubscribe-wildcard": {0x01, 0, 1, 0, 0, 0x80, 0, 0, 0x30, 2, 1, 0, 0},
}
