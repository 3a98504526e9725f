package memnet

import (
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// window is how many bytes a stream direction holds before its writer
// waits for the reader: yamux's initial receive window. A reader that
// falls behind holds up its writer, as over a real connection, and at
// most this much per stream is in flight.
const window = 256 << 10

var (
	errReadClosed  = errors.New("memnet: stream closed for reading")
	errWriteClosed = errors.New("memnet: stream closed for writing")
)

// half is one direction of a stream: what one end writes and the other
// reads. It is a queue of chunks, each readable from its arrival time (the
// write's time plus the link's latency; zero on a link without latency),
// then an end of stream that arrives after the last chunk. Nothing runs
// for it: a blocked reader or writer waits on a channel (and, only when
// there is a time to wait for, a timer), so an idle stream costs no
// goroutine and no timer, and on a virtual clock a wait is durable.
type half struct {
	mu       sync.Mutex
	chunks   []chunk
	size     int       // bytes queued
	eof      bool      // the writer has closed
	eofAt    time.Time // when the end of stream arrives
	err      error     // reset: reads and writes fail with it at once
	rclosed  bool      // the reader has closed: data is dropped
	wclosed  bool      // the writer has closed (or reset)
	last     time.Time // arrival time of the last chunk or end
	rdl, wdl time.Time // read and write deadlines
	readable chan struct{}
	writable chan struct{}
	alarms   *alarms
	// The alarms set to signal readable and writable (zero if none), and
	// the weak pointer to h the alarms hold, guarded by alarms.mu.
	ralarm, walarm time.Time
	self           weak.Pointer[half]
}

// alarm returns the record of the alarm pending for h's reader (or, if
// write, its writer) and the channel it signals. alarms.mu must be held
// to read or set the record.
func (h *half) alarm(write bool) (*time.Time, chan struct{}) {
	if write {
		return &h.walarm, h.writable
	}
	return &h.ralarm, h.readable
}

type chunk struct {
	b  []byte
	at time.Time
}

func newHalf(a *alarms) *half {
	return &half{readable: make(chan struct{}, 1), writable: make(chan struct{}, 1), alarms: a}
}

// wake signals c without blocking; a waiter re-checks its half.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// read reads what has arrived, waiting for the first byte.
func (h *half) read(b []byte) (int, error) {
	for {
		h.mu.Lock()
		if h.err != nil {
			err := h.err
			h.mu.Unlock()
			return 0, err
		}
		if h.rclosed {
			h.mu.Unlock()
			return 0, errReadClosed
		}
		now := time.Now()
		n := 0
		for n < len(b) && len(h.chunks) > 0 && !h.chunks[0].at.After(now) {
			c := &h.chunks[0]
			k := copy(b[n:], c.b)
			n += k
			c.b = c.b[k:]
			if len(c.b) == 0 {
				h.chunks[0] = chunk{}
				h.chunks = h.chunks[1:]
			}
		}
		if n > 0 || len(b) == 0 {
			h.size -= n
			if len(h.chunks) == 0 {
				h.chunks = nil // let the array go
			}
			h.mu.Unlock()
			wake(h.writable)
			return n, nil
		}
		var until time.Time
		switch {
		case len(h.chunks) > 0:
			until = h.chunks[0].at
		case h.eof && !h.eofAt.After(now):
			h.mu.Unlock()
			return 0, io.EOF
		case h.eof:
			until = h.eofAt
		}
		dl := h.rdl
		h.mu.Unlock()
		if !dl.IsZero() && !now.Before(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		if h.alarms.wait(h, false, until, dl) {
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// write queues a copy of b, arriving latency from now, once the reader
// has room for it.
func (h *half) write(b []byte, latency time.Duration) (int, error) {
	for {
		h.mu.Lock()
		switch {
		case h.err != nil:
			err := h.err
			h.mu.Unlock()
			return 0, err
		case h.wclosed:
			h.mu.Unlock()
			return 0, errWriteClosed
		case h.rclosed: // the reader is gone: the bytes go nowhere
			h.mu.Unlock()
			return len(b), nil
		}
		if h.size < window || len(b) == 0 {
			if len(b) > 0 {
				at := h.arrival(latency)
				h.chunks = append(h.chunks, chunk{b: append([]byte(nil), b...), at: at})
				h.size += len(b)
			}
			h.mu.Unlock()
			wake(h.readable)
			return len(b), nil
		}
		dl := h.wdl
		h.mu.Unlock()
		if !dl.IsZero() && !time.Now().Before(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		if h.alarms.wait(h, true, time.Time{}, dl) {
			return 0, os.ErrDeadlineExceeded
		}
	}
}

// arrival is when something sent now reaches the reader: never before
// what was sent earlier. h.mu must be held.
func (h *half) arrival(latency time.Duration) time.Time {
	if latency <= 0 && h.last.IsZero() {
		return time.Time{}
	}
	at := time.Now().Add(latency)
	if at.Before(h.last) {
		at = h.last
	}
	h.last = at
	return at
}

// closeWrite ends the direction after what is queued.
func (h *half) closeWrite(latency time.Duration) {
	h.mu.Lock()
	if !h.wclosed {
		h.wclosed, h.eof = true, true
		h.eofAt = h.arrival(latency)
	}
	h.mu.Unlock()
	wake(h.readable)
}

// closeRead drops what is queued and what comes later.
func (h *half) closeRead() {
	h.mu.Lock()
	h.rclosed = true
	h.chunks, h.size = nil, 0
	h.mu.Unlock()
	wake(h.readable)
	wake(h.writable)
}

// reset fails every read and write from now on, at both ends.
func (h *half) reset() {
	h.mu.Lock()
	if h.err == nil {
		h.err = network.ErrReset
	}
	h.wclosed = true
	h.chunks, h.size = nil, 0
	h.mu.Unlock()
	wake(h.readable)
	wake(h.writable)
}

func (h *half) setReadDeadline(t time.Time) {
	h.mu.Lock()
	h.rdl = t
	h.mu.Unlock()
	wake(h.readable)
}

func (h *half) setWriteDeadline(t time.Time) {
	h.mu.Lock()
	h.wdl = t
	h.mu.Unlock()
	wake(h.writable)
}

// stream is one end of a stream: it reads in and writes out, the other
// end's halves the other way round.
type stream struct {
	conn     *conn
	id       int64
	in, out  *half
	stat     network.Stats
	protocol atomic.Pointer[protocol.ID]
	done     atomic.Bool // closed or reset at this end: off the conn's list
}

var _ network.Stream = (*stream)(nil)

func (s *stream) Read(b []byte) (int, error) { return s.in.read(b) }

func (s *stream) Write(b []byte) (int, error) {
	c := s.conn
	if err := c.net.net.transmit(c.local, c.remote, len(b), c.net.done); err != nil {
		return 0, err
	}
	return s.out.write(b, c.latency)
}

func (s *stream) CloseWrite() error {
	s.out.closeWrite(s.conn.latency)
	return nil
}

func (s *stream) CloseRead() error {
	s.in.closeRead()
	return nil
}

// Close ends both directions: what was written still arrives.
func (s *stream) Close() error {
	s.out.closeWrite(s.conn.latency)
	s.in.closeRead()
	s.finish()
	return nil
}

func (s *stream) Reset() error {
	s.in.reset()
	s.out.reset()
	s.finish()
	return nil
}

func (s *stream) ResetWithError(network.StreamErrorCode) error { return s.Reset() }

// finish takes the stream off its conn's list.
func (s *stream) finish() {
	if s.done.CompareAndSwap(false, true) {
		s.conn.removeStream(s)
	}
}

func (s *stream) SetDeadline(t time.Time) error {
	s.in.setReadDeadline(t)
	s.out.setWriteDeadline(t)
	return nil
}

func (s *stream) SetReadDeadline(t time.Time) error {
	s.in.setReadDeadline(t)
	return nil
}

func (s *stream) SetWriteDeadline(t time.Time) error {
	s.out.setWriteDeadline(t)
	return nil
}

func (s *stream) ID() string { return strconv.FormatInt(s.id, 10) }

func (s *stream) Protocol() protocol.ID {
	if p := s.protocol.Load(); p != nil {
		return *p
	}
	return ""
}

func (s *stream) SetProtocol(p protocol.ID) error {
	s.protocol.Store(&p)
	return nil
}

func (s *stream) Stat() network.Stats        { return s.stat }
func (s *stream) Conn() network.Conn         { return s.conn }
func (s *stream) Scope() network.StreamScope { return &network.NullScope{} }
