package overlay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ipnet "github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/net/pnet"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	ma "github.com/multiformats/go-multiaddr"
	mss "github.com/multiformats/go-multistream"
)

// Starting from an address. A bootstrap peer may be named by its TCP
// address alone, "host:port" (or a multiaddr without /p2p/<id>), as every
// rank of a torch DDP job is started with MASTER_ADDR:MASTER_PORT: no peer
// ID learnt in advance. libp2p secures a connection against the peer ID
// the dialler expects, so the overlay learns it first, at every join
// attempt, by a pre-handshake: a TCP connection to the address, the
// private network's key when the job has one (pnet), and a Noise handshake
// that does not check the responder's ID. The responder proves that it
// holds the private key of the ID it presents (Noise's signed static key);
// the overlay then dials that ID at that address through its host, as it
// dials any bootstrap peer, and closes the probe.
//
// Why a pre-handshake rather than an identity derived from the job's name
// (or secret) and the address: the node at the address keeps its own
// identity (--identity, its peers file, its lineage history), nothing
// but that node holds its private key, and the address's node may be any
// node of the job, restarted or replaced. A derived key would be known to
// everyone who knows the job's name: anyone could run that peer ID
// anywhere, at any time, not only answer at the address.
//
// What it proves, and what it does not. With a swarm key, only a holder of
// the key completes the pre-handshake (the bytes are encrypted with it
// before anything else is said, and a wrong key garbles the multistream
// header): the ID learnt is a key holder's. Without one, the ID is whoever
// answers at the address when the node asks (trust on first use, as torch
// DDP's TCPStore trusts whoever listens at MASTER_ADDR): anyone on the path,
// or who takes the address, can present an ID of their own. A liar at the
// address then gets one voice among the node's bootstrap peers; what one
// peer (or a few) claims does not move a job on its own (lineages by
// history, the population's weighted median, the join's two-peer
// agreement), so it can keep a new node off the job, not take the job.
// Use a swarm key where the network is not trusted.

// noiseID is the security protocol the pre-handshake selects.
const noiseID = "/noise"

// probeHandshake bounds the pre-handshake once the TCP connection is up.
const probeHandshake = 5 * time.Second

// IsRendezvous reports whether a bootstrap address names a peer by its
// address alone: "host:port", or a multiaddr without /p2p/<id>.
func IsRendezvous(s string) bool {
	if !strings.HasPrefix(s, "/") {
		return true
	}
	a, err := ma.NewMultiaddr(s)
	if err != nil {
		return false
	}
	_, err = a.ValueForProtocol(ma.P_P2P)
	return err != nil
}

// ParseRendezvous parses a bootstrap address given without a peer ID:
// "host:port" (an IPv4 or IPv6 address, "[::1]:port", or a DNS name) or a
// multiaddr /ip4|/ip6|/dns|/dns4|/dns6/HOST/tcp/PORT. It returns the TCP
// multiaddr the pre-handshake dials.
func ParseRendezvous(s string) (ma.Multiaddr, error) {
	if strings.HasPrefix(s, "/") {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
		}
		if len(a) != 2 || a[1].Code() != ma.P_TCP {
			return nil, fmt.Errorf("bootstrap address %q: without /p2p/<peer id> a bootstrap address is HOST:PORT or /ip4|/ip6|/dns|/dns4|/dns6/HOST/tcp/PORT (its peer ID is learnt by a handshake over TCP)", s)
		}
		switch a[0].Code() {
		case ma.P_IP4, ma.P_IP6, ma.P_DNS, ma.P_DNS4, ma.P_DNS6:
			return a, nil
		}
		return nil, fmt.Errorf("bootstrap address %q: want /ip4, /ip6, /dns, /dns4 or /dns6 before /tcp", s)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("bootstrap address %q: want HOST:PORT (e.g. 10.0.0.5:29500, [::1]:29500, node0.lan:29500) or a multiaddr ending in /p2p/<peer id>: %w", s, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil, fmt.Errorf("bootstrap address %q: port %q: want 1 to 65535", s, port)
	}
	if host == "" {
		return nil, fmt.Errorf("bootstrap address %q: no host: want HOST:PORT, e.g. 10.0.0.5:%d", s, p)
	}
	proto := "dns"
	if ip := net.ParseIP(host); ip != nil {
		proto = "ip6"
		if ip.To4() != nil {
			proto, host = "ip4", ip.To4().String()
		}
	}
	a, err := ma.NewMultiaddr(fmt.Sprintf("/%s/%s/tcp/%d", proto, host, p))
	if err != nil {
		return nil, fmt.Errorf("bootstrap address %q: %w", s, err)
	}
	return a, nil
}

// ErrNoPeerAtAddress is wrapped by ProbePeerID's error when nothing
// completed the pre-handshake at the address: refused, unreachable, timed
// out, or something that is not a libp2p node of the job (another swarm
// key, none, or another program).
var ErrNoPeerAtAddress = errors.New("no libp2p peer answered at the address")

