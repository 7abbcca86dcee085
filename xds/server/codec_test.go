package server

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/scopeplane/scopeplane/xds/snapshot"
	"github.com/scopeplane/scopeplane/xds/xdstype"
)

// clusters returns n EDS clusters shaped like the translator's, as the
// snapshot holds them.
func clusters(tb testing.TB, n int) []*snapshot.Resource {
	tb.Helper()
	out := make([]*snapshot.Resource, n)
	for i := range out {
		name := fmt.Sprintf("default/svc-%04d:80", i)
		value, err := proto.MarshalOptions{Deterministic: true}.Marshal(&clusterv3.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
				EdsConfig:   &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}, ResourceApiVersion: corev3.ApiVersion_V3},
				ServiceName: name,
			},
			ConnectTimeout: durationpb.New(5 * time.Second),
			LbPolicy:       clusterv3.Cluster_ROUND_ROBIN,
		})
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = snapshot.NewResource(xdstype.Cluster, name, fmt.Sprintf("%016x", i), value)
	}
	return out
}

// sotwProto is the DiscoveryResponse the codec's output must decode to,
// built the way the server built it before it sent the shared bytes.
func sotwProto(version, typeURL, nonce string, res []*snapshot.Resource) *discoveryv3.DiscoveryResponse {
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, TypeUrl: typeURL, Nonce: nonce, Resources: make([]*anypb.Any, len(res))}
	for i, r := range res {
		resp.Resources[i] = r.Body()
	}
	return resp
}

// TestWireResponsesDecode checks that what the codec sends for a SotW and
// a delta response decodes to the message it stands for, byte count
// included, and that every other message is plain protobuf.
func TestWireResponsesDecode(t *testing.T) {
	c := newCodec()
	res := clusters(t, 3)
	res = append(res, snapshot.NewResource(xdstype.Cluster, "empty", "", nil))
	url := xdstype.Cluster.URL()

	w := sotwResponse("v1", url, "7", res)
	var sotw discoveryv3.DiscoveryResponse
	data, err := c.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(data, &sotw); err != nil {
		t.Fatal(err)
	}
	want := sotwProto("v1", url, "7", res)
	if !proto.Equal(&sotw, want) {
		t.Errorf("the SotW response decodes to\n%v\nwant\n%v", &sotw, want)
	}
	if data.Len() != w.size || w.size != proto.Size(want) {
		t.Errorf("the SotW response is %d bytes, its size says %d, the message is %d", data.Len(), w.size, proto.Size(want))
	}

	removed := []string{"default/gone:80", "default/also-gone:80"}
	d := deltaResponse("v2", url, "8", res, removed)
	var delta discoveryv3.DeltaDiscoveryResponse
	if data, err = c.Marshal(d); err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(data, &delta); err != nil {
		t.Fatal(err)
	}
	wantDelta := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "v2", TypeUrl: url, Nonce: "8", RemovedResources: removed}
	for _, r := range res {
		wantDelta.Resources = append(wantDelta.Resources, &discoveryv3.Resource{Name: r.Name, Version: r.Version, Resource: r.Body()})
	}
	if !proto.Equal(&delta, wantDelta) {
		t.Errorf("the delta response decodes to\n%v\nwant\n%v", &delta, wantDelta)
	}
	if data.Len() != d.size || d.size != proto.Size(wantDelta) {
		t.Errorf("the delta response is %d bytes, its size says %d, the message is %d", data.Len(), d.size, proto.Size(wantDelta))
	}

	req := &discoveryv3.DiscoveryRequest{TypeUrl: url, ResourceNames: []string{"a"}}
	if data, err = c.Marshal(req); err != nil {
		t.Fatal(err)
	}
	plain, _ := proto.Marshal(req)
	if string(data.Materialize()) != string(plain) {
		t.Errorf("a request is encoded as %x, protobuf makes %x", data.Materialize(), plain)
	}
}

// BenchmarkSendSotW encodes a SotW response of every cluster of a
// 2,000-Service scope as gRPC's Send does, per stream: "proto" marshals
// the message (what the server sent before), "shared" frames the
// snapshot's encoded resources. Its bytes per op are also what a stream
// whose proxy does not read pins in the transport.
func BenchmarkSendSotW(b *testing.B) {
	c := newCodec()
	res := clusters(b, 2000)
	url := xdstype.Cluster.URL()
	for _, bc := range []struct {
		name string
		msg  func() any
	}{
		{"proto", func() any { return sotwProto("0123456789abcdef", url, "42", res) }},
		{"shared", func() any { return sotwResponse("0123456789abcdef", url, "42", res) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			size := 0
			for b.Loop() {
				data, err := c.Marshal(bc.msg())
				if err != nil {
					b.Fatal(err)
				}
				size = data.Len()
				data.Free()
			}
			b.ReportMetric(float64(size), "response-bytes")
		})
	}
}

