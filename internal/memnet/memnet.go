package memnet

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	bcm "github.com/libp2p/go-libp2p/p2p/net/connmgr"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	manet "github.com/multiformats/go-multiaddr/net"
)

// ErrUnreachable is returned when a peer is gone or cut off by a partition.
var ErrUnreachable = errors.New("memnet: peer unreachable")

// Config describes the links of a network.
type Config struct {
	// LatencyMin and LatencyMax bound the one-way latency of a link. Each
	// pair of hosts draws its latency once, uniformly in [LatencyMin,
	// LatencyMax] (from Seed and the two peer IDs, so both directions and
	// every reconnection agree); equal bounds give every link the same.
	LatencyMin, LatencyMax time.Duration
	// Bandwidth, in bytes per second, is each host's uplink and downlink:
	// a write from a to b waits until both a's uplink and b's downlink are
	// free, then holds them for len/Bandwidth. 0 is unlimited.
	Bandwidth float64
	// Seed makes the hosts' keys (and so their peer IDs) a function of it
	// and of the order hosts are added; 0 draws them from crypto/rand.
	Seed uint64
}

// Net is one in-memory network.
type Net struct {
	mn  mocknet.Mocknet
	cfg Config

	mu     sync.Mutex
	keys   io.Reader                    // host keys, guarded by mu
	linked map[peer.ID]map[peer.ID]bool // both directions: linked[a][b] == linked[b][a]
	gone   map[peer.ID]bool
	group  map[peer.ID]int // partition group; peers in different groups cannot talk
	cut    bool
	hosts  map[peer.ID]*Host // open hosts, closed with the network
	nextIP int               // NewIP's counter
	ports  map[string]int    // hosts given each IP so far

	bwMu sync.Mutex
	busy map[peer.ID]*pipes // each host's uplink and downlink, with Bandwidth
}

// pipes is when a host's uplink and downlink are next free.
type pipes struct{ up, down time.Time }

// New returns an empty network whose links all add the given one-way
// latency.
func New(latency time.Duration) *Net {
	return NewNet(Config{LatencyMin: latency, LatencyMax: latency})
}

// KeySource is where hosts' keys come from: crypto/rand for seed 0, else a
// stream seeded by seed and purpose (a label that keeps streams of the same
// seed apart), so a seed gives the same peer IDs run after run. The stream
// is not safe for concurrent use.
func KeySource(seed uint64, purpose string) io.Reader {
	if seed == 0 {
		return crand.Reader
	}
	var b [32]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	copy(b[8:], purpose)
	return rand.NewChaCha8(b)
}

// NewNet returns an empty network with the given links.
func NewNet(cfg Config) *Net {
	cfg.LatencyMax = max(cfg.LatencyMax, cfg.LatencyMin)
	keys := KeySource(cfg.Seed, "memnet host keys")
	return &Net{
		mn:     mocknet.New(),
		cfg:    cfg,
		keys:   keys,
		linked: make(map[peer.ID]map[peer.ID]bool),
		gone:   make(map[peer.ID]bool),
		group:  make(map[peer.ID]int),
		hosts:  make(map[peer.ID]*Host),
		ports:  make(map[string]int),
		busy:   make(map[peer.ID]*pipes),
	}
}

// Latency returns the one-way latency of the link between a and b.
func (n *Net) Latency(a, b peer.ID) time.Duration {
	lo, hi := n.cfg.LatencyMin, n.cfg.LatencyMax
	if hi <= lo {
		return lo
	}
	k := key(a, b)
	h := fnv.New64a()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], n.cfg.Seed)
	h.Write(seed[:])
	h.Write([]byte(k[0]))
	h.Write([]byte(k[1]))
	u := float64(h.Sum64()>>11) / (1 << 53) // uniform in [0, 1)
	return lo + time.Duration(u*float64(hi-lo))
}

// shaped reports whether streams need the wrapper (latency or bandwidth).
func (n *Net) shaped() bool { return n.cfg.LatencyMax > 0 || n.cfg.Bandwidth > 0 }

// errHostClosed is a write's error when its host closes while the write
// waits for bandwidth.
var errHostClosed = errors.New("memnet: host closed")