// ProbePeerID learns the peer ID of the node listening at addr (a TCP
// multiaddr from ParseRendezvous) by the pre-handshake described at the top
// of this file, as key (this node's identity, which the remote sees), with
// the job's swarm key psk (nil for an open job). It closes the probe
// connection before returning.
func ProbePeerID(ctx context.Context, key crypto.PrivKey, psk ipnet.PSK, addr ma.Multiaddr) (peer.ID, error) {
	hostport, err := dialTarget(addr)
	if err != nil {
		return "", err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return "", fmt.Errorf("%w (%s): %v", ErrNoPeerAtAddress, hostport, err)
	}
	defer raw.Close()
	// What answers has probeHandshake to complete the handshake: a node
	// of the job does so within round trips, while one of another swarm
	// key reads garbage and may wait for more of it until the deadline.
	dl := time.Now().Add(probeHandshake)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = raw.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn := raw
	if len(psk) > 0 {
		if conn, err = pnet.NewProtectedConn(psk, raw); err != nil {
			return "", fmt.Errorf("pre-handshake with %s: %w", hostport, err)
		}
	}
	if err := mss.SelectProtoOrFail(noiseID, conn); err != nil {
		why := "it is not a libp2p node speaking Noise over TCP"
		if len(psk) > 0 {
			why = "it holds another swarm key or none, or is not a libp2p node"
		}
		return "", fmt.Errorf("%w (%s): %s: %v", ErrNoPeerAtAddress, hostport, why, err)
	}
	tpt, err := noise.New(noiseID, key, nil)
	if err != nil {
		return "", fmt.Errorf("pre-handshake: %w", err)
	}
	st, err := tpt.WithSessionOptions(noise.DisablePeerIDCheck())
	if err != nil {
		return "", fmt.Errorf("pre-handshake: %w", err)
	}
	sc, err := st.SecureOutbound(ctx, conn, "")
	if err != nil {
		return "", fmt.Errorf("%w (%s): its Noise handshake failed: %v", ErrNoPeerAtAddress, hostport, err)
	}
	id := sc.RemotePeer()
	_ = sc.Close()
	return id, nil
}

// dialTarget is the host:port net.Dial takes for a rendezvous multiaddr.
func dialTarget(addr ma.Multiaddr) (string, error) {
	if len(addr) != 2 || addr[1].Code() != ma.P_TCP {
		return "", fmt.Errorf("rendezvous address %s: want HOST/tcp/PORT", addr)
	}
	return net.JoinHostPort(addr[0].Value(), addr[1].Value()), nil
}

// rendezvousSet is an overlay's bootstrap peers known by address alone,
// and the peer each address last answered with.
type rendezvousSet struct {
	mu    sync.Mutex
	addrs []ma.Multiaddr  // not this node's
	peers []peer.AddrInfo // learnt, one per address that answered
}

// pending reports whether some bootstrap address may be another node's.
func (r *rendezvousSet) pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.addrs) > 0
}

// learnt is the peers the addresses answered with so far.
func (r *rendezvousSet) learnt() []peer.AddrInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.peers)
}

// dropOwn removes the addresses the host listens on: a node given its own
// address starts the job, as one given its own /p2p address does.
func (o *Overlay) dropOwnRendezvous() {
	own := o.h.Network().InterfaceListenAddresses
	have, err := own()
	if err != nil {
		return
	}
	r := &o.rv
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = slices.DeleteFunc(r.addrs, func(a ma.Multiaddr) bool {
		return slices.ContainsFunc(have, a.Equal)
	})
}

// resolveRendezvous learns the peer at every bootstrap address by the
// pre-handshake, in parallel, within ctx. It returns the peers that
// answered (this node left out: an address that answers with this node's
// own ID is its own and is dropped for good) and why the others did not.
func (o *Overlay) resolveRendezvous(ctx context.Context) ([]peer.AddrInfo, []error) {
	o.rv.mu.Lock()
	addrs := slices.Clone(o.rv.addrs)
	o.rv.mu.Unlock()
	if len(addrs) == 0 {
		return nil, nil
	}
	key := o.h.Peerstore().PrivKey(o.h.ID())
	if key == nil {
		return nil, []error{errors.New("pre-handshake: the host's private key is not in its peerstore")}
	}
	ids := make([]peer.ID, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { ids[i], errs[i] = ProbePeerID(ctx, key, o.cfg.PSK, a) })
	}
	wg.Wait()
	var found []peer.AddrInfo
	var why []error
	o.rv.mu.Lock()
	defer o.rv.mu.Unlock()
	for i, a := range addrs {
		switch {
		case errs[i] != nil:
			why = append(why, errs[i])
		case ids[i] == o.h.ID():
			o.log.Info("a bootstrap address is this node's own: it starts the job unless others answer", "addr", a)
			o.rv.addrs = slices.DeleteFunc(o.rv.addrs, a.Equal)
		default:
			ai := peer.AddrInfo{ID: ids[i], Addrs: []ma.Multiaddr{a}}
			found = append(found, ai)
			at := slices.IndexFunc(o.rv.peers, func(p peer.AddrInfo) bool { return p.Addrs[0].Equal(a) })
			switch {
			case at < 0:
				o.log.Info("learnt the peer at a bootstrap address", "addr", a, "peer", ai.ID)
				o.rv.peers = append(o.rv.peers, ai)
			case o.rv.peers[at].ID != ai.ID:
				o.log.Info("another peer answers at a bootstrap address now", "addr", a, "peer", ai.ID, "was", o.rv.peers[at].ID)
				o.rv.peers[at] = ai
			}
		}
	}
	return found, why
}

// Joining reports whether the overlay joins through bootstrap peers
// (configured, remembered from the last run, or named by an address that
// is not this node's); one that does not starts the job.
func (o *Overlay) Joining() bool { return len(o.bootstrap) > 0 || o.rv.pending() }
