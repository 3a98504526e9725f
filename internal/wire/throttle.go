package wire

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// AnswerRate bounds the bytes a node answers with on one protocol it
// serves through a library (the DHT's FIND_NODE answers up to 20 peers'
// records to a request of a few bytes, as often as it is asked): a token
// bucket per peer and one for all, in bytes a second. An answer that
// would wait for its tokens longer than MaxWait resets the stream.
type AnswerRate struct {
	PerPeer, All rate.Limit
	// PeerBurst and AllBurst are the buckets' sizes in bytes.
	PeerBurst, AllBurst int
	MaxWait             time.Duration
}

// DHTAnswerRate is the DHT's: 32 KiB a second to one peer (a burst of
// 128 KiB), 512 KiB a second to all (2 MiB). A node's own lookups ask a
// peer a few requests of about 1.4 KiB of answer every few seconds; a
// thousand-node job's walks ask a node about 15 KiB a second in all.
var DHTAnswerRate = AnswerRate{PerPeer: 32 << 10, All: 512 << 10, PeerBurst: 128 << 10, AllBurst: 2 << 20, MaxWait: 5 * time.Second}

// ThrottleAnswers returns h with the streams its pid handler accepts
// written within r; over is counted when a stream is reset for it.
func ThrottleAnswers(h host.Host, pid protocol.ID, r AnswerRate, over prometheus.Counter) host.Host {
	return &throttledHost{Host: h, pid: pid, t: &throttle{r: r, all: rate.NewLimiter(r.All, r.AllBurst), peers: make(map[peer.ID]*rate.Limiter), over: over}}
}

type throttledHost struct {
	host.Host
	pid protocol.ID
	t   *throttle
}

func (h *throttledHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	if pid != h.pid {
		h.Host.SetStreamHandler(pid, handler)
		return
	}
	h.Host.SetStreamHandler(pid, func(s network.Stream) { handler(&throttledStream{Stream: s, t: h.t}) })
}

// throttle holds the buckets.
type throttle struct {
	r     AnswerRate
	all   *rate.Limiter
	over  prometheus.Counter
	mu    sync.Mutex
	peers map[peer.ID]*rate.Limiter
}

// maxThrottled bounds the peers' buckets kept; past it they start again
// full (a peer gains at most one burst by it).
const maxThrottled = 4096

func (t *throttle) peer(p peer.ID) *rate.Limiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.peers[p]
	if !ok {
		if len(t.peers) >= maxThrottled {
			clear(t.peers)
		}
		l = rate.NewLimiter(t.r.PerPeer, t.r.PeerBurst)
		t.peers[p] = l
	}
	return l
}

// wait takes n bytes of p's bucket and the node's, waiting at most MaxWait.
func (t *throttle) wait(p peer.ID, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), t.r.MaxWait)
	defer cancel()
	if err := t.peer(p).WaitN(ctx, n); err != nil {
		return err
	}
	return t.all.WaitN(ctx, n)
}

type throttledStream struct {
	network.Stream
	t *throttle
}

func (s *throttledStream) Write(b []byte) (int, error) {
	p, written := s.Conn().RemotePeer(), 0
	for len(b) > 0 {
		n := min(len(b), s.t.r.PeerBurst, s.t.r.AllBurst)
		if err := s.t.wait(p, n); err != nil {
			inc(s.t.over)
			_ = s.Stream.Reset()
			return written, err
		}
		m, err := s.Stream.Write(b[:n])
		written += m
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}
