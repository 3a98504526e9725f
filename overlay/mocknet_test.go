package overlay

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	bcm "github.com/libp2p/go-libp2p/p2p/net/connmgr"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
)

// lazyNet is a mocknet in which peers get a link the first time one dials
// the other, instead of LinkAll's N² links, and in which a departed peer
// can no longer be dialled.
type lazyNet struct {
	mn     mocknet.Mocknet
	mu     sync.Mutex
	linked map[[2]peer.ID]bool
	gone   map[peer.ID]bool
}

func newLazyNet() *lazyNet {
	return &lazyNet{mn: mocknet.New(), linked: make(map[[2]peer.ID]bool), gone: make(map[peer.ID]bool)}
}

func (l *lazyNet) ensure(a, b peer.ID) error {
	if a == b {
		return fmt.Errorf("dial to self")
	}
	if a > b {
		a, b = b, a
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone[a] || l.gone[b] {
		return fmt.Errorf("mocknet: peer gone")
	}
	if l.linked[[2]peer.ID{a, b}] {
		return nil
	}
	if _, err := l.mn.LinkPeers(a, b); err != nil {
		return err
	}
	l.linked[[2]peer.ID{a, b}] = true
	return nil
}

func (l *lazyNet) markGone(p peer.ID) {
	l.mu.Lock()
	l.gone[p] = true
	l.mu.Unlock()
}

// lazyHost wraps a mocknet host: it links on demand before dialling and has
// a real connection manager (mocknet hosts have none), so that connection
// counts stay bounded as they would on a real node.
type lazyHost struct {
	host.Host
	ln *lazyNet
	cm *bcm.BasicConnMgr
}

func (l *lazyNet) newHost(low, high int) (*lazyHost, error) {
	h, err := l.mn.GenPeer()
	if err != nil {
		return nil, err
	}
	cm, err := bcm.NewConnManager(low, high, bcm.WithGracePeriod(20*time.Second), bcm.WithSilencePeriod(5*time.Second))
	if err != nil {
		return nil, err
	}
	h.Network().Notify(cm.Notifee())
	return &lazyHost{Host: h, ln: l, cm: cm}, nil
}

func (h *lazyHost) Connect(ctx context.Context, ai peer.AddrInfo) error {
	if h.Network().Connectedness(ai.ID) != network.Connected {
		if err := h.ln.ensure(h.ID(), ai.ID); err != nil {
			return err
		}
	}
	return h.Host.Connect(ctx, ai)
}

func (h *lazyHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	if h.Network().Connectedness(p) != network.Connected {
		if err := h.ln.ensure(h.ID(), p); err != nil {
			return nil, err
		}
	}
	return h.Host.NewStream(ctx, p, pids...)
}

func (h *lazyHost) ConnManager() connmgr.ConnManager { return h.cm }

func (h *lazyHost) Close() error {
	h.ln.markGone(h.ID())
	err := h.Host.Close()
	_ = h.cm.Close()
	return err
}

// chiSquareP returns P(χ²_k ≥ x) by the Wilson–Hilferty approximation
// (accurate to about 1e-3 for k ≥ 10).
func chiSquareP(x float64, k int) float64 {
	fk := float64(k)
	z := (math.Cbrt(x/fk) - (1 - 2/(9*fk))) / math.Sqrt(2/(9*fk))
	return 0.5 * math.Erfc(z/math.Sqrt2)
}

// uniformity summarises selection counts against a uniform expectation.
func uniformity(counts []int) (maxMean, minMean, chi2, p float64) {
	total := 0
	for _, c := range counts {
		total += c
	}
	mean := float64(total) / float64(len(counts))
	lo, hi := math.Inf(1), 0.0
	for _, c := range counts {
		fc := float64(c)
		lo, hi = math.Min(lo, fc), math.Max(hi, fc)
		chi2 += (fc - mean) * (fc - mean) / mean
	}
	return hi / mean, lo / mean, chi2, chiSquareP(chi2, len(counts)-1)
}
