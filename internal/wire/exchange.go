package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/gossip"
)

// The exchange message: an epidemic node's model, sent to a peer, and
// the peer's answer (see the package comment for the layout). This file
// holds its framing, its reply's statuses, and how a stream carries it:
// SendExchange sends, ExchangeServer takes in. The payload is an update
// message of the gossip wire format (package gossip), which the receiver
// validates as gossip does; this file only carries it.

// ExchangeProtocol returns the protocol ID of a job's exchange.
func ExchangeProtocol(job string) protocol.ID {
	return protocol.ID("/psp/" + job + "/exchange/1.0.0")
}

// Reasons a received model is refused, beside gossip's validation reasons
// (see gossip.Reason): the sender runs another exchange; the model is too
// far from the receiver's; the sender sent more models since the
// receiver's last average than it may; the sender was last heard on
// another lineage of the job.
const (
	ReasonExchangeMismatch gossip.Reason = "exchange_mismatch"
	ReasonDistance         gossip.Reason = "distance"
	ReasonRate             gossip.Reason = "rate"
	ReasonOtherLineage     gossip.Reason = "other_lineage"
)

// exchangeCodes are the reply statuses: the index is the code; 0 means
// taken.
var exchangeCodes = []gossip.Reason{
	"", ReasonExchangeMismatch, gossip.ReasonMalformed, gossip.ReasonBadVersion, gossip.ReasonBadEncoding,
	gossip.ReasonSenderMismatch, gossip.ReasonModelMismatch, gossip.ReasonWrongLength, gossip.ReasonNonFinite,
	gossip.ReasonValueTooLarge, gossip.ReasonNegativeStep, gossip.ReasonStepTooFarAhead, gossip.ReasonOversize,
	ReasonDistance, ReasonRate, ReasonOtherLineage,
}

// ExchangeReasons are the reasons an exchange reply can give for a
// refusal, in the order of their codes.
func ExchangeReasons() []gossip.Reason { return exchangeCodes[1:] }

func exchangeCode(r gossip.Reason) byte {
	for i, c := range exchangeCodes {
		if c == r {
			return byte(i)
		}
	}
	return 2 // malformed
}

const exchangeReplyLen = 3

// MaxExchangeFrame is the largest request body a node with n parameters
// reads: the two header bytes and the largest dense float32 update.
func MaxExchangeFrame(n int) int { return 2 + gossip.MaxEncodedSize(n) }

// ExchangeRequest is a request framed once for all the peers it goes
// to: Frame is what a stream carries (the length prefix, then the body),
// Body the body's length.
type ExchangeRequest struct {
	Frame []byte
	Body  int
	Buf   []byte // the buffer Frame lies in (for a pool)
}

// framePrefix is the room StartExchange leaves for the length prefix.
const framePrefix = binary.MaxVarintLen64

// StartExchange returns buf, or a new buffer if buf is too small, set up
// for a request of exchange kind whose payload takes up to size bytes:
// room for the frame's length prefix, then the request's two header
// bytes. Append the payload, then call EndExchange.
func StartExchange(buf []byte, kind byte, size int) []byte {
	if cap(buf) < framePrefix+2+size {
		buf = make([]byte, 0, framePrefix+2+size)
	}
	return append(buf[:framePrefix], Version, kind)
}

// EndExchange puts the length prefix before the body StartExchange began:
// the frame is then what WriteFrame would write.
func EndExchange(b []byte) ExchangeRequest {
	body := len(b) - framePrefix
	var pre [framePrefix]byte
	k := binary.PutUvarint(pre[:], uint64(body))
	copy(b[framePrefix-k:], pre[:k])
	return ExchangeRequest{Frame: b[framePrefix-k:], Body: body, Buf: b}
}

// FrameExchange frames a whole request body (header bytes and payload).
func FrameExchange(body []byte) ExchangeRequest {
	return EndExchange(append(make([]byte, framePrefix, framePrefix+len(body)), body...))
}

// SendExchange sends req to p, over h, and reads the answer, within ctx:
// the reason the peer refused the model ("" when it took it) and the
// peer's exchange kind.
func SendExchange(ctx context.Context, h host.Host, p peer.ID, job string, req ExchangeRequest) (reason gossip.Reason, theirs byte, err error) {
	s, err := h.NewStream(ctx, p, ExchangeProtocol(job))
	if err != nil {
		return "", 0, err
	}
	defer Guard(ctx, s)()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	if _, err := s.Write(req.Frame); err != nil { // framed once for every peer
		_ = s.Reset()
		return "", 0, err
	}
	_ = s.CloseWrite()
	reply, err := ReadFrame(SmallReader(s, 8), 8)
	if err == nil && (len(reply) != exchangeReplyLen || reply[0] != Version || int(reply[1]) >= len(exchangeCodes)) {
		err = fmt.Errorf("%w: exchange reply % x", ErrMalformed, reply)
	}
	if err != nil {
		_ = s.Reset()
		return "", 0, err
	}
	_ = s.Close()
	return exchangeCodes[reply[1]], reply[2], nil
}

