package hostile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends bytes as they are, so a request can be what no xDS
// client would send: not a protobuf message at all.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// rapidReset opens n ADS streams on one HTTP/2 connection and resets each
// right after its headers (CVE-2023-44487), without waiting for the
// server's SETTINGS: a client that respected MaxConcurrentStreams could not
// do this. It returns once the server has read every frame, which it shows
// by answering a PING sent after them.
func rapidReset(t *testing.T, addr string, n int) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	w := bufio.NewWriterSize(c, 64<<10)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(w, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	block := sotwHeaders(addr)
	for i := range n {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	ping := [8]byte{'h', 'o', 's', 't', 'i', 'l', 'e', '!'}
	if err := fr.WritePing(false, ping); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended before the server answered the PING after the resets: %v", err)
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if f.IsAck() && f.Data == ping {
				return
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
				_ = w.Flush()
			}
		case *http2.GoAwayFrame:
			t.Logf("the server sent GOAWAY (%v) after the resets", f.ErrCode)
			return
		}
	}
}

// sotwHeaders is the HPACK block that opens a SotW ADS stream, with the
// extra header fields after gRPC's own.
func sotwHeaders(addr string, extra ...hpack.HeaderField) []byte {
	return adsHeaders(addr, "StreamAggregatedResources", extra...)
}

// deltaHeaders is the HPACK block that opens a delta ADS stream.
func deltaHeaders(addr string) []byte { return adsHeaders(addr, "DeltaAggregatedResources") }

// adsHeaders is the HPACK block that opens a stream of the ADS method.
func adsHeaders(addr, method string, extra ...hpack.HeaderField) []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.discovery.v3.AggregatedDiscoveryService/" + method},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for _, f := range extra {
		_ = enc.WriteField(f)
	}
	return hb.Bytes()
}

// grpcMessage frames one message as gRPC sends it: uncompressed, with its
// length.
func grpcMessage(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// slowReader opens one SotW ADS stream per message on one HTTP/2
// connection from the loopback address ip, sends each its request, and then reads what the server sends
// without ever granting it flow-control window: past the initial 64 KiB,
// what the server sends stays with the server. The channel receives how
// the connection ended once the server closed it (or the deadline passed).
func slowReader(t *testing.T, ip, addr string, reqs [][]byte, deadline time.Time) <-chan error {
	t.Helper()
	return slowReaderOn(t, rawFrom(t, ip, addr), addr, reqs, deadline)
}

// slowReaderOn is slowReader on an open connection c to addr (a TLS one,
// say).
func slowReaderOn(t *testing.T, c net.Conn, addr string, reqs [][]byte, deadline time.Time) <-chan error {
	t.Helper()
	_ = c.SetDeadline(deadline)
	w := bufio.NewWriterSize(c, 64<<10)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(w, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	block := sotwHeaders(addr)
	for i, req := range reqs {
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(id, false, req); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		defer func() { _ = c.Close() }()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				ended <- err
				return
			}
			acknowledge(fr, w, f)
		}
	}()
	return ended
}

// acknowledge answers the server's SETTINGS and PING on fr, as a client
// must to keep its connection, and flushes w.
func acknowledge(fr *http2.Framer, w *bufio.Writer, f http2.Frame) {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			_ = fr.WriteSettingsAck()
			_ = w.Flush()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = fr.WritePing(true, f.Data)
			_ = w.Flush()
		}
	}
}
