package overlay

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/pspnode/pspnode/internal/wire"
)

// Pool announcements: /psp/<job>/pool/1.0.0.
//
// Every node keeps a pool of PoolSize peers, a uniform random subset of the
// peers it knows, connected and verified (sampler.go). A node tells a peer
// when it takes it into its pool (join) and when it lets it go (leave); the
// peer protects the connection while a pool holds it (so that neither end's
// connection manager trims a connection whose closing is how departures
// are seen), counts the pools that hold it (its in-degree, Status.InDegree)
// and answers each join with that count. The join doubles as the liveness
// probe that admits a peer to the pool, and it is repeated every
// DegreeRefresh to renew the hold.
//
// Sample draws from every drawable peer with equal weights (sampler.go),
// so the in-degree weighs nothing: it is counted, reported in Status and
// sent in the reply, for monitoring.
//
// Wire format (frames as in the node's protocols: a uvarint length, then the
// body; a body starts with a version byte; integers big-endian):
//
//	request: version u8 | op u8 (1 join, 2 leave) | seq u64
//	reply to a join: version u8 | flags u8 (0) | in-degree u32
//
// A leave has no reply. seq grows with every request a node sends: requests
// to one peer go out on several probe workers and can arrive out of order (a
// join overtaking the leave sent before it), so the receiver applies a
// request only if its seq is above the last it applied from that peer. A
// peer that holds us drops us when our connection closes, so a lost leave
// costs at most a connection's lifetime or 3 × DegreeRefresh, whichever ends
// first.

const (
	poolVersion   = 1
	poolOpJoin    = 1
	poolOpLeave   = 2
	poolRequestLn = 10
	poolReplyLen  = 6
	maxPoolFrame  = 16
	// inTag protects connections of peers whose pools hold us: their
	// departure must show at once, and trimming the connection would only
	// make the peer dial and join again.
	inTag = "psp-overlay-in"
)

// ErrPoolWire is wrapped by every decoding error of the pool protocol.
var ErrPoolWire = errors.New("overlay: malformed pool message")

func poolProtocol(job string) protocol.ID { return wire.PoolProtocol(job) }

func encodePoolRequest(op byte, seq uint64) []byte {
	return frame(binary.BigEndian.AppendUint64([]byte{poolVersion, op}, seq))
}

func encodePoolReply(inDegree int) []byte {
	b := make([]byte, poolReplyLen)
	b[0] = poolVersion
	binary.BigEndian.PutUint32(b[2:], uint32(min(max(inDegree, 0), math.MaxUint32)))
	return frame(b)
}

func frame(body []byte) []byte {
	return append(binary.AppendUvarint(make([]byte, 0, len(body)+1), uint64(len(body))), body...)
}

// readPoolFrame reads one frame of at most maxPoolFrame bytes.
func readPoolFrame(r io.Reader) ([]byte, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, maxPoolFrame+binary.MaxVarintLen64), maxPoolFrame+binary.MaxVarintLen64)
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, fmt.Errorf("%w: length: %w", ErrPoolWire, err)
	}
	if n > maxPoolFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes exceeds the cap of %d", ErrPoolWire, n, maxPoolFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrPoolWire, err)
	}
	return b, nil
}

// decodePoolRequest returns the op and sequence number of a request body.
func decodePoolRequest(b []byte) (op byte, seq uint64, err error) {
	if len(b) != poolRequestLn {
		return 0, 0, fmt.Errorf("%w: request of %d bytes, want %d", ErrPoolWire, len(b), poolRequestLn)
	}
	if b[0] != poolVersion {
		return 0, 0, fmt.Errorf("%w: version %d, want %d", ErrPoolWire, b[0], poolVersion)
	}
	if b[1] != poolOpJoin && b[1] != poolOpLeave {
		return 0, 0, fmt.Errorf("%w: unknown op %d", ErrPoolWire, b[1])
	}
	return b[1], binary.BigEndian.Uint64(b[2:]), nil
}

// decodePoolReply returns the in-degree of a reply body.
func decodePoolReply(b []byte) (int, error) {
	if len(b) != poolReplyLen {
		return 0, fmt.Errorf("%w: reply of %d bytes, want %d", ErrPoolWire, len(b), poolReplyLen)
	}
	if b[0] != poolVersion {
		return 0, fmt.Errorf("%w: version %d, want %d", ErrPoolWire, b[0], poolVersion)
	}
	return int(binary.BigEndian.Uint32(b[2:])), nil
}