// transmit blocks for the time size bytes take through src's uplink and
// dst's downlink, after whatever they are already carrying, or until done
// is closed (the writer's host closed).
func (n *Net) transmit(src, dst peer.ID, size int, done <-chan struct{}) error {
	if n.cfg.Bandwidth <= 0 || size <= 0 {
		return nil
	}
	d := time.Duration(float64(size) / n.cfg.Bandwidth * float64(time.Second))
	n.bwMu.Lock()
	now := time.Now()
	up, down := n.pipesLocked(src), n.pipesLocked(dst)
	start := now
	if up.up.After(start) {
		start = up.up
	}
	if down.down.After(start) {
		start = down.down
	}
	end := start.Add(d)
	up.up, down.down = end, end
	n.bwMu.Unlock()
	tm := time.NewTimer(end.Sub(now))
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-done:
		return errHostClosed
	}
}

func (n *Net) pipesLocked(p peer.ID) *pipes {
	b := n.busy[p]
	if b == nil {
		b = &pipes{}
		n.busy[p] = b
	}
	return b
}

// Close closes every host of the network, with its connection manager.
func (n *Net) Close() error {
	n.mu.Lock()
	var cms []*bcm.BasicConnMgr
	for _, h := range n.hosts {
		cms = append(cms, h.cm)
		h.markClosed()
	}
	clear(n.hosts)
	n.mu.Unlock()
	err := n.mn.Close()
	for _, cm := range cms {
		_ = cm.Close()
	}
	return err
}

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
	if lat := n.Latency(a, b); lat > 0 {
		for _, l := range n.mn.LinksBetweenPeers(k[0], k[1]) {
			l.SetOptions(mocknet.LinkOptions{Latency: lat})
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
	for p := range n.hosts { // open hosts only: mocknet's Peers lists every host it ever had
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
	net       *Net
	cm        *bcm.BasicConnMgr
	nw        *hostNetwork // what Network returns: mocknet's, with its notifiees recorded
	handlers  *handlerTable
	ps        *releasablePeerstore
	done      chan struct{} // closed when the host closes
	closeOnce sync.Once
}

// hostNetwork is a host's mocknet network with a record of the notifiees
// signed up through it, so that Close can take them off: mocknet keeps
// every network it ever made (and so everything they refer to) for as long
// as the mocknet lives.
type hostNetwork struct {
	network.Network
	mu     sync.Mutex
	notifs map[network.Notifiee]struct{}
}

func (w *hostNetwork) Notify(f network.Notifiee) {
	w.mu.Lock()
	w.notifs[f] = struct{}{}
	w.mu.Unlock()
	w.Network.Notify(f)
}

func (w *hostNetwork) StopNotify(f network.Notifiee) {
	w.mu.Lock()
	delete(w.notifs, f)
	w.mu.Unlock()
	w.Network.StopNotify(f)
}

// stopAll takes every recorded notifiee off the network.
func (w *hostNetwork) stopAll() {
	w.mu.Lock()
	fs := make([]network.Notifiee, 0, len(w.notifs))
	for f := range w.notifs {
		fs = append(fs, f)
	}
	clear(w.notifs)
	w.mu.Unlock()
	for _, f := range fs {
		w.Network.StopNotify(f)
	}
}

// markClosed closes h.done once.
func (h *Host) markClosed() { h.closeOnce.Do(func() { close(h.done) }) }

// NewHost adds a host with connection-manager watermarks low and high, the
// network's next key and an address of its own (see NewIP).
func (n *Net) NewHost(low, high int) (*Host, error) {
	return n.NewHostWith(HostOptions{Low: low, High: high})
}

// HostOptions describe a host for NewHostWith.
type HostOptions struct {
	Low, High int // connection-manager watermarks
	// Key is the host's identity; nil takes the network's next key (a
	// function of Config.Seed and the order hosts are added).
	Key crypto.PrivKey
	// IP is the host's address; nil gives it a fresh one (NewIP). Hosts
	// given the same IP share it as hosts behind one address do: each
	// listens on a port of its own.
	IP net.IP
}

// NewIP returns an IPv4 address no host of the network has been given,
// in a /16 of its own: IP-group filters (go-libp2p-kbucket's peerdiversity
// groups IPv4 addresses by /16) see every host apart. Addresses skip the
// private, loopback, shared, link-local and multicast ranges, and the
// legacy /8 blocks that peerdiversity groups whole.
func (n *Net) NewIP() net.IP {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.newIPLocked()
}

func (n *Net) newIPLocked() net.IP {
	for {
		k := n.nextIP
		n.nextIP++
		a := 1 + k/256 // first octet
		if a >= 224 {
			a = 1 + (a-1)%223 // past 57 000 hosts: reuse /16s (never reached by a testnet)
		}
		switch a {
		case 10, 12, 17, 19, 38, 48, 53, 56, 73, 100, 127, 169, 172, 192:
			continue
		}
		return net.IPv4(byte(a), byte(k%256), 0, 1).To4()
	}
}

// NewHostWith adds a host as o describes.
func (n *Net) NewHostWith(o HostOptions) (*Host, error) {
	low, high := o.Low, o.High
	// mocknet's GenPeer makes ECDSA keys; real nodes use Ed25519, whose
	// signatures (every GossipSub message is signed and verified) cost
	// a third as much to check.
	n.mu.Lock()
	sk := o.Key
	var err error
	if sk == nil {
		sk, _, err = crypto.GenerateEd25519Key(n.keys)
	}
	ip := o.IP
	if ip == nil {
		ip = n.newIPLocked()
	}
	port := 4242 + n.ports[ip.String()]
	n.ports[ip.String()]++
	n.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	addr, err := manet.FromNetAddr(&net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	// What mocknet's AddPeer does, with a peerstore the host can let go of.
	mem, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	mem.AddAddr(id, addr, peerstore.PermanentAddrTTL)
	if err := mem.AddPrivKey(id, sk); err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	if err := mem.AddPubKey(id, sk.GetPublic()); err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	ps := newReleasablePeerstore(mem)
	h, err := n.mn.AddPeerWithPeerstore(id, ps)
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	cm, err := bcm.NewConnManager(low, high, bcm.WithGracePeriod(20*time.Second), bcm.WithSilencePeriod(5*time.Second))
	if err != nil {
		_ = h.Close()
		return nil, fmt.Errorf("memnet: %w", err)
	}
	nw := &hostNetwork{Network: h.Network(), notifs: make(map[network.Notifiee]struct{})}
	nw.Notify(cm.Notifee())
	mh := &Host{Host: h, net: n, cm: cm, nw: nw, ps: ps, done: make(chan struct{}),
		handlers: &handlerTable{m: make(map[protocol.ID]network.StreamHandler)}}
	n.mu.Lock()
	n.hosts[id] = mh
	n.mu.Unlock()
	return mh, nil
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
	if err != nil || !h.net.shaped() {
		return s, err
	}
	return h.wrap(s), nil
}

// Network returns the host's network. Notifiees signed up on it are taken
// off when the host closes.
func (h *Host) Network() network.Network { return h.nw }

// ConnManager returns the host's connection manager.
func (h *Host) ConnManager() connmgr.ConnManager { return h.cm }

// Close marks the peer gone and closes it. Its links are removed too: a
// raw dial on the underlying network (the path libp2p's own services take,
// bypassing Connect and NewStream above) would otherwise still reach the
// closed host over an existing link, and the dialler would hold a live-
// looking connection to a dead peer.
func (h *Host) Close() error {
	id := h.ID()
	h.markClosed()
	h.net.mu.Lock()
	h.net.gone[id] = true
	delete(h.net.hosts, id)
	delete(h.net.group, id)
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
	h.net.bwMu.Lock()
	delete(h.net.busy, id)
	h.net.bwMu.Unlock()
	err := h.Host.Close()
	_ = h.cm.Close()
	h.release()
	return err
}

// release lets go of what a closed host's services hang on it. mocknet
// never forgets a host: its maps, and the links that the host's peers
// still name in theirs, keep the host's network and basic host reachable
// for as long as the mocknet lives. Everything else a node hangs on them
// (the stream handlers and notifiees, closures over the whole node: its
// model, routing table, pubsub state; and the peerstore, with every peer
// the host knew, which is dropped whole: emptied, its maps would not
// shrink) is dropped here, so what stays behind per closed host is the
// empty shells.
func (h *Host) release() {
	// The handlers set through this host go with the table (the mux's
	// stand-ins, and any stale copies of them, then find nothing). The
	// mux is emptied too, directly, not through the host's
	// RemoveStreamHandler, which would announce a protocol update; its
	// entries are first replaced with a no-op, which overwrites the stale
	// copy go-multistream's removal leaves behind (see handlerTable).
	h.handlers.clear()
	mux := h.Host.Mux()
	protos := mux.Protocols()
	for _, p := range protos {
		mux.AddHandler(p, releasedHandler)
	}
	for _, p := range protos {
		mux.RemoveHandler(p)
	}
	h.nw.stopAll()
	h.ps.release()
}

// releasedHandler stands in for a closed host's handlers (see release).
func releasedHandler(protocol.ID, io.ReadWriteCloser) error { return nil }

// handlerTable holds a host's stream handlers for the mux, which only
// sees a stand-in that looks the handler up here. go-multistream removes a
// handler by shifting the rest of its slice down, which leaves a copy of
// the last one in the slice's spare capacity, out of sight but reachable
// for as long as the mux is (for a closed host: as long as the mocknet);
// a stand-in pins only this table, which RemoveStreamHandler and release
// empty.
type handlerTable struct {
	mu sync.RWMutex
	m  map[protocol.ID]network.StreamHandler
}

func (t *handlerTable) set(pid protocol.ID, handler network.StreamHandler) {
	t.mu.Lock()
	t.m[pid] = handler
	t.mu.Unlock()
}

func (t *handlerTable) remove(pid protocol.ID) {
	t.mu.Lock()
	delete(t.m, pid)
	t.mu.Unlock()
}

func (t *handlerTable) clear() {
	t.mu.Lock()
	clear(t.m)
	t.mu.Unlock()
}

// standIn is what the mux holds for protocol pid.
func (t *handlerTable) standIn(pid protocol.ID) network.StreamHandler {
	return func(s network.Stream) {
		t.mu.RLock()
		handler := t.m[pid]
		t.mu.RUnlock()
		if handler == nil {
			_ = s.Reset()
			return
		}
		handler(s)
	}
}

// SetStreamHandler registers handler with its streams wrapped like those of
// NewStream (see shapedStream).
func (h *Host) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.handlers.set(pid, h.shape(handler))
	h.Host.SetStreamHandler(pid, h.handlers.standIn(pid))
}

// SetStreamHandlerMatch is SetStreamHandler with a protocol matcher.
func (h *Host) SetStreamHandlerMatch(pid protocol.ID, m func(protocol.ID) bool, handler network.StreamHandler) {
	h.handlers.set(pid, h.shape(handler))
	h.Host.SetStreamHandlerMatch(pid, m, h.handlers.standIn(pid))
}

// RemoveStreamHandler removes the handler of pid.
func (h *Host) RemoveStreamHandler(pid protocol.ID) {
	h.handlers.remove(pid)
	h.Host.RemoveStreamHandler(pid)
}

// shape wraps handler's streams like those of NewStream, if the network
// shapes them.
func (h *Host) shape(handler network.StreamHandler) network.StreamHandler {
	if !h.net.shaped() {
		return handler
	}
	return func(s network.Stream) { handler(h.wrap(s)) }
}

func (h *Host) wrap(s network.Stream) network.Stream {
	c := s.Conn()
	local, remote := c.LocalPeer(), c.RemotePeer()
	return &shapedStream{Stream: s, host: h, local: local, remote: remote, latency: h.net.Latency(local, remote)}
}

// shapedStream holds every write for its share of the hosts' bandwidth,
// and makes the link latency hold for the last write before a close too:
// mocknet delivers everything still in flight at once when a stream is
// closed, so a request-reply exchange (write, close) would otherwise cross
// a slow link in no time.
type shapedStream struct {
	network.Stream
	host          *Host
	local, remote peer.ID
	latency       time.Duration
	mu            sync.Mutex
	last          time.Time
}

func (s *shapedStream) Write(b []byte) (int, error) {
	if err := s.host.net.transmit(s.local, s.remote, len(b), s.host.done); err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.last = time.Now()
	s.mu.Unlock()
	return s.Stream.Write(b)
}

func (s *shapedStream) settle() {
	s.mu.Lock()
	wait := time.Until(s.last.Add(s.latency))
	s.mu.Unlock()
	if wait <= 0 {
		return
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-s.host.done:
	}
}

func (s *shapedStream) CloseWrite() error { s.settle(); return s.Stream.CloseWrite() }
func (s *shapedStream) Close() error      { s.settle(); return s.Stream.Close() }
