package hostile

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// h2conn is a raw HTTP/2 client connection that sends what a hostile
// client chooses, within the flow-control windows the server grants (a
// client that sends beyond them is closed by the server, which is not the
// attack): it can stall a message part-way, or grant no receive window.
type h2conn struct {
	c  net.Conn
	w  *bufio.Writer
	fr *http2.Framer

	mu      sync.Mutex
	cond    *sync.Cond
	initial int64            // the server's SETTINGS_INITIAL_WINDOW_SIZE
	conn    int64            // what the connection may still send
	streams map[uint32]int64 // what each stream may still send
	reset   map[uint32]bool
	err     error // how the connection ended
	wmu     sync.Mutex
	next    uint32
	ended   chan struct{}
}

// dialH2 opens a raw HTTP/2 connection from ip to addr that sends its own
// SETTINGS (none: the defaults, or a receive window of zero when
// zeroWindow) and answers the server's SETTINGS and PINGs, nothing else.
func dialH2(t *testing.T, ip, addr string, zeroWindow bool, deadline time.Time) *h2conn {
	t.Helper()
	c := rawFrom(t, ip, addr)
	_ = c.SetDeadline(deadline)
	h := &h2conn{c: c, w: bufio.NewWriterSize(c, 64<<10), initial: 65535, conn: 65535, streams: map[uint32]int64{}, reset: map[uint32]bool{}, next: 1, ended: make(chan struct{})}
	h.cond = sync.NewCond(&h.mu)
	h.fr = http2.NewFramer(h.w, c)
	var settings []http2.Setting
	if zeroWindow {
		settings = append(settings, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	}
	h.wmu.Lock()
	_, err := h.w.WriteString(http2.ClientPreface)
	if err == nil {
		err = h.fr.WriteSettings(settings...)
	}
	if err == nil {
		err = h.w.Flush()
	}
	h.wmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	go h.read()
	return h
}

func (h *h2conn) read() {
	defer close(h.ended)
	for {
		f, err := h.fr.ReadFrame()
		h.mu.Lock()
		if err != nil {
			h.err = err
			h.cond.Broadcast()
			h.mu.Unlock()
			_ = h.c.Close()
			return
		}
		var reply func() error
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					for id := range h.streams {
						h.streams[id] += int64(v) - h.initial
					}
					h.initial = int64(v)
				}
				reply = h.fr.WriteSettingsAck
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				h.conn += int64(f.Increment)
			} else {
				h.streams[f.StreamID] += int64(f.Increment)
			}
		case *http2.RSTStreamFrame:
			h.reset[f.StreamID] = true
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				reply = func() error { return h.fr.WritePing(true, data) }
			}
		}
		h.cond.Broadcast()
		h.mu.Unlock()
		if reply != nil {
			h.wmu.Lock()
			if reply() == nil {
				_ = h.w.Flush()
			}
			h.wmu.Unlock()
		}
	}
}

// open starts a stream with the header block and returns its id.
func (h *h2conn) open(block []byte) (uint32, error) {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	id := h.next
	h.next += 2
	h.mu.Lock()
	h.streams[id] = h.initial
	h.mu.Unlock()
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
		return 0, err
	}
	return id, h.w.Flush()
}

// errStreamReset is how send ends on a stream the server reset.
var errStreamReset = errors.New("the server reset the stream")

// send sends b on stream id as the windows allow, waiting for window
// updates; it returns early when the server resets the stream or the
// connection ends.
func (h *h2conn) send(id uint32, b []byte) error {
	for len(b) > 0 {
		h.mu.Lock()
		for h.err == nil && !h.reset[id] && (h.conn <= 0 || h.streams[id] <= 0) {
			h.cond.Wait()
		}
		if h.err != nil || h.reset[id] {
			err := h.err
			if err == nil {
				err = errStreamReset
			}
			h.mu.Unlock()
			return err
		}
		n := min(int64(len(b)), h.conn, h.streams[id], 16<<10)
		h.conn -= n
		h.streams[id] -= n
		h.mu.Unlock()
		h.wmu.Lock()
		err := h.fr.WriteData(id, false, b[:n])
		if err == nil {
			err = h.w.Flush()
		}
		h.wmu.Unlock()
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// close ends the connection and waits for its reader.
func (h *h2conn) close() {
	_ = h.c.Close()
	<-h.ended
}

// closed reports whether the server closed the connection.
func (h *h2conn) closed() bool {
	select {
	case <-h.ended:
		return true
	default:
		return false
	}
}