// An ExchangeJudge decides whether a node takes a model it is sent: the
// node's exchange.
type ExchangeJudge interface {
	// Screen judges a request from its header alone: the sender and its
	// exchange kind. A model refused here is read past, never held.
	Screen(from peer.ID, kind byte) gossip.Reason
	// Accept judges the payload of a request that Screen passed; it must
	// not keep payload.
	Accept(from peer.ID, payload []byte) gossip.Reason
}

// ExchangeServer takes in models sent by peers.
type ExchangeServer struct {
	Life     context.Context // ends when the node closes
	Timeout  time.Duration   // bounds one request and its answer
	MaxFrame int             // MaxExchangeFrame of the node's model
	Kind     byte            // this node's exchange, said in every reply
	Judge    ExchangeJudge
	// Rejected counts refusals by reason (malformed requests included).
	Rejected *prometheus.CounterVec
	Log      *slog.Logger
	payloads payloadPool
}

// Serve takes in one model on s and answers.
func (sv *ExchangeServer) Serve(s network.Stream) {
	from := s.Conn().RemotePeer()
	ctx, cancel := context.WithTimeout(sv.Life, sv.Timeout)
	defer cancel()
	defer Guard(ctx, s)()
	_ = s.SetDeadline(time.Now().Add(sv.Timeout))
	// The two header bytes first: a model this node would refuse anyway
	// (another exchange, or a sender over its share) is read past, never
	// held.
	r := bufio.NewReader(io.LimitReader(s, int64(sv.MaxFrame)+binary.MaxVarintLen64))
	size, err := ReadFrameLen(r, sv.MaxFrame)
	var hdr [2]byte
	if err == nil && size < len(hdr) {
		err = fmt.Errorf("%w: exchange request of %d bytes", ErrMalformed, size)
	}
	if err == nil {
		_, err = io.ReadFull(r, hdr[:])
	}
	if err == nil && hdr[0] != Version {
		err = fmt.Errorf("%w: exchange request version %d", ErrMalformed, hdr[0])
	}
	var reason gossip.Reason
	if err == nil {
		if reason = sv.Judge.Screen(from, hdr[1]); reason != "" {
			_, err = io.CopyN(io.Discard, r, int64(size-len(hdr)))
		} else {
			var payload []byte
			if payload, err = sv.payloads.read(r, size-len(hdr)); err == nil {
				reason = sv.Judge.Accept(from, payload)
				sv.payloads.put(payload)
			}
		}
	}
	if err != nil {
		sv.Rejected.WithLabelValues(string(gossip.ReasonMalformed)).Inc()
		sv.Log.Debug("exchange request malformed", "from", from, "err", err)
		_ = s.Reset()
		return
	}
	if reason != "" {
		sv.Rejected.WithLabelValues(string(reason)).Inc()
	}
	if err := WriteFrame(s, []byte{Version, exchangeCode(reason), sv.Kind}); err != nil {
		_ = s.Reset()
		return
	}
	_ = s.Close()
}

// payloadPool holds the buffers received models are read into: a model
// is read whole before it is judged, and a pool spares the node a large
// allocation (and the collector its clearing) per model received.
type payloadPool struct{ p sync.Pool }

// heads holds the buffers the first EagerBody bytes of a payload are read
// into.
var heads = sync.Pool{New: func() any { return new([EagerBody]byte) }}

// read reads an n-byte payload from r into a pooled buffer. The first
// EagerBody bytes go into a small buffer first, so that a peer that
// announces a large frame and stalls holds no model-sized buffer.
func (pp *payloadPool) read(r io.Reader, n int) ([]byte, error) {
	if n <= EagerBody {
		return ReadBody(r, n)
	}
	head := heads.Get().(*[EagerBody]byte)
	defer heads.Put(head)
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrMalformed, err)
	}
	var b []byte
	if v, ok := pp.p.Get().(*[]byte); ok && cap(*v) >= n {
		b = (*v)[:n]
	} else {
		b = make([]byte, n)
	}
	copy(b, head[:])
	if _, err := io.ReadFull(r, b[EagerBody:]); err != nil {
		pp.put(b)
		return nil, fmt.Errorf("%w: body: %w", ErrMalformed, err)
	}
	return b, nil
}

// put gives a buffer read returned back to the pool.
func (pp *payloadPool) put(b []byte) {
	if cap(b) > EagerBody {
		pp.p.Put(&b)
	}
}
