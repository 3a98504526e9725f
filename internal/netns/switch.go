package netns

import (
	"container/heap"
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

// port is one TAP on the switch: its link's delay and the frames waiting
// to be written to it. Only the switch's loop touches the queue.
type port struct {
	fd     int // the TAP, non-blocking
	name   string
	delay  time.Duration
	q      frameQueue
	qBytes int
}

// qframe is a frame waiting for its time.
type qframe struct {
	due time.Time
	seq uint64 // ties keep arrival order
	buf []byte
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

// table is the switch's forwarding state: its ports and where it has
// seen each address (a learning Ethernet switch).
type table struct {
	ports []*port
	where map[[6]byte]*port
	seq   uint64
}

// route is where a frame from port p to dst goes, after learning that
// src is behind p: the port dst was seen behind, or every other port for
// a group address or one not seen yet. It appends to to.
func (t *table) route(p *port, src, dst [6]byte, to []*port) []*port {
	if src[0]&1 == 0 {
		t.where[src] = p
	}
	if dst[0]&1 == 0 {
		if q, ok := t.where[dst]; ok {
			if q == p {
				return to
			}
			return append(to, q)
		}
	}
	for _, q := range t.ports {
		if q != p {
			to = append(to, q)
		}
	}
	return to
}

// enqueue queues a copy of frame for port q, due at due; false when q's
// queue is full (the frame is dropped).
func (t *table) enqueue(q *port, frame []byte, due time.Time) bool {
	if q.qBytes+len(frame) > queueCap {
		return false
	}
	t.seq++
	heap.Push(&q.q, &qframe{due: due, seq: t.seq, buf: append([]byte(nil), frame...)})
	q.qBytes += len(frame)
	return true
}

// due pops port q's frames due by now, in order, calling write for each.
func (q *port) due(now time.Time, write func(*port, []byte)) {
	for len(q.q) > 0 && !q.q[0].due.After(now) {
		f := heap.Pop(&q.q).(*qframe)
		q.qBytes -= len(f.buf)
		write(q, f.buf)
	}
}

// next is the earliest due time over the ports (zero: nothing queued).
func (t *table) next() time.Time {
	var at time.Time
	for _, p := range t.ports {
		if len(p.q) > 0 && (at.IsZero() || p.q[0].due.Before(at)) {
			at = p.q[0].due
		}
	}
	return at
}
