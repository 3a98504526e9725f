package overlay

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	pb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-msgio"
	"google.golang.org/protobuf/proto"
)

// rpcSender is the DHT's message sender (dht.WithCustomMessageSender): one
// stream per request, closed as soon as the reply is read.
//
// Why not the library's sender: it keeps one stream open to every peer it
// has ever queried, and the answering peer keeps a goroutine blocked on
// each such stream until it has been idle for a minute. That suits IPFS
// nodes with a few long-lived connections. Here every node walks the whole
// ID space: at 300 nodes in one process, 40 000 idle DHT streams held
// 40 000 handler goroutines (and, on the in-memory transport, 80 000 more
// for the streams themselves) — a third of the testnet's memory. A stream
// per request costs one stream opening, without a round trip: the host
// negotiates the protocol lazily once identify has told it the peer speaks
// it. The wire protocol is unchanged.
type rpcSender struct {
	h       host.Host
	protos  []protocol.ID
	timeout time.Duration // bounds every request (and a context without a deadline)
}

func newRPCSender(h host.Host, protos []protocol.ID, timeout time.Duration) *rpcSender {
	return &rpcSender{h: h, protos: append([]protocol.ID(nil), protos...), timeout: timeout}
}

// maxRPCMessage caps a DHT reply we read (kad-dht's own cap).
const maxRPCMessage = network.MessageSizeMax

// SendRequest sends req to p on a fresh stream and reads one reply.
func (s *rpcSender) SendRequest(ctx context.Context, p peer.ID, req *pb.Message) (*pb.Message, error) {
	st, done, err := s.open(ctx, p, req)
	if err != nil {
		return nil, err
	}
	defer done()
	r := msgio.NewVarintReaderSize(st, maxRPCMessage)
	b, err := r.ReadMsg()
	if err != nil {
		_ = st.Reset()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dht request to %s: %w", p.ShortString(), ctx.Err())
		}
		return nil, fmt.Errorf("dht request to %s: reading reply: %w", p.ShortString(), err)
	}
	resp := new(pb.Message)
	err = proto.Unmarshal(b, resp)
	r.ReleaseMsg(b)
	if err != nil {
		_ = st.Reset()
		return nil, fmt.Errorf("dht request to %s: malformed reply: %w", p.ShortString(), err)
	}
	_ = st.Close()
	return resp, nil
}

// SendMessage sends msg to p on a fresh stream without waiting for a reply.
func (s *rpcSender) SendMessage(ctx context.Context, p peer.ID, msg *pb.Message) error {
	st, done, err := s.open(ctx, p, msg)
	if err != nil {
		return err
	}
	defer done()
	return st.Close()
}

// OnDisconnect is part of pb.MessageSenderWithDisconnect: nothing is held
// per peer, so there is nothing to drop.
func (s *rpcSender) OnDisconnect(context.Context, peer.ID) {}

// open opens a stream to p, writes m on it (varint length prefix, as the
// DHT protocol frames messages) and closes the write side. The stream is
// reset when ctx ends or the sender's timeout passes, whichever is first:
// the in-memory transport ignores stream deadlines, so a deadline alone
// would not bound a read from a peer that never answers. done releases the
// timer; the caller must call it once it has finished with the stream.
func (s *rpcSender) open(ctx context.Context, p peer.ID, m *pb.Message) (network.Stream, func(), error) {
	body, err := proto.Marshal(m)
	if err != nil {
		return nil, nil, fmt.Errorf("dht message: %w", err)
	}
	frame := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen64), uint64(len(body)))
	frame = append(frame, body...)

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	// A request and its reply are a few kilobytes: they run over a relayed
	// (limited) connection rather than wait, up to the timeout, for a
	// direct one that may never come.
	st, err := s.h.NewStream(network.WithAllowLimitedConn(ctx, "dht"), p, s.protos...)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("dht stream to %s: %w", p.ShortString(), err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = st.Reset() })
	done := func() { stop(); cancel() }
	if _, err := st.Write(frame); err != nil {
		_ = st.Reset()
		done()
		return nil, nil, fmt.Errorf("dht request to %s: %w", p.ShortString(), err)
	}
	if err := st.CloseWrite(); err != nil {
		_ = st.Reset()
		done()
		return nil, nil, fmt.Errorf("dht request to %s: %w", p.ShortString(), err)
	}
	return st, done, nil
}
