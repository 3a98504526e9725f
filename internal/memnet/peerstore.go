package memnet

import (
	"context"
	"sync/atomic"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/record"
	ma "github.com/multiformats/go-multiaddr"
)

// releasablePeerstore is a host's peerstore that the host can let go of
// when it closes. mocknet keeps every host's network, and so its
// peerstore, for as long as it lives; an in-memory peerstore emptied peer
// by peer still holds its maps (Go maps do not shrink: about 80 kB for one
// that knew 200 peers, 25 kB empty). After release the store is dropped:
// reads find nothing and writes are ignored. Until then every call goes to
// the store as it is, so a live host behaves exactly as with the store
// itself, signed peer records included.
type releasablePeerstore struct {
	ps atomic.Pointer[pstoreBox]
}

type pstoreBox struct {
	peerstore.Peerstore
	cab peerstore.CertifiedAddrBook // nil if the store has none
}

var (
	_ peerstore.Peerstore         = (*releasablePeerstore)(nil)
	_ peerstore.CertifiedAddrBook = (*releasablePeerstore)(nil)
)

func newReleasablePeerstore(ps peerstore.Peerstore) *releasablePeerstore {
	cab, _ := peerstore.GetCertifiedAddrBook(ps)
	r := &releasablePeerstore{}
	r.ps.Store(&pstoreBox{Peerstore: ps, cab: cab})
	return r
}

// release drops the store (closing it first).
func (r *releasablePeerstore) release() {
	if b := r.ps.Swap(nil); b != nil {
		_ = b.Close()
	}
}

func (r *releasablePeerstore) get() *pstoreBox { return r.ps.Load() }

func (r *releasablePeerstore) Close() error {
	if b := r.get(); b != nil {
		return b.Close()
	}
	return nil
}

func (r *releasablePeerstore) AddAddr(p peer.ID, addr ma.Multiaddr, ttl time.Duration) {
	if b := r.get(); b != nil {
		b.AddAddr(p, addr, ttl)
	}
}

func (r *releasablePeerstore) AddAddrs(p peer.ID, addrs []ma.Multiaddr, ttl time.Duration) {
	if b := r.get(); b != nil {
		b.AddAddrs(p, addrs, ttl)
	}
}

func (r *releasablePeerstore) SetAddr(p peer.ID, addr ma.Multiaddr, ttl time.Duration) {
	if b := r.get(); b != nil {
		b.SetAddr(p, addr, ttl)
	}
}

func (r *releasablePeerstore) SetAddrs(p peer.ID, addrs []ma.Multiaddr, ttl time.Duration) {
	if b := r.get(); b != nil {
		b.SetAddrs(p, addrs, ttl)
	}
}

func (r *releasablePeerstore) UpdateAddrs(p peer.ID, oldTTL, newTTL time.Duration) {
	if b := r.get(); b != nil {
		b.UpdateAddrs(p, oldTTL, newTTL)
	}
}

func (r *releasablePeerstore) Addrs(p peer.ID) []ma.Multiaddr {
	if b := r.get(); b != nil {
		return b.Addrs(p)
	}
	return nil
}

func (r *releasablePeerstore) AddrStream(ctx context.Context, p peer.ID) <-chan ma.Multiaddr {
	if b := r.get(); b != nil {
		return b.AddrStream(ctx, p)
	}
	ch := make(chan ma.Multiaddr)
	close(ch)
	return ch
}

func (r *releasablePeerstore) ClearAddrs(p peer.ID) {
	if b := r.get(); b != nil {
		b.ClearAddrs(p)
	}
}

func (r *releasablePeerstore) PeersWithAddrs() peer.IDSlice {
	if b := r.get(); b != nil {
		return b.PeersWithAddrs()
	}
	return nil
}

func (r *releasablePeerstore) ConsumePeerRecord(s *record.Envelope, ttl time.Duration) (bool, error) {
	if b := r.get(); b != nil && b.cab != nil {
		return b.cab.ConsumePeerRecord(s, ttl)
	}
	return false, nil
}