// handlePool answers a join (counting the peer's pool as holding us and
// replying with our in-degree) or records a leave. A malformed request is
// counted and its stream reset.
func (o *Overlay) handlePool(s network.Stream) {
	ctx, cancel := context.WithTimeout(o.ctx, o.cfg.ProbeTimeout)
	defer cancel()
	defer context.AfterFunc(ctx, func() { _ = s.Reset() })()
	_ = s.SetDeadline(time.Now().Add(o.cfg.ProbeTimeout))
	b, err := readPoolFrame(s)
	var op byte
	var seq uint64
	if err == nil {
		op, seq, err = decodePoolRequest(b)
	}
	if err != nil {
		o.mu.Lock()
		o.malformed++
		o.mu.Unlock()
		o.log.Debug("pool request refused", "from", s.Conn().RemotePeer().ShortString(), "err", err)
		_ = s.Reset()
		return
	}
	from := s.Conn().RemotePeer()
	now := time.Now()
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		_ = s.Reset()
		return
	}
	if op == poolOpJoin {
		o.touchLocked(from, true, now)
	}
	if in, seen := o.inPool[from]; !seen || seq > in.seq { // else an older request overtaken by a newer one
		if op == poolOpJoin && (!seen || !in.holds) {
			o.h.ConnManager().Protect(from, inTag)
			o.inDegree++
		}
		if op == poolOpLeave && seen && in.holds {
			o.h.ConnManager().Unprotect(from, inTag)
			o.inDegree--
		}
		o.inPool[from] = inPoolEntry{holds: op == poolOpJoin, seq: seq, at: now}
	}
	d := o.inDegree
	o.mu.Unlock()
	if op == poolOpJoin {
		if _, err := s.Write(encodePoolReply(d)); err != nil {
			_ = s.Reset()
			return
		}
	}
	_ = s.Close()
}

// inPoolEntry is the last pool request applied from a peer.
type inPoolEntry struct {
	holds bool      // its pool holds us
	seq   uint64    // the request's sequence number
	at    time.Time // when it was applied
}

// dropInLocked forgets p's pool requests: its pool no longer holds us.
func (o *Overlay) dropInLocked(p peer.ID) {
	if in, ok := o.inPool[p]; ok {
		delete(o.inPool, p)
		if in.holds {
			o.h.ConnManager().Unprotect(p, inTag)
			o.inDegree--
		}
	}
}

// errNoPoolProtocol is returned by join when the peer is reachable but does
// not speak the pool protocol: it is alive, its in-degree unknown.
var errNoPoolProtocol = errors.New("overlay: peer does not speak the pool protocol")

// join tells p that our pool holds it and returns p's in-degree. It dials p
// if need be, so success is also first-hand evidence that p is alive.
func (o *Overlay) join(p peer.ID, seq uint64) (int, error) {
	b, err := o.poolRequest(p, poolOpJoin, seq)
	if err != nil {
		if o.connected(p) {
			if ps, perr := o.h.Peerstore().SupportsProtocols(p, o.poolProto); perr == nil && len(ps) == 0 {
				if ps, _ := o.h.Peerstore().SupportsProtocols(p, o.proto); len(ps) > 0 {
					return 0, errNoPoolProtocol
				}
			}
		}
		return 0, err
	}
	return decodePoolReply(b)
}

// leave tells p that our pool no longer holds it (best effort).
func (o *Overlay) leave(p peer.ID, seq uint64) {
	if !o.connected(p) {
		return // p dropped us when the connection closed
	}
	if _, err := o.poolRequest(p, poolOpLeave, seq); err != nil {
		o.log.Debug("pool leave", "peer", p.ShortString(), "err", err)
	}
}

// poolRequest sends one request to p and, for a join, reads the reply body.
func (o *Overlay) poolRequest(p peer.ID, op byte, seq uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(o.ctx, o.cfg.ProbeTimeout)
	defer cancel()
	// A pool request is a few bytes each way: it runs over a relayed
	// (limited) connection, rather than wait for a direct one that may
	// never come (two peers behind NATs whose hole punch failed) and then
	// mark a live peer dead.
	s, err := o.h.NewStream(network.WithAllowLimitedConn(ctx, "pool"), p, o.poolProto)
	if err != nil {
		return nil, err
	}
	defer context.AfterFunc(ctx, func() { _ = s.Reset() })()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if _, err := s.Write(encodePoolRequest(op, seq)); err != nil {
		_ = s.Reset()
		return nil, err
	}
	if op != poolOpJoin {
		return nil, s.Close()
	}
	if err := s.CloseWrite(); err != nil {
		_ = s.Reset()
		return nil, err
	}
	b, err := readPoolFrame(s)
	if err != nil {
		_ = s.Reset()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	_ = s.Close()
	return b, nil
}
