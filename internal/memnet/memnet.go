// Package memnet is an in-memory network for testnets of hundreds of real
// libp2p hosts in one process: go-libp2p's mocknet, with peers linked the
// first time one dials the other (instead of mocknet's N² LinkAll), a real
// connection manager on every host (mocknet hosts have none), and the
// faults a testnet injects: crashed peers that can no longer be dialled,
// partitions that cut links between groups, and link latency.
package memnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	bcm "github.com/libp2p/go-libp2p/p2p/net/connmgr"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
)

// ErrUnreachable is returned when a peer is gone or cut off by a partition.
var ErrUnreachable = errors.New("memnet: peer unreachable")

// Net is one in-memory network.
type Net struct {
	mn      mocknet.Mocknet
	latency time.Duration

	mu     sync.Mutex
	linked map[peer.ID]map[peer.ID]bool // both directions: linked[a][b] == linked[b][a]
	gone   map[peer.ID]bool
	group  map[peer.ID]int // partition group; peers in different groups cannot talk
	cut    bool
}

// New returns an empty network whose links add the given one-way latency.
func New(latency time.Duration) *Net {
	mn := mocknet.New()
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: latency})
	return &Net{
		mn:      mn,
		latency: latency,
		linked:  make(map[peer.ID]map[peer.ID]bool),
		gone:    make(map[peer.ID]bool),
		group:   make(map[peer.ID]int),
	}
}

// Close closes every host of the network.
func (n *Net) Close() error { return n.mn.Close() }

func key(a, b peer.ID) [2]peer.ID {
	if a > b {
		a, b = b, a
	}
	return [2]peer.ID{a, b}
}

func (n *Net) ensure(a, b peer.ID) error {
	if a == b {
		return fmt.Errorf("memnet: dial to self")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone[a] || n.gone[b] || (n.cut && n.group[a] != n.group[b]) {
		return ErrUnreachable
	}
	if n.linked[a][b] {
		return nil
	}
	k := key(a, b)
	if _, err := n.mn.LinkPeers(k[0], k[1]); err != nil {
		return fmt.Errorf("memnet: link: %w", err)
	}
	if n.latency > 0 {
		for _, l := range n.mn.LinksBetweenPeers(k[0], k[1]) {
			l.SetOptions(mocknet.LinkOptions{Latency: n.latency})
		}
	}
	n.link(a, b, true)
	return nil
}

// link records (or with on false, forgets) the link between a and b, in
// both directions; n.mu must be held.
func (n *Net) link(a, b peer.ID, on bool) {
	for _, e := range [2][2]peer.ID{{a, b}, {b, a}} {
		m := n.linked[e[0]]
		switch {
		case on && m == nil:
			m = make(map[peer.ID]bool)
			n.linked[e[0]] = m
			m[e[1]] = true
		case on:
			m[e[1]] = true
		default:
			delete(m, e[1])
			if len(m) == 0 {
				delete(n.linked, e[0])
			}
		}
	}
}

// Partition splits the network: from now on peers of different groups
// (group numbers assigned by fn; peers fn does not know are group 0) cannot
// reach each other, and their existing connections are closed.
func (n *Net) Partition(fn func(peer.ID) int) {
	n.mu.Lock()
	n.cut = true
	var toCut [][2]peer.ID
	for _, p := range n.mn.Peers() {
		n.group[p] = fn(p)
	}
	for a, m := range n.linked {
		for b := range m {
			if a < b && n.group[a] != n.group[b] {
				toCut = append(toCut, [2]peer.ID{a, b})
			}
		}
	}
	for _, k := range toCut {
		n.link(k[0], k[1], false)
	}
	n.mu.Unlock()
	for _, k := range toCut {
		_ = n.mn.UnlinkPeers(k[0], k[1])
		_ = n.mn.DisconnectPeers(k[0], k[1])
	}
}

// Heal ends a partition.
func (n *Net) Heal() {
	n.mu.Lock()
	n.cut = false
	n.mu.Unlock()
}

// Host is a mocknet host that links on demand and has a connection manager.
type Host struct {
	host.Host
	net *Net
	cm  *bcm.BasicConnMgr
}

// NewHost adds a host with connection-manager watermarks low and high.
func (n *Net) NewHost(low, high int) (*Host, error) {
	// mocknet's GenPeer makes ECDSA keys; real nodes use Ed25519, whose
	// signatures (every GossipSub message is signed and verified) cost
	// a third as much to check. Addresses follow GenPeer's scheme.
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	ip := append(net.IP{}, net.ParseIP("100::")...)
	suffix := []byte(id)[len(id)-8:]
	copy(ip[net.IPv6len-len(suffix):], suffix)
	addr, err := ma.NewMultiaddr(fmt.Sprintf("/ip6/%s/tcp/4242", ip))
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	h, err := n.mn.AddPeer(sk, addr)
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	cm, err := bcm.NewConnManager(low, high, bcm.WithGracePeriod(20*time.Second), bcm.WithSilencePeriod(5*time.Second))
	if err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("memnet: %w", err)
	}
	h.Network().Notify(cm.Notifee())
	return &Host{Host: h, net: n, cm: cm}, nil
}

