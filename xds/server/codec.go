package server

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"unicode/utf8"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/scopeplane/scopeplane/xds/clip"
	"github.com/scopeplane/scopeplane/xds/feedback"
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
// SotW requests (sotwRequest) are decoded with their names left encoded,
// delta requests (deltaRequest) with their claims left encoded.
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
		if err := r.unmarshal(data); err != nil {
			return err
		}
		cutDetail(r.ErrorDetail)
		return nil
	}
	if r, ok := v.(*deltaRequest); ok {
		if err := r.unmarshal(data); err != nil {
			return err
		}
		cutDetail(r.ErrorDetail)
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// maxDetailBytes bounds a NACK's error_detail message as the server keeps
// it: what feedback reports of it (feedback.MaxDetailChars characters) at
// four bytes a character at most.
const maxDetailBytes = 4 * feedback.MaxDetailChars

// cutDetail cuts a NACK's error_detail to what is ever reported of it, and
// drops its details (never read), as soon as the request is decoded: a
// proxy's text up to the request size limit would otherwise stay on the
// heap as long as the request waits to be handled, once per stream.
func cutDetail(st *rpcstatus.Status) {
	if st == nil {
		return
	}
	st.Message = clip.String(st.Message, maxDetailBytes)
	st.Details = nil
}

// Name is the content subtype the codec serves: the one xDS clients use.
func (codec) Name() string { return "proto" }

// wireResponse is a DiscoveryResponse or a DeltaDiscoveryResponse in the
// form the codec sends: head holds the fields that are the stream's own
// (version, type, nonce, removals), encoded; each resource follows as the
// snapshot encoded it, Resource.Wire in SotW and Resource.Delta in delta.
type wireResponse struct {
	head  []byte
	res   []*snapshot.Resource
	delta bool
	size  int
}

// Field numbers of DiscoveryResponse and DeltaDiscoveryResponse (the ones
// they share carry the same numbers); their resources come encoded from
// the snapshot.
const (
	fieldVersion = 1 // version_info; system_version_info
	fieldTypeURL = 4
	fieldNonce   = 5
	fieldRemoved = 6 // delta only
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
	w := &wireResponse{res: res, delta: true}
	w.head = appendString(nil, fieldVersion, version)
	w.head = appendString(w.head, fieldTypeURL, typeURL)
	w.head = appendString(w.head, fieldNonce, nonce)
	for _, name := range removed {
		w.head = protowire.AppendTag(w.head, fieldRemoved, protowire.BytesType)
		w.head = protowire.AppendString(w.head, name)
	}
	w.size = len(w.head)
	for _, r := range res {
		w.size += r.Delta.Len()
	}
	return w
}

// buffers is the response as gRPC sends it: the stream's own bytes and
// references to the shared ones, none of them recycled.
func (w *wireResponse) buffers() mem.BufferSlice {
	out := make(mem.BufferSlice, 0, 1+len(w.res))
	out = append(out, mem.SliceBuffer(w.head))
	for _, r := range w.res {
		if w.delta {
			out = append(out, r.Delta)
		} else {
			out = append(out, r.Wire)
		}
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
	// raw is the request as gRPC received it, held (by reference, not
	// copied: joining its buffers was most of what an ACK cost once its
	// names were left encoded) while it names resources, until free;
	// names counts its resource_names and digest is the digest of their
	// encoding, in order.
	raw    mem.BufferSlice
	names  int
	digest uint64
	// skipNode leaves the node undecoded: only a stream's first request's
	// is read, and Envoy sends it on every one (set_node_on_first_message_only
	// is off by default), its extension list making it most of an ACK.
	skipNode bool
}

// namesSeed keys the digests of encoded name lists: per process, so that
// no client can choose lists that collide.
var namesSeed = maphash.MakeSeed()

// unmarshal decodes data into r: resource_names are digested and skipped,
// and so is the node when skipNode is set (its framing is still checked);
// the rest goes through the protobuf codec's rules.
func (r *sotwRequest) unmarshal(data mem.BufferSlice) error {
	var (
		rest   []byte
		h      maphash.Hash
		detail *rpcstatus.Status
	)
	h.SetSeed(namesSeed)
	r.names = 0
	err := eachField(data, func(num protowire.Number, typ protowire.Type, field []byte) (err error) {
		switch {
		case num == fieldResourceNames && typ == protowire.BytesType:
			_, _ = h.Write(field)
			r.names++
		case num == fieldNode && r.skipNode:
		case num == fieldErrorDetail && typ == protowire.BytesType:
			// Decoded here, cut, rather than copied whole into rest.
			detail, err = mergeDetail(detail, field)
		default:
			rest = append(rest, field...)
		}
		return err
	})
	if err != nil {
		return err
	}
	r.digest = h.Sum64()
	r.DiscoveryRequest = &discoveryv3.DiscoveryRequest{}
	if err := proto.Unmarshal(rest, r.DiscoveryRequest); err != nil {
		return err
	}
	r.ErrorDetail = detail
	if r.names > 0 && detail != nil {
		// A NACK keeps only its names, copied: the request's buffers also
		// hold its error_detail, up to the request size limit.
		var names []byte
		for f := (fieldReader{bufs: data}); ; {
			num, typ, field, err := f.next()
			if err != nil {
				break // checked above
			}
			if num == fieldResourceNames && typ == protowire.BytesType {
				names = append(names, field...)
			}
		}
		r.raw = mem.BufferSlice{mem.SliceBuffer(names)}
		return nil
	}
	if r.names > 0 {
		// gRPC frees data once this returns; the reference keeps it.
		data.Ref()
		r.raw = data
	}
	return nil
}

// free gives the request's buffers back to gRPC's pool once it is handled.
// A request never freed (its stream ended first) is left to the garbage
// collector, which is all a pool's buffer costs then.
func (r *sotwRequest) free() {
	r.raw.Free()
	r.raw = nil
}

// resourceNames decodes the request's resource_names, refusing one that is
// not valid UTF-8 as the protobuf codec would.
func (r *sotwRequest) resourceNames() ([]string, error) {
	if r.names == 0 {
		return nil, nil
	}
	out := make([]string, 0, r.names)
	for f := (fieldReader{bufs: r.raw}); ; {
		num, typ, field, err := f.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if num == fieldResourceNames && typ == protowire.BytesType {
			_, _, n := protowire.ConsumeTag(field)
			v, _ := protowire.ConsumeBytes(field[n:])
			if !utf8.Valid(v) {
				return nil, fmt.Errorf("resource_names[%d] is not valid UTF-8", len(out))
			}
			out = append(out, string(v))
		}
	}
}

// eachField calls fn for every field (its tag included) of the message data
// holds, in order, until fn returns an error or a field is malformed.
func eachField(data mem.BufferSlice, fn func(num protowire.Number, typ protowire.Type, field []byte) error) error {
	for f := (fieldReader{bufs: data}); ; {
		num, typ, field, err := f.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(num, typ, field); err != nil {
			return err
		}
	}
}

// fieldReader walks the fields of a protobuf message held in several
// buffers, as gRPC receives a message larger than an HTTP/2 frame, without
// joining them: a field inside one buffer is returned in place, and only
// one that goes on into the next buffer is copied, alone, into scratch.
type fieldReader struct {
	bufs mem.BufferSlice
	// i is the next buffer to read; b is what is left of the current one.
	i       int
	b       []byte
	scratch []byte
}

// next returns the next field (its tag included), valid until the next
// call; io.EOF after the last one.
func (f *fieldReader) next() (protowire.Number, protowire.Type, []byte, error) {
	if !f.fill() {
		return 0, 0, nil, io.EOF
	}
	if num, typ, n := consumeField(f.b); n > 0 {
		field := f.b[:n]
		f.b = f.b[n:]
		return num, typ, field, nil
	}
	// The field goes on in the next buffer (or is malformed). It is joined
	// in ever larger chunks, so the copy is a few times the field at most.
	// A prefix of a field never parses, so whatever the last chunk brought
	// beyond the field is part of that chunk, and is read from there next.
	f.scratch = f.scratch[:0]
	for {
		if !f.fill() {
			_, _, n := consumeField(f.scratch)
			return 0, 0, nil, protowire.ParseError(n)
		}
		chunk := f.b
		take := min(len(chunk), max(16, len(f.scratch)))
		f.scratch = append(f.scratch, chunk[:take]...)
		if num, typ, n := consumeField(f.scratch); n > 0 {
			f.b = chunk[take-(len(f.scratch)-n):]
			return num, typ, f.scratch[:n], nil
		}
		f.b = chunk[take:]
	}
}

// fill makes b the rest of a buffer with something left; false at the end.
func (f *fieldReader) fill() bool {
	for len(f.b) == 0 {
		if f.i == len(f.bufs) {
			return false
		}
		f.b = f.bufs[f.i].ReadOnlyData()
		f.i++
	}
	return true
}

// consumeField parses the field b starts with and returns its size, tag
// included, or a negative protowire error code.
func consumeField(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, n
	}
	m := protowire.ConsumeFieldValue(num, typ, b[n:])
	if m < 0 {
		return 0, 0, m
	}
	return num, typ, n + m
}

// fieldNode, fieldResourceNames and fieldErrorDetail are
// DiscoveryRequest's node, resource_names and error_detail.
const (
	fieldNode          = 2
	fieldResourceNames = 3
	fieldErrorDetail   = 6
)

// mergeDetail decodes an encoded error_detail field (a google.rpc.Status,
// tag included) into st, as the protobuf codec merges a repeated message
// field, except that the message is cut to maxDetailBytes without copying
// the rest of it, and details, never read, are skipped.
func mergeDetail(st *rpcstatus.Status, field []byte) (*rpcstatus.Status, error) {
	_, _, n := protowire.ConsumeTag(field)
	b, _ := protowire.ConsumeBytes(field[n:])
	if st == nil {
		st = &rpcstatus.Status{}
	}
	for len(b) > 0 {
		num, typ, n := consumeField(b)
		if n < 0 {
			return nil, fmt.Errorf("error_detail: %w", protowire.ParseError(n))
		}
		f := b[:n]
		b = b[n:]
		_, _, t := protowire.ConsumeTag(f)
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, _ := protowire.ConsumeVarint(f[t:])
			st.Code = int32(v)
		case num == 2 && typ == protowire.BytesType:
			msg, _ := protowire.ConsumeBytes(f[t:])
			if !utf8.Valid(msg) {
				return nil, fmt.Errorf("error_detail.message is not valid UTF-8")
			}
			st.Message = clip.String(string(msg[:min(len(msg), maxDetailBytes+utf8.UTFMax)]), maxDetailBytes)
		}
	}
	return st, nil
}