// BenchmarkHeldSotW is BenchmarkSendSotW for a stream whose proxy does not
// read: the encoded response is never freed (the transport holds it), so
// gRPC's buffer pool cannot recycle it and its bytes per op are what each
// such stream pins.
func BenchmarkHeldSotW(b *testing.B) {
	c := newCodec()
	res := clusters(b, 2000)
	url := xdstype.Cluster.URL()
	for _, bc := range []struct {
		name string
		msg  func() any
	}{
		{"proto", func() any { return sotwProto("0123456789abcdef", url, "42", res) }},
		{"shared", func() any { return sotwResponse("0123456789abcdef", url, "42", res) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			held := make([]any, 0, 1024)
			for b.Loop() {
				data, err := c.Marshal(bc.msg())
				if err != nil {
					b.Fatal(err)
				}
				if held = append(held, data); len(held) == cap(held) {
					held = held[:0]
				}
			}
		})
	}
}

// TestSotWRequestKeepsNamesEncoded checks the SotW request decoder against
// the protobuf codec: the same fields, the same names once decoded, the
// same digest for the same list and another for another order or list,
// and a name that is not UTF-8 refused.
func TestSotWRequestKeepsNamesEncoded(t *testing.T) {
	c := newCodec()
	decode := func(req *discoveryv3.DiscoveryRequest) *sotwRequest {
		t.Helper()
		data, err := c.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var got sotwRequest
		if err := c.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	req := &discoveryv3.DiscoveryRequest{
		VersionInfo: "v1", Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: xdstype.Endpoint.URL(),
		ResourceNames: []string{"default/a:80", "default/b:80"}, ResponseNonce: "7",
	}
	got := decode(req)
	names, err := got.resourceNames()
	if err != nil {
		t.Fatal(err)
	}
	if got.names != 2 || fmt.Sprint(names) != fmt.Sprint(req.ResourceNames) || len(got.GetResourceNames()) != 0 {
		t.Errorf("names %d %v (left in the message: %v), want %v", got.names, names, got.GetResourceNames(), req.ResourceNames)
	}
	rest := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	rest.ResourceNames = nil
	if !proto.Equal(got.DiscoveryRequest, rest) {
		t.Errorf("decoded %v, want %v", got.DiscoveryRequest, rest)
	}
	ack := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	ack.VersionInfo, ack.ResponseNonce = "v2", "8"
	if d := decode(ack); d.digest != got.digest || d.names != got.names {
		t.Error("an ACK naming the same list has another digest")
	}
	var later sotwRequest
	later.skipNode = true
	data, err := c.Marshal(ack)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(data, &later); err != nil {
		t.Fatal(err)
	}
	withoutNode := proto.Clone(ack).(*discoveryv3.DiscoveryRequest)
	withoutNode.ResourceNames, withoutNode.Node = nil, nil
	if !proto.Equal(later.DiscoveryRequest, withoutNode) || later.digest != got.digest {
		t.Errorf("a later request decoded to %v (digest %x), want %v without its node (digest %x)", later.DiscoveryRequest, later.digest, withoutNode, got.digest)
	}
	swapped := proto.Clone(req).(*discoveryv3.DiscoveryRequest)
	swapped.ResourceNames = []string{"default/b:80", "default/a:80"}
	if decode(swapped).digest == got.digest {
		t.Error("a list in another order has the same digest")
	}
	bad := decode(&discoveryv3.DiscoveryRequest{TypeUrl: xdstype.Endpoint.URL()})
	bad.raw = mem.BufferSlice{mem.SliceBuffer(protowire.AppendString(protowire.AppendTag(nil, fieldResourceNames, protowire.BytesType), "\xff"))}
	bad.names = 1
	if _, err := bad.resourceNames(); err == nil {
		t.Error("a name that is not UTF-8 was taken")
	}
}

// split is b in buffers cut at cuts, as gRPC hands over a message spanning
// HTTP/2 frames.
func split(b []byte, cuts ...int) mem.BufferSlice {
	var out mem.BufferSlice
	prev := 0
	for _, c := range cuts {
		out = append(out, mem.SliceBuffer(b[prev:c]))
		prev = c
	}
	return append(out, mem.SliceBuffer(b[prev:]))
}

// TestSotWRequestAcrossBuffers decodes a request split into buffers at
// every byte, as gRPC hands over a message spanning HTTP/2 frames: the
// fields, the names and their digest must be those of the whole encoding,
// and a truncated request must be refused, not misread.
func TestSotWRequestAcrossBuffers(t *testing.T) {
	req := &discoveryv3.DiscoveryRequest{
		VersionInfo: "v1", Node: &corev3.Node{Id: "envoy-1", Cluster: strings.Repeat("c", 300)},
		TypeUrl: xdstype.Endpoint.URL(), ResponseNonce: "7",
		ResourceNames: []string{"default/a:80", strings.Repeat("n", 200), "default/b:80"},
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var whole sotwRequest
	if err := whole.unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(b); i++ {
		for _, data := range []mem.BufferSlice{split(b, i), split(b, i/2, i), split(b, i, min(i+1, len(b)), min(i+3, len(b)))} {
			var got sotwRequest
			if err := got.unmarshal(data); err != nil {
				t.Fatalf("split at %d: %v", i, err)
			}
			names, err := got.resourceNames()
			if err != nil {
				t.Fatalf("split at %d: %v", i, err)
			}
			if got.digest != whole.digest || got.names != 3 || !slices.Equal(names, req.ResourceNames) ||
				!proto.Equal(got.DiscoveryRequest, whole.DiscoveryRequest) {
				t.Fatalf("split at %d: decoded %v names %q digest %x, want %v %q %x",
					i, got.DiscoveryRequest, names, got.digest, whole.DiscoveryRequest, req.ResourceNames, whole.digest)
			}
		}
		var cut sotwRequest
		if err := cut.unmarshal(split(b[:i], i/2)); err == nil && cut.names == 3 && proto.Equal(cut.DiscoveryRequest, whole.DiscoveryRequest) {
			t.Fatalf("a request cut at %d was read as the whole one", i)
		}
	}
}

// TestNACKDetailIsCutWhenDecoded decodes a SotW and a delta NACK whose
// error_detail is 1 MiB: the request keeps at most maxDetailBytes of it, on
// a rune boundary, no details, and (SotW) only its names, not the buffers
// that also hold the detail.
func TestNACKDetailIsCutWhenDecoded(t *testing.T) {
	c := newCodec()
	detail := strings.Repeat("é", 1<<19)
	nack := &rpcstatus.Status{Code: 3, Message: detail, Details: []*anypb.Any{{TypeUrl: "x", Value: []byte(detail)}}}
	check := func(what string, got *rpcstatus.Status) {
		t.Helper()
		if got.GetCode() != 3 || len(got.GetMessage()) > maxDetailBytes || !strings.HasPrefix(detail, got.GetMessage()) || len(got.GetMessage()) < maxDetailBytes-1 || len(got.GetDetails()) != 0 {
			t.Errorf("%s: kept code %d, a %d-byte message (valid prefix: %v), %d details", what, got.GetCode(), len(got.GetMessage()),
				strings.HasPrefix(detail, got.GetMessage()), len(got.GetDetails()))
		}
	}
	b, err := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: "t", ResponseNonce: "1", ResourceNames: []string{"a", "b"}, ErrorDetail: nack})
	if err != nil {
		t.Fatal(err)
	}
	sotw := &sotwRequest{}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, sotw); err != nil {
		t.Fatal(err)
	}
	check("SotW", sotw.ErrorDetail)
	if n := sotw.raw.Len(); n > 16 {
		t.Errorf("a SotW NACK keeps %d bytes of buffers for two names", n)
	}
	if names, err := sotw.resourceNames(); err != nil || strings.Join(names, ",") != "a,b" {
		t.Errorf("a SotW NACK's names: %v, %v", names, err)
	}
	b, err = proto.Marshal(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: "t", ResponseNonce: "1", ErrorDetail: nack})
	if err != nil {
		t.Fatal(err)
	}
	delta := &deltaRequest{}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, delta); err != nil {
		t.Fatal(err)
	}
	check("delta", delta.ErrorDetail)
	bad, _ := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: "t"})
	bad = protowire.AppendTag(bad, fieldErrorDetail, protowire.BytesType)
	bad = protowire.AppendBytes(bad, protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff"))
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, &sotwRequest{}); err == nil {
		t.Error("a SotW NACK whose message is not UTF-8 was taken")
	}
}

