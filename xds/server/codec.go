package server

import (
	"fmt"
	"hash/maphash"
	"unicode/utf8"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/snapshot"
)

// codec is gRPC's protobuf codec, except for the responses the ADS
// handlers send (wireResponse): those are encoded as a small buffer of the
// stream's own fields followed by the snapshot's shared encoded resources
// (Resource.Wire), referenced rather than copied. gRPC's transport keeps
// the buffers it is given until the bytes are written out, for as long as
// HTTP/2 flow control holds them, and only reads them (it frees them
// through the buffers' reference counts, which mem.SliceBuffer does not
// have). So a response waiting for a proxy that does not read pins
// references to bytes every stream of the scope shares, not its own copy,
// and no stream pays to marshal what the builder marshalled once.
// SotW requests (sotwRequest) are decoded with their names left encoded.
// Everything else goes through the protobuf codec.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{proto: encoding.GetCodecV2("proto")} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireResponse); ok {
		return w.buffers(), nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*sotwRequest); ok {
		return r.unmarshal(data)
	}
	return c.proto.Unmarshal(data, v)
}

// Name is the content subtype the codec serves: the one xDS clients use.
func (codec) Name() string { return "proto" }

// wireResponse is a DiscoveryResponse or a DeltaDiscoveryResponse in the
// form the codec sends: head holds the fields that are the stream's own
// (version, type, nonce, removals), encoded; each resource follows, in
// delta after its frame (a Resource's tag, length, name and version) from
// frames.
type wireResponse struct {
	head   []byte
	frames []byte
	// ends are where each resource's frame ends in frames (delta only).
	ends []int
	res  []*snapshot.Resource
	size int
}

// Field numbers of DiscoveryResponse and DeltaDiscoveryResponse (the ones
// they share carry the same numbers) and of a delta Resource.
const (
	fieldVersion   = 1 // version_info; system_version_info
	fieldResources = 2
	fieldTypeURL   = 4
	fieldNonce     = 5
	fieldRemoved   = 6 // delta only

	fieldResourceVersion = 1
	fieldResourceName    = 3
)

func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// sotwResponse is the DiscoveryResponse of version, typeURL and nonce
// carrying res.
func sotwResponse(version, typeURL, nonce string, res []*snapshot.Resource) *wireResponse {
	w := &wireResponse{res: res}
	w.head = appendString(nil, fieldVersion, version)
	w.head = appendString(w.head, fieldTypeURL, typeURL)
	w.head = appendString(w.head, fieldNonce, nonce)
	w.size = len(w.head)
	for _, r := range res {
		w.size += r.Wire.Len()
	}
	return w
}

// deltaResponse is the DeltaDiscoveryResponse of version, typeURL and
// nonce carrying res and the removals.
func deltaResponse(version, typeURL, nonce string, res []*snapshot.Resource, removed []string) *wireResponse {
	w := &wireResponse{res: res, ends: make([]int, len(res))}
	w.head = appendString(nil, fieldVersion, version)
	w.head = appendString(w.head, fieldTypeURL, typeURL)
	w.head = appendString(w.head, fieldNonce, nonce)
	for _, name := range removed {
		w.head = protowire.AppendTag(w.head, fieldRemoved, protowire.BytesType)
		w.head = protowire.AppendString(w.head, name)
	}
	for i, r := range res {
		inner := r.Wire.Len()
		if r.Version != "" {
			inner += protowire.SizeTag(fieldResourceVersion) + protowire.SizeBytes(len(r.Version))
		}
		if r.Name != "" {
			inner += protowire.SizeTag(fieldResourceName) + protowire.SizeBytes(len(r.Name))
		}
		w.frames = protowire.AppendTag(w.frames, fieldResources, protowire.BytesType)
		w.frames = protowire.AppendVarint(w.frames, uint64(inner))
		w.frames = appendString(w.frames, fieldResourceVersion, r.Version)
		w.frames = appendString(w.frames, fieldResourceName, r.Name)
		w.ends[i] = len(w.frames)
		w.size += r.Wire.Len()
	}
	w.size += len(w.head) + len(w.frames)
	return w
}

// buffers is the response as gRPC sends it: the stream's own bytes and
// references to the shared ones, none of them recycled.
func (w *wireResponse) buffers() mem.BufferSlice {
	n := 1 + len(w.res)
	if w.ends != nil {
		n += len(w.res)
	}
	out := make(mem.BufferSlice, 0, n)
	out = append(out, mem.SliceBuffer(w.head))
	start := 0
	for i, r := range w.res {
		if w.ends != nil {
			out = append(out, mem.SliceBuffer(w.frames[start:w.ends[i]]))
			start = w.ends[i]
		}
		out = append(out, r.Wire)
	}
	return out
}

// sotwRequest is a DiscoveryRequest as the SotW handler receives it: every
// field decoded but resource_names, which are kept encoded (with a digest
// of their encoding) until the handler needs them. Envoy repeats its whole
// subscription in every ACK, a thousand assignment names in a scope of a
// thousand Services; decoding them is a string allocated and checked per
// name, most of a SotW endpoint event, though an ACK names what the
// previous request named. Comparing digests costs one pass over the bytes.
type sotwRequest struct {
	*discoveryv3.DiscoveryRequest
	// raw is the whole encoded request; names counts its resource_names
	// and digest is the digest of their encoding, in order.
	raw    []byte
	names  int
	digest uint64
}

// namesSeed keys the digests of encoded name lists: per process, so that
// no client can choose lists that collide.
var namesSeed = maphash.MakeSeed()

// unmarshal decodes data into r: resource_names are digested and skipped,
// the rest goes through the protobuf codec's rules.
func (r *sotwRequest) unmarshal(data mem.BufferSlice) error {
	r.raw = data.Materialize()
	var (
		rest []byte
		h    maphash.Hash
	)
	h.SetSeed(namesSeed)
	r.names = 0
	for b := r.raw; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		if field := b[:n+m]; num == fieldResourceNames && typ == protowire.BytesType {
			_, _ = h.Write(field)
			r.names++
		} else {
			rest = append(rest, field...)
		}
		b = b[n+m:]
	}
	r.digest = h.Sum64()
	r.DiscoveryRequest = &discoveryv3.DiscoveryRequest{}
	return proto.Unmarshal(rest, r.DiscoveryRequest)
}

// resourceNames decodes the request's resource_names, refusing one that is
// not valid UTF-8 as the protobuf codec would.
func (r *sotwRequest) resourceNames() ([]string, error) {
	if r.names == 0 {
		return nil, nil
	}
	out := make([]string, 0, r.names)
	for b := r.raw; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if num == fieldResourceNames && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			if !utf8.Valid(v) {
				return nil, fmt.Errorf("resource_names[%d] is not valid UTF-8", len(out))
			}
			out = append(out, string(v))
		}
		b = b[m:]
	}
	return out, nil
}

// fieldResourceNames is DiscoveryRequest's resource_names.
const fieldResourceNames = 3
