package hostile

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-msgio"
	ma "github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/pspnode/pspnode/node"
)

// FakePeersPerReply is how many made-up peers a fake-peers node names in
// each DHT reply: more than the 2k = 40 an honest reply may carry, which
// is all a receiver reads of one reply.
const FakePeersPerReply = 100

// fakeDHT is a fake-peers node's DHT server: the replies, and how many
// made-up peers it has named.
type fakeDHT struct {
	mu    sync.Mutex
	rng   *rand.Rand
	named int
}

// serveFakePeers replaces nd's DHT stream handler with the fake one (the
// node's own lookups still go out through its overlay).
func (p *Play) serveFakePeers(nd *node.Node, seed uint64) {
	f := &fakeDHT{rng: rand.New(rand.NewPCG(seed, 0xfa6e))}
	p.fakesMu.Lock()
	p.fakes = append(p.fakes, f)
	p.fakesMu.Unlock()
	nd.Host().SetStreamHandler(nd.Overlay().Protocol(), func(s network.Stream) {
		serveDHT(s, func(peer.ID, []byte) []*pb.Message_Peer { return f.madeUp(FakePeersPerReply) })
	})
}

// fakeStreamTimeout bounds one fake DHT stream (the honest askers close
// theirs after one reply).
const fakeStreamTimeout = 10 * time.Second

// serveDHT answers each DHT request on s with the closer peers closer
// gives for its asker and key, and nothing else.
func serveDHT(s network.Stream, closer func(from peer.ID, key []byte) []*pb.Message_Peer) {
	from := s.Conn().RemotePeer()
	defer func() { _ = s.Close() }()
	_ = s.SetDeadline(time.Now().Add(fakeStreamTimeout))
	stop := time.AfterFunc(fakeStreamTimeout, func() { _ = s.Reset() })
	defer stop.Stop()
	r := msgio.NewVarintReaderSize(s, network.MessageSizeMax)
	for {
		b, err := r.ReadMsg()
		if err != nil {
			if err != io.EOF {
				_ = s.Reset()
			}
			return
		}
		var req pb.Message
		err = proto.Unmarshal(b, &req)
		r.ReleaseMsg(b)
		if err != nil {
			_ = s.Reset()
			return
		}
		resp := pb.NewMessage(req.GetType(), req.GetKey(), 0)
		resp.CloserPeers = closer(from, req.GetKey())
		body, err := proto.Marshal(resp)
		if err != nil {
			_ = s.Reset()
			return
		}
		frame := binary.AppendUvarint(nil, uint64(len(body)))
		if _, err := s.Write(append(frame, body...)); err != nil {
			_ = s.Reset()
			return
		}
	}
}

// madeUp returns n peers that do not exist: IDs of random Ed25519 public
// keys (nobody holds the private key), each with a TCP address in a range
// no testnet node uses.
func (f *fakeDHT) madeUp(n int) []*pb.Message_Peer {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*pb.Message_Peer, 0, n)
	var raw [32]byte
	for range n {
		for i := range 4 {
			binary.LittleEndian.PutUint64(raw[8*i:], f.rng.Uint64())
		}
		pk, err := crypto.UnmarshalEd25519PublicKey(raw[:])
		if err != nil {
			continue
		}
		id, err := peer.IDFromPublicKey(pk)
		if err != nil {
			continue
		}
		addr, err := ma.NewMultiaddr("/ip4/198.18." + strconv.Itoa(int(raw[0])) + "." + strconv.Itoa(int(raw[1])) + "/tcp/4001")
		if err != nil {
			continue
		}
		out = append(out, &pb.Message_Peer{Id: []byte(id), Addrs: [][]byte{addr.Bytes()}})
	}
	f.named += len(out)
	return out
}

// fakesNamed is how many made-up peers the fake-peers nodes have named.
func (p *Play) fakesNamed() int {
	p.fakesMu.Lock()
	defer p.fakesMu.Unlock()
	n := 0
	for _, f := range p.fakes {
		f.mu.Lock()
		n += f.named
		f.mu.Unlock()
	}
	return n
}
