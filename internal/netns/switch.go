package netns

import (
	"container/heap"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// vnetHdrLen is the virtio-net header before every frame on a TAP opened
// with IFF_VNET_HDR (struct virtio_net_hdr). The switch passes it on
// unread: it tells the receiving kernel how to treat a segmentation
// offload burst and its checksum.
const vnetHdrLen = 10

// maxFrame is the largest read from a TAP: a 64 KiB offload burst, its
// Ethernet and virtio-net headers, and room to spare.
const maxFrame = 64<<10 + 256

// queueCap is the most a destination's queue holds, in bytes: beyond it
// frames are dropped (a link slower than the delay can hide does not grow
// the switch's memory without bound).
const queueCap = 64 << 20

// tapDevice is one host's TAP, opened in its namespace.
type tapDevice struct {
	f    *os.File
	name string
}

// lswitch is a run's switch between its linked hosts' TAPs: a learning
// Ethernet switch that holds each frame for the source link's delay plus
// the destination link's. Each port has a reader goroutine and a writer
// goroutine; close stops them.
type lswitch struct {
	mu     sync.Mutex
	ports  []*port
	where  map[[6]byte]*port // learned: which port an address is behind
	closed bool
	wg     sync.WaitGroup

	seq                            atomic.Uint64
	frames, bytes, dropped, errors atomic.Int64
}

// port is one TAP on the switch and its queue of frames to write.
type port struct {
	sw     *lswitch
	tap    *tapDevice
	delay  time.Duration
	mu     sync.Mutex
	q      frameQueue
	qBytes int
	wake   chan struct{} // a frame was queued
	done   chan struct{} // closed by close
}

// qframe is a frame waiting for its time.
type qframe struct {
	due time.Time
	seq uint64 // ties keep arrival order
	buf *[]byte
	n   int
}

type frameQueue []*qframe

func (q frameQueue) Len() int { return len(q) }
func (q frameQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].seq < q[j].seq
}
func (q frameQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *frameQueue) Push(x any)   { *q = append(*q, x.(*qframe)) }
func (q *frameQueue) Pop() any {
	old := *q
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return f
}

// Buffers for frames: small ones (most frames, acknowledgements) and
// offload bursts.
var (
	smallBufs = sync.Pool{New: func() any { b := make([]byte, 2048); return &b }}
	largeBufs = sync.Pool{New: func() any { b := make([]byte, maxFrame); return &b }}
)

func getBuf(n int) *[]byte {
	if n <= 2048 {
		return smallBufs.Get().(*[]byte)
	}
	return largeBufs.Get().(*[]byte)
}

func putBuf(b *[]byte) {
	if len(*b) <= 2048 {
		smallBufs.Put(b)
	} else {
		largeBufs.Put(b)
	}
}

func newSwitch() *lswitch { return &lswitch{where: map[[6]byte]*port{}} }

// attach puts tap on the switch behind a link of delay d and starts its
// goroutines.
func (s *lswitch) attach(tap *tapDevice, d time.Duration) {
	p := &port{sw: s, tap: tap, delay: d, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = tap.f.Close()
		return
	}
	s.ports = append(s.ports, p)
	s.wg.Add(2)
	go p.read()  // ends when the TAP closes
	go p.write() // ends when done closes
}

// route is where a frame from port p to dst goes, after learning that
// src is behind p: the port dst was seen behind, or every other port for
// a group address or one not seen yet.
func (s *lswitch) route(p *port, src, dst [6]byte, to []*port) []*port {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src[0]&1 == 0 {
		s.where[src] = p
	}
	if dst[0]&1 == 0 {
		if q, ok := s.where[dst]; ok {
			if q == p {
				return to
			}
			return append(to, q)
		}
	}
	for _, q := range s.ports {
		if q != p {
			to = append(to, q)
		}
	}
	return to
}

// read takes frames from the TAP and queues them at their destinations.
func (p *port) read() {
	defer p.sw.wg.Done()
	buf := make([]byte, maxFrame)
	var to []*port
	for {
		n, err := p.tap.f.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			p.sw.errors.Add(1)
			select { // a device error: do not spin on it
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if n < vnetHdrLen+14 {
			p.sw.dropped.Add(1)
			continue
		}
		now := time.Now()
		eth := buf[vnetHdrLen:n]
		var src, dst [6]byte
		copy(dst[:], eth[0:6])
		copy(src[:], eth[6:12])
		to = p.sw.route(p, src, dst, to[:0])
		for _, q := range to {
			b := getBuf(n)
			copy(*b, buf[:n])
			q.enqueue(&qframe{due: now.Add(p.delay + q.delay), seq: p.sw.seq.Add(1), buf: b, n: n})
		}
	}
}

// enqueue queues f for writing at f.due, or drops it on a full queue.
func (p *port) enqueue(f *qframe) {
	p.mu.Lock()
	if p.qBytes+f.n > queueCap {
		p.mu.Unlock()
		putBuf(f.buf)
		p.sw.dropped.Add(1)
		return
	}
	heap.Push(&p.q, f)
	p.qBytes += f.n
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// write writes queued frames to the TAP as they fall due.
func (p *port) write() {
	defer p.sw.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		if len(p.q) == 0 {
			p.mu.Unlock()
			select {
			case <-p.wake:
			case <-p.done:
				return
			}
			continue
		}
		f := p.q[0]
		if wait := time.Until(f.due); wait > 0 {
			p.mu.Unlock()
			if wait <= 2*time.Millisecond {
				// Go's timers wake an idle process to the millisecond:
				// sleep the short rest in the kernel, to the tens of
				// microseconds.
				sleepShort(wait)
				continue
			}
			timer.Reset(wait - time.Millisecond)
			select {
			case <-timer.C:
			case <-p.wake: // perhaps an earlier frame
			case <-p.done:
				return
			}
			continue
		}
		heap.Pop(&p.q)
		p.qBytes -= f.n
		p.mu.Unlock()
		if _, err := p.tap.f.Write((*f.buf)[:f.n]); err != nil {
			p.sw.errors.Add(1)
		} else {
			p.sw.frames.Add(1)
			p.sw.bytes.Add(int64(f.n - vnetHdrLen))
		}
		putBuf(f.buf)
	}
}

func (s *lswitch) counters() LinkCounters {
	return LinkCounters{Frames: s.frames.Load(), Bytes: s.bytes.Load(), Dropped: s.dropped.Load(), Errors: s.errors.Load()}
}

// close closes the TAPs (the kernel removes them), stops every goroutine
// and waits for them. It is safe to call more than once.
func (s *lswitch) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	ports := s.ports
	s.mu.Unlock()
	for _, p := range ports {
		close(p.done)
		_ = p.tap.f.Close()
	}
	s.wg.Wait()
}