// TestDeltaRequestKeepsClaimsEncoded decodes a delta request whose
// initial_resource_versions are left encoded, split into buffers at every
// byte: every other field must be what the protobuf codec decodes, the
// claims' count and digest those of the pairs the protobuf codec decodes
// (snapshot.PairDigest, XORed), and claimed must decode them as the
// protobuf codec does, a repeated name's last version winning (the digest
// then counts both, and cannot equal a served set's). Claims that are not
// valid UTF-8, and a truncated request, are refused. Reading claims
// allocates nothing per claim.
func TestDeltaRequestKeepsClaimsEncoded(t *testing.T) {
	req := &discoveryv3.DeltaDiscoveryRequest{
		Node: &corev3.Node{Id: "envoy-1", Cluster: strings.Repeat("c", 300)}, TypeUrl: xdstype.Cluster.URL(), ResponseNonce: "7",
		ResourceNamesSubscribe:  []string{"*"},
		InitialResourceVersions: map[string]string{"default/a:80": "1", strings.Repeat("n", 200): "2", "default/b:80": "", "": "4"},
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var digest uint64
	for name, version := range req.InitialResourceVersions {
		digest ^= snapshot.PairDigest(name, version)
	}
	without := proto.Clone(req).(*discoveryv3.DeltaDiscoveryRequest)
	without.InitialResourceVersions = nil
	for i := 1; i < len(b); i++ {
		for _, data := range []mem.BufferSlice{split(b, i), split(b, i/2, i)} {
			var got deltaRequest
			if err := got.unmarshal(data); err != nil {
				t.Fatalf("split at %d: %v", i, err)
			}
			if got.claims != 4 || got.claimDigest != digest || !maps.Equal(got.claimed(), req.InitialResourceVersions) ||
				!proto.Equal(got.DeltaDiscoveryRequest, without) {
				t.Fatalf("split at %d: decoded %v, %d claims %v digest %x, want %v, 4 claims %v digest %x",
					i, got.DeltaDiscoveryRequest, got.claims, got.claimed(), got.claimDigest, without, req.InitialResourceVersions, digest)
			}
		}
		var cut deltaRequest
		if err := cut.unmarshal(split(b[:i], i/2)); err == nil && cut.claims == 4 && proto.Equal(cut.DeltaDiscoveryRequest, without) {
			t.Fatalf("a request cut at %d was read as the whole one", i)
		}
	}

	entry := func(fields ...string) []byte {
		var e []byte
		for i := 0; i+1 < len(fields); i += 2 {
			num := protowire.Number(1)
			if fields[i] == "value" {
				num = 2
			}
			e = protowire.AppendString(protowire.AppendTag(e, num, protowire.BytesType), fields[i+1])
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, fieldInitialVersions, protowire.BytesType), e)
	}
	decode := func(entries ...[]byte) (*deltaRequest, error) {
		var b []byte
		for _, e := range entries {
			b = append(b, e...)
		}
		var whole discoveryv3.DeltaDiscoveryRequest
		werr := proto.Unmarshal(b, &whole)
		want := whole.GetInitialResourceVersions()
		var got deltaRequest
		err := got.unmarshal(mem.BufferSlice{mem.SliceBuffer(b)})
		if (err == nil) != (werr == nil) {
			t.Errorf("entries %q: error %v, the protobuf codec's %v", b, err, werr)
		}
		if err == nil && !maps.Equal(got.claimed(), want) {
			t.Errorf("entries %q: claimed %v, the protobuf codec decodes %v", b, got.claimed(), want)
		}
		return &got, err
	}
	twice, _ := decode(entry("key", "a", "value", "1"), entry("key", "a", "value", "2"))
	if twice.claims != 2 || twice.claimDigest != snapshot.PairDigest("a", "1")^snapshot.PairDigest("a", "2") {
		t.Errorf("a name claimed twice counts %d claims, digest %x", twice.claims, twice.claimDigest)
	}
	if got, _ := decode(entry("value", "1", "key", "a", "key", "b")); got.claimDigest != snapshot.PairDigest("b", "1") {
		t.Errorf("an entry value first, key twice: digest %x, want (b, 1)'s", got.claimDigest)
	}
	for _, bad := range [][]byte{entry("key", "\xff", "value", "1"), entry("key", "a", "value", "\xff")} {
		if _, err := decode(bad); err == nil {
			t.Errorf("a claim that is not UTF-8 (%q) was taken", bad)
		}
	}

	// Reading claims allocates nothing per claim: a reconnect declaring
	// 10,000 resources costs the allocations of one declaring 10.
	allocs := func(n int) float64 {
		claims := map[string]string{}
		for i := range n {
			claims[fmt.Sprintf("default/svc-%05d:80", i)] = "0123456789abcdef"
		}
		b, err := proto.Marshal(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.Cluster.URL(), InitialResourceVersions: claims})
		if err != nil {
			t.Fatal(err)
		}
		data := split(b, len(b)/3, 2*len(b)/3)
		return testing.AllocsPerRun(10, func() {
			var r deltaRequest
			if err := r.unmarshal(data); err != nil || r.claims != n {
				t.Fatalf("%d claims read as %d: %v", n, r.claims, err)
			}
		})
	}
	if few, many := allocs(10), allocs(10000); many > few {
		t.Errorf("reading 10,000 claims allocates %.0f times, 10 claims %.0f times", many, few)
	}
}