func (r *releasablePeerstore) GetPeerRecord(p peer.ID) *record.Envelope {
	if b := r.get(); b != nil && b.cab != nil {
		return b.cab.GetPeerRecord(p)
	}
	return nil
}

func (r *releasablePeerstore) PubKey(p peer.ID) ic.PubKey {
	if b := r.get(); b != nil {
		return b.PubKey(p)
	}
	return nil
}

func (r *releasablePeerstore) AddPubKey(p peer.ID, k ic.PubKey) error {
	if b := r.get(); b != nil {
		return b.AddPubKey(p, k)
	}
	return nil
}

func (r *releasablePeerstore) PrivKey(p peer.ID) ic.PrivKey {
	if b := r.get(); b != nil {
		return b.PrivKey(p)
	}
	return nil
}

func (r *releasablePeerstore) AddPrivKey(p peer.ID, k ic.PrivKey) error {
	if b := r.get(); b != nil {
		return b.AddPrivKey(p, k)
	}
	return nil
}

func (r *releasablePeerstore) PeersWithKeys() peer.IDSlice {
	if b := r.get(); b != nil {
		return b.PeersWithKeys()
	}
	return nil
}

func (r *releasablePeerstore) Get(p peer.ID, key string) (any, error) {
	if b := r.get(); b != nil {
		return b.Get(p, key)
	}
	return nil, peerstore.ErrNotFound
}

func (r *releasablePeerstore) Put(p peer.ID, key string, val any) error {
	if b := r.get(); b != nil {
		return b.Put(p, key, val)
	}
	return nil
}

func (r *releasablePeerstore) RecordLatency(p peer.ID, d time.Duration) {
	if b := r.get(); b != nil {
		b.RecordLatency(p, d)
	}
}

func (r *releasablePeerstore) LatencyEWMA(p peer.ID) time.Duration {
	if b := r.get(); b != nil {
		return b.LatencyEWMA(p)
	}
	return 0
}

func (r *releasablePeerstore) GetProtocols(p peer.ID) ([]protocol.ID, error) {
	if b := r.get(); b != nil {
		return b.GetProtocols(p)
	}
	return nil, nil
}

func (r *releasablePeerstore) AddProtocols(p peer.ID, ps ...protocol.ID) error {
	if b := r.get(); b != nil {
		return b.AddProtocols(p, ps...)
	}
	return nil
}

func (r *releasablePeerstore) SetProtocols(p peer.ID, ps ...protocol.ID) error {
	if b := r.get(); b != nil {
		return b.SetProtocols(p, ps...)
	}
	return nil
}

func (r *releasablePeerstore) RemoveProtocols(p peer.ID, ps ...protocol.ID) error {
	if b := r.get(); b != nil {
		return b.RemoveProtocols(p, ps...)
	}
	return nil
}

func (r *releasablePeerstore) SupportsProtocols(p peer.ID, ps ...protocol.ID) ([]protocol.ID, error) {
	if b := r.get(); b != nil {
		return b.SupportsProtocols(p, ps...)
	}
	return nil, nil
}

func (r *releasablePeerstore) FirstSupportedProtocol(p peer.ID, ps ...protocol.ID) (protocol.ID, error) {
	if b := r.get(); b != nil {
		return b.FirstSupportedProtocol(p, ps...)
	}
	return "", nil
}

func (r *releasablePeerstore) PeerInfo(p peer.ID) peer.AddrInfo {
	if b := r.get(); b != nil {
		return b.PeerInfo(p)
	}
	return peer.AddrInfo{ID: p}
}

func (r *releasablePeerstore) Peers() peer.IDSlice {
	if b := r.get(); b != nil {
		return b.Peers()
	}
	return nil
}

func (r *releasablePeerstore) RemovePeer(p peer.ID) {
	if b := r.get(); b != nil {
		b.RemovePeer(p)
	}
}