// deltaRequest is a DeltaDiscoveryRequest as the delta handler receives
// it: every field decoded but initial_resource_versions, which are counted
// and digested (snapshot.PairDigest) where they lie, and decoded only if
// the handler needs them (claimed), and error_detail, cut as it is decoded
// (mergeDetail). A reconnecting proxy declares every
// resource it holds, two thousand (name, version) pairs per proxy in a
// scope of a thousand Services; decoding them into a map is a pair of
// strings allocated and checked and a map entry per claim, which made a
// delta reconnect cost what stock go-control-plane's does. A proxy that
// holds exactly what is served, most of a reconnect, is told so by the
// digest (delta.claims), in one pass over the bytes.
type deltaRequest struct {
	*discoveryv3.DeltaDiscoveryRequest
	// raw is the request as gRPC received it, held (by reference) while
	// it claims resources, until free; claims counts its
	// initial_resource_versions entries, and claimDigest is the XOR of
	// their pairs' snapshot.PairDigest.
	raw         mem.BufferSlice
	claims      int
	claimDigest uint64
}

// Field numbers of DeltaDiscoveryRequest's initial_resource_versions and
// error_detail, and of a map entry's key and value.
const (
	fieldInitialVersions  = 5
	fieldDeltaErrorDetail = 7
	fieldMapKey           = 1
	fieldMapValue         = 2
)

