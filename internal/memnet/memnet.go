package memnet

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	bhost "github.com/libp2p/go-libp2p/p2p/host/basic"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	bcm "github.com/libp2p/go-libp2p/p2p/net/connmgr"
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
	cfg Config

	mu     sync.Mutex
	keys   io.Reader       // host keys, guarded by mu
	group  map[peer.ID]int // partition group; peers in different groups cannot talk
	cut    bool
	hosts  map[peer.ID]*Host // open hosts, closed with the network
	nextIP int               // NewIP's counter
	ports  map[string]int    // hosts given each IP so far

	connID, streamID atomic.Int64
	alarms           alarms // the streams' deadlines and arrival times

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
		cfg:   cfg,
		keys:  keys,
		group: make(map[peer.ID]int),
		hosts: make(map[peer.ID]*Host),
		ports: make(map[string]int),
		busy:  make(map[peer.ID]*pipes),
	}
}

// Latency returns the one-way latency of the link between a and b.
func (n *Net) Latency(a, b peer.ID) time.Duration {
	lo, hi := n.cfg.LatencyMin, n.cfg.LatencyMax
	if hi <= lo {
		return lo
	}
	if a > b { // the same for both directions
		a, b = b, a
	}
	h := fnv.New64a()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], n.cfg.Seed)
	h.Write(seed[:])
	h.Write([]byte(a))
	h.Write([]byte(b))
	u := float64(h.Sum64()>>11) / (1 << 53) // uniform in [0, 1)
	return lo + time.Duration(u*float64(hi-lo))
}

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

// Close closes every host of the network.
func (n *Net) Close() error {
	n.mu.Lock()
	hosts := make([]*Host, 0, len(n.hosts))
	for _, h := range n.hosts {
		hosts = append(hosts, h)
	}
	n.mu.Unlock()
	var first error
	for _, h := range hosts {
		if err := h.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// reach returns b's network if a may connect to it: b is an open host and
// no partition lies between them.
func (n *Net) reach(a, b peer.ID) (*peerNet, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.hosts[b]
	if h == nil || n.hosts[a] == nil || (n.cut && n.group[a] != n.group[b]) {
		return nil, ErrUnreachable
	}
	return h.pn, nil
}

// Partition splits the network: from now on peers of different groups
// (group numbers assigned by fn; peers fn does not know are group 0) cannot
// reach each other, and their existing connections are closed.
func (n *Net) Partition(fn func(peer.ID) int) {
	n.mu.Lock()
	n.cut = true
	hosts := make([]*Host, 0, len(n.hosts))
	for p, h := range n.hosts {
		n.group[p] = fn(p)
		hosts = append(hosts, h)
	}
	group := maps.Clone(n.group)
	n.mu.Unlock()
	for _, h := range hosts {
		for _, c := range h.pn.allConns() {
			if group[c.local] != group[c.remote] {
				_ = c.Close()
			}
		}
	}
}

// Heal ends a partition.
func (n *Net) Heal() {
	n.mu.Lock()
	n.cut = false
	n.mu.Unlock()
}

// Host is a libp2p host (go-libp2p's basic host, with its identify
// service and protocol negotiation) on a network of memnet's own, with a
// connection manager.
type Host struct {
	host.Host
	net *Net
	pn  *peerNet
	cm  *bcm.BasicConnMgr
}

// NewHost adds a host with connection-manager watermarks low and high, the
// network's next key and an address of its own (see NewIP).
func (n *Net) NewHost(low, high int) (*Host, error) {
	return n.NewHostWith(HostOptions{Low: low, High: high})
}

// HostOptions describe a host for NewHostWith.
type HostOptions struct {
	Low, High int // connection-manager watermarks
	// Grace is how long the connection manager leaves a new connection
	// untrimmed (0: 20 s). Every connection younger than it is held on top
	// of High.
	Grace time.Duration
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
	low, high, grace := o.Low, o.High, o.Grace
	if grace <= 0 {
		grace = 20 * time.Second
	}
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
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	ps.AddAddr(id, addr, peerstore.PermanentAddrTTL)
	if err := ps.AddPrivKey(id, sk); err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	if err := ps.AddPubKey(id, sk.GetPublic()); err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	bus := eventbus.NewBus()
	emitter, err := bus.Emitter(&event.EvtPeerConnectednessChanged{})
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	pn := &peerNet{net: n, id: id, pub: sk.GetPublic(), addr: addr, ps: ps, emitter: emitter,
		done: make(chan struct{}), conns: make(map[peer.ID][]*conn), notifs: make(map[network.Notifiee]struct{})}
	cm, err := bcm.NewConnManager(low, high, bcm.WithGracePeriod(grace), bcm.WithSilencePeriod(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("memnet: %w", err)
	}
	// As mocknet builds its hosts, with a connection manager.
	bh, err := bhost.NewHost(pn, &bhost.HostOpts{
		NegotiationTimeout:      -1,
		DisableSignedPeerRecord: true,
		EventBus:                bus,
		ConnManager:             cm,
	})
	if err != nil {
		_ = cm.Close()
		return nil, fmt.Errorf("memnet: %w", err)
	}
	bh.Start()
	h := &Host{Host: bh, net: n, pn: pn, cm: cm}
	n.mu.Lock()
	n.hosts[id] = h
	n.mu.Unlock()
	return h, nil
}

// ConnManager returns the host's connection manager.
func (h *Host) ConnManager() connmgr.ConnManager { return h.cm }

// Close takes the host off the network (it can no longer be dialled) and
// closes it: its connections, streams and services. Once the node's own
// goroutines have ended, nothing refers to the host any more: unlike
// go-libp2p's mocknet, which keeps every host it made for as long as it
// lives, the Net forgets it, and a closed connection lets go of the host
// at its other end.
func (h *Host) Close() error {
	id := h.ID()
	h.net.mu.Lock()
	delete(h.net.hosts, id)
	delete(h.net.group, id)
	h.net.mu.Unlock()
	h.net.bwMu.Lock()
	delete(h.net.busy, id)
	h.net.bwMu.Unlock()
	h.pn.markClosed()
	return h.Host.Close()
}
