package memnet

import (
	"context"
	"fmt"
	"sync"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// peerNet is one host's network.Network: its connections to other hosts
// of the Net, which it makes itself (a connection is a pair of conns, one
// per host, made at once). It is what go-libp2p's swarm is to a real host,
// without transports, security or a muxer.
type peerNet struct {
	net     *Net
	id      peer.ID
	pub     ic.PubKey
	addr    ma.Multiaddr
	ps      peerstore.Peerstore
	emitter event.Emitter
	done    chan struct{} // closed when the host closes

	mu      sync.Mutex
	conns   map[peer.ID][]*conn
	handler network.StreamHandler
	closed  bool

	notifMu sync.Mutex
	notifs  map[network.Notifiee]struct{}
}

var _ network.Network = (*peerNet)(nil)

func (pn *peerNet) Peerstore() peerstore.Peerstore { return pn.ps }
func (pn *peerNet) LocalPeer() peer.ID             { return pn.id }

// DialPeer returns a connection to p: the one there is, or a new one if p
// is an open host of the Net that this host can reach.
func (pn *peerNet) DialPeer(_ context.Context, p peer.ID) (network.Conn, error) {
	if p == pn.id {
		return nil, fmt.Errorf("memnet: dial to self")
	}
	if c := pn.connTo(p); c != nil {
		return c, nil
	}
	other, err := pn.net.reach(pn.id, p)
	if err != nil {
		return nil, err
	}
	return pn.connect(other)
}

// connTo returns a connection to p, or nil.
func (pn *peerNet) connTo(p peer.ID) *conn {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	if cs := pn.conns[p]; len(cs) > 0 {
		return cs[0]
	}
	return nil
}

// connect makes a connection to other, unless one appeared meanwhile.
func (pn *peerNet) connect(other *peerNet) (*conn, error) {
	lat := pn.net.Latency(pn.id, other.id)
	now := time.Now()
	mine := pn.newConn(other, lat, network.DirOutbound, now)
	theirs := other.newConn(pn, lat, network.DirInbound, now)
	mine.other, theirs.other = theirs, mine
	first, second := pn, other // lock order: by peer ID
	if second.id < first.id {
		first, second = second, first
	}
	first.mu.Lock()
	second.mu.Lock()
	var existing *conn
	added := false
	switch {
	case pn.closed || other.closed:
	case len(pn.conns[other.id]) > 0:
		existing = pn.conns[other.id][0]
	default:
		pn.conns[other.id] = append(pn.conns[other.id], mine)
		other.conns[pn.id] = append(other.conns[pn.id], theirs)
		mine.notified.Lock()
		theirs.notified.Lock()
		added = true
	}
	second.mu.Unlock()
	first.mu.Unlock()
	if existing != nil {
		return existing, nil
	}
	if !added {
		return nil, ErrUnreachable
	}
	pn.connected(mine)
	go other.connected(theirs)
	return mine, nil
}

func (pn *peerNet) newConn(other *peerNet, lat time.Duration, dir network.Direction, now time.Time) *conn {
	return &conn{
		net:        pn,
		id:         pn.net.connID.Add(1),
		local:      pn.id,
		remote:     other.id,
		localAddr:  pn.addr,
		remoteAddr: other.addr,
		remoteKey:  other.pub,
		latency:    lat,
		stat:       network.ConnStats{Stats: network.Stats{Direction: dir, Opened: now}},
		streams:    make(map[*stream]struct{}),
	}
}

// connected tells the notifiees and the event bus of a new conn.
func (pn *peerNet) connected(c *conn) {
	defer c.notified.Unlock()
	pn.notify(func(f network.Notifiee) { f.Connected(pn, c) })
	_ = pn.emitter.Emit(event.EvtPeerConnectednessChanged{Peer: c.remote, Connectedness: network.Connected})
}

// removeConn takes a closed conn off the network and tells the notifiees
// (in a goroutine, as go-libp2p's swarm does).
func (pn *peerNet) removeConn(c *conn) {
	pn.mu.Lock()
	cs := pn.conns[c.remote]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	last := len(cs) == 0
	if last {
		delete(pn.conns, c.remote)
	} else {
		pn.conns[c.remote] = cs
	}
	pn.mu.Unlock()
	go func() {
		c.notified.Lock()
		defer c.notified.Unlock()
		pn.notify(func(f network.Notifiee) { f.Disconnected(pn, c) })
		if last {
			_ = pn.emitter.Emit(event.EvtPeerConnectednessChanged{Peer: c.remote, Connectedness: network.NotConnected})
		}
	}()
}

// handleStream hands a stream another host opened to the stream handler.
func (pn *peerNet) handleStream(s *stream) {
	pn.mu.Lock()
	h := pn.handler
	if pn.closed {
		h = nil
	}
	pn.mu.Unlock()
	if h == nil {
		_ = s.Reset()
		return
	}
	go h(s)
}

func (pn *peerNet) SetStreamHandler(h network.StreamHandler) {
	pn.mu.Lock()
	pn.handler = h
	pn.mu.Unlock()
}

func (pn *peerNet) NewStream(ctx context.Context, p peer.ID) (network.Stream, error) {
	c, err := pn.DialPeer(ctx, p)
	if err != nil {
		return nil, err
	}
	return c.NewStream(ctx)
}

func (pn *peerNet) ClosePeer(p peer.ID) error {
	pn.mu.Lock()
	cs := append([]*conn(nil), pn.conns[p]...)
	pn.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	return nil
}

func (pn *peerNet) Connectedness(p peer.ID) network.Connectedness {
	if pn.connTo(p) != nil {
		return network.Connected
	}
	return network.NotConnected
}

func (pn *peerNet) Peers() []peer.ID {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	out := make([]peer.ID, 0, len(pn.conns))
	for p := range pn.conns {
		out = append(out, p)
	}
	return out
}

func (pn *peerNet) Conns() []network.Conn {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	out := make([]network.Conn, 0, len(pn.conns))
	for _, cs := range pn.conns {
		for _, c := range cs {
			out = append(out, c)
		}
	}
	return out
}

func (pn *peerNet) ConnsToPeer(p peer.ID) []network.Conn {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	cs := pn.conns[p]
	if len(cs) == 0 {
		return nil
	}
	out := make([]network.Conn, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

// allConns returns every conn, for closing.
func (pn *peerNet) allConns() []*conn {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	var out []*conn
	for _, cs := range pn.conns {
		out = append(out, cs...)
	}
	return out
}

func (pn *peerNet) Notify(f network.Notifiee) {
	pn.notifMu.Lock()
	pn.notifs[f] = struct{}{}
	pn.notifMu.Unlock()
}

func (pn *peerNet) StopNotify(f network.Notifiee) {
	pn.notifMu.Lock()
	delete(pn.notifs, f)
	pn.notifMu.Unlock()
}

// notify calls fn for every notifiee, synchronously as the swarm does.
func (pn *peerNet) notify(fn func(network.Notifiee)) {
	pn.notifMu.Lock()
	fs := make([]network.Notifiee, 0, len(pn.notifs))
	for f := range pn.notifs {
		fs = append(fs, f)
	}
	pn.notifMu.Unlock()
	for _, f := range fs {
		fn(f)
	}
}

func (pn *peerNet) CanDial(peer.ID, ma.Multiaddr) bool { return true }

// Listen records addrs as the host's (a memnet host is reachable by its
// peer ID whatever it listens on).
func (pn *peerNet) Listen(addrs ...ma.Multiaddr) error {
	pn.ps.AddAddrs(pn.id, addrs, peerstore.PermanentAddrTTL)
	for _, a := range addrs {
		pn.notify(func(f network.Notifiee) { f.Listen(pn, a) })
	}
	return nil
}

func (pn *peerNet) ListenAddresses() []ma.Multiaddr { return []ma.Multiaddr{pn.addr} }

func (pn *peerNet) InterfaceListenAddresses() ([]ma.Multiaddr, error) {
	return pn.ListenAddresses(), nil
}

func (pn *peerNet) ResourceManager() network.ResourceManager {
	return &network.NullResourceManager{}
}

// Close closes every connection and stops the handler and notifiees: the
// host is gone from the Net (see Host.Close) and, once its connections are
// closed, nothing of the Net refers to it.
func (pn *peerNet) Close() error {
	pn.mu.Lock()
	if pn.closed {
		pn.mu.Unlock()
		return nil
	}
	pn.closed = true
	pn.handler = nil
	pn.mu.Unlock()
	for _, c := range pn.allConns() {
		_ = c.Close()
	}
	return pn.emitter.Close()
}

// markClosed closes pn.done once: writes waiting for bandwidth give up.
func (pn *peerNet) markClosed() {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	select {
	case <-pn.done:
	default:
		close(pn.done)
	}
}