// unmarshal decodes data into r: initial_resource_versions are checked as
// the protobuf codec would (valid UTF-8), counted and digested, and
// skipped; error_detail is cut; the rest goes through the protobuf codec's
// rules.
func (r *deltaRequest) unmarshal(data mem.BufferSlice) error {
	var (
		rest   []byte
		detail *rpcstatus.Status
	)
	r.claims, r.claimDigest = 0, 0
	err := eachField(data, func(num protowire.Number, typ protowire.Type, field []byte) (err error) {
		switch {
		case num == fieldDeltaErrorDetail && typ == protowire.BytesType:
			// Decoded here, cut, rather than copied whole into rest.
			detail, err = mergeDetail(detail, field)
			return err
		case num != fieldInitialVersions || typ != protowire.BytesType:
			rest = append(rest, field...)
			return nil
		}
		name, version, err := claimOf(field)
		if err != nil {
			return fmt.Errorf("initial_resource_versions[%d]: %w", r.claims, err)
		}
		r.claimDigest ^= snapshot.PairDigest(name, version)
		r.claims++
		return nil
	})
	if err != nil {
		return err
	}
	r.DeltaDiscoveryRequest = &discoveryv3.DeltaDiscoveryRequest{}
	if err := proto.Unmarshal(rest, r.DeltaDiscoveryRequest); err != nil {
		return err
	}
	r.ErrorDetail = detail
	if r.claims > 0 {
		// gRPC frees data once this returns; the reference keeps it.
		data.Ref()
		r.raw = data
	}
	return nil
}

// claimOf parses one encoded initial_resource_versions entry (its tag
// included) as the protobuf codec reads a map entry: the last key and the
// last value win, a missing one is empty, other fields are skipped; both
// must be valid UTF-8.
func claimOf(field []byte) (name, version []byte, err error) {
	_, _, n := protowire.ConsumeTag(field)
	b, _ := protowire.ConsumeBytes(field[n:])
	for len(b) > 0 {
		num, typ, n := consumeField(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		f := b[:n]
		b = b[n:]
		if typ != protowire.BytesType || (num != fieldMapKey && num != fieldMapValue) {
			continue
		}
		_, _, t := protowire.ConsumeTag(f)
		v, _ := protowire.ConsumeBytes(f[t:])
		if !utf8.Valid(v) {
			return nil, nil, errors.New("not valid UTF-8")
		}
		if num == fieldMapKey {
			name = v
		} else {
			version = v
		}
	}
	return name, version, nil
}

// free gives the request's buffers back to gRPC's pool once it is handled.
func (r *deltaRequest) free() {
	r.raw.Free()
	r.raw = nil
}

// claimed decodes the request's initial_resource_versions, checked when
// the request was read.
func (r *deltaRequest) claimed() map[string]string {
	out := make(map[string]string, r.claims)
	_ = eachField(r.raw, func(num protowire.Number, typ protowire.Type, field []byte) error {
		if num == fieldInitialVersions && typ == protowire.BytesType {
			name, version, _ := claimOf(field)
			out[string(name)] = string(version)
		}
		return nil
	})
	return out
}