// Connect links the two peers if needed, then connects.
func (h *Host) Connect(ctx context.Context, ai peer.AddrInfo) error {
	if h.Network().Connectedness(ai.ID) != network.Connected {
		if err := h.net.ensure(h.ID(), ai.ID); err != nil {
			return err
		}
	}
	return h.Host.Connect(ctx, ai)
}

// NewStream links the two peers if needed, then opens a stream.
func (h *Host) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	if h.Network().Connectedness(p) != network.Connected {
		if err := h.net.ensure(h.ID(), p); err != nil {
			return nil, err
		}
	}
	s, err := h.Host.NewStream(ctx, p, pids...)
	if err != nil || h.net.latency <= 0 {
		return s, err
	}
	return h.net.wrap(s), nil
}

// ConnManager returns the host's connection manager.
func (h *Host) ConnManager() connmgr.ConnManager { return h.cm }

// Close marks the peer gone and closes it. Its links are removed too: a
// raw dial on the underlying network (the path libp2p's own services take,
// bypassing Connect and NewStream above) would otherwise still reach the
// closed host over an existing link, and the dialler would hold a live-
// looking connection to a dead peer.
func (h *Host) Close() error {
	id := h.ID()
	h.net.mu.Lock()
	h.net.gone[id] = true
	// Only this host's own links: scanning every link of the network made
	// closing all hosts of a 1000-node testnet quadratic (27 CPU-seconds).
	var unlink [][2]peer.ID
	for p := range h.net.linked[id] {
		unlink = append(unlink, key(id, p))
	}
	for _, k := range unlink {
		h.net.link(k[0], k[1], false)
	}
	h.net.mu.Unlock()
	for _, k := range unlink {
		_ = h.net.mn.UnlinkPeers(k[0], k[1])
	}
	err := h.Host.Close()
	_ = h.cm.Close()
	return err
}

// SetStreamHandler registers handler with its streams wrapped like those of
// NewStream (see delayStream).
func (h *Host) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	if h.net.latency <= 0 {
		h.Host.SetStreamHandler(pid, handler)
		return
	}
	h.Host.SetStreamHandler(pid, func(s network.Stream) { handler(h.net.wrap(s)) })
}

// SetStreamHandlerMatch is SetStreamHandler with a protocol matcher.
func (h *Host) SetStreamHandlerMatch(pid protocol.ID, m func(protocol.ID) bool, handler network.StreamHandler) {
	if h.net.latency <= 0 {
		h.Host.SetStreamHandlerMatch(pid, m, handler)
		return
	}
	h.Host.SetStreamHandlerMatch(pid, m, func(s network.Stream) { handler(h.net.wrap(s)) })
}

func (n *Net) wrap(s network.Stream) network.Stream {
	return &delayStream{Stream: s, latency: n.latency}
}

// delayStream makes the link latency hold for the last write before a
// close too: mocknet delivers everything still in flight at once when a
// stream is closed, so a request-reply exchange (write, close) would
// otherwise cross a slow link in no time.
type delayStream struct {
	network.Stream
	latency time.Duration
	mu      sync.Mutex
	last    time.Time
}

func (s *delayStream) Write(b []byte) (int, error) {
	s.mu.Lock()
	s.last = time.Now()
	s.mu.Unlock()
	return s.Stream.Write(b)
}

func (s *delayStream) settle() {
	s.mu.Lock()
	wait := time.Until(s.last.Add(s.latency))
	s.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
}

func (s *delayStream) CloseWrite() error { s.settle(); return s.Stream.CloseWrite() }
func (s *delayStream) Close() error      { s.settle(); return s.Stream.Close() }
