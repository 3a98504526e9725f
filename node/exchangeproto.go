package node

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/gossip"
)

// The exchange protocol /psp/<job>/exchange/1.0.0 carries an epidemic
// node's model to a peer (see docs/protocols.md, section 10a). One stream
// per model: the sender opens it, writes one frame, half-closes, reads
// one reply frame and closes.
//
//	request: version u8 | exchange u8 (1: epidemic) | payload
//	reply:   version u8 | status u8 | exchange u8 (the answerer's)
//
// The payload is an update message of the gossip wire format (package
// gossip, little-endian) whose values are the sender's parameters rather
// than a delta; it is validated as a gossip update is, with the stream's
// authenticated remote peer as the origin. Status 0 means taken; anything
// else is a refusal, exchangeCodes[status] says why. Every node with a
// model serves the protocol: a node that does not run the epidemic
// exchange answers every request with status 1 (exchange_mismatch) and its
// own exchange, so that a job whose nodes disagree on --exchange says so
// on both sides.

// ExchangeProtocol returns the protocol ID of a job's exchange.
func ExchangeProtocol(job string) protocol.ID {
	return protocol.ID("/psp/" + job + "/exchange/1.0.0")
}

// exchangeCodes are the reply statuses: the index is the code.
var exchangeCodes = []gossip.Reason{
	"", ReasonExchangeMismatch, gossip.ReasonMalformed, gossip.ReasonBadVersion, gossip.ReasonBadEncoding,
	gossip.ReasonSenderMismatch, gossip.ReasonModelMismatch, gossip.ReasonWrongLength, gossip.ReasonNonFinite,
	gossip.ReasonValueTooLarge, gossip.ReasonNegativeStep, gossip.ReasonStepTooFarAhead, gossip.ReasonOversize,
	ReasonDistance, ReasonRate, ReasonOtherLineage,
}

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

// exchangeRequest is an epidemic request framed once for all the peers it
// goes to: frame is what a stream carries (the length prefix, then the
// body), body the body's length.
type exchangeRequest struct {
	frame []byte
	body  int
	buf   []byte // the buffer frame lies in (for a pool)
}

// framePrefix is the room startRequest leaves for the length prefix.
const framePrefix = binary.MaxVarintLen64

// startRequest returns a buffer for an epidemic request whose payload
// takes up to size bytes: room for the frame's length prefix, then the
// request's two header bytes. Append the payload, then call endRequest.
func startRequest(size int) []byte {
	b := make([]byte, framePrefix, framePrefix+2+size)
	return append(b, wireVersion, byte(ExchangeEpidemic))
}

// endRequest puts the length prefix before the body startRequest began:
// the frame is then what writeFrame writes.
func endRequest(b []byte) exchangeRequest {
	body := len(b) - framePrefix
	var pre [framePrefix]byte
	k := binary.PutUvarint(pre[:], uint64(body))
	copy(b[framePrefix-k:], pre[:k])
	return exchangeRequest{frame: b[framePrefix-k:], body: body, buf: b}
}

// frameRequest frames a whole request body (header bytes and payload).
func frameRequest(body []byte) exchangeRequest {
	b := append(make([]byte, framePrefix, framePrefix+len(body)), body...)
	return endRequest(b)
}

// Inbound exchange streams have caps of their own, apart from the step
// and model protocols', so that models cannot crowd out step queries.
const (
	exchangeStreamsPerPeer = 2
	exchangeStreamsTotal   = 64
)

// handleExchange takes in one model from a peer.
// Its caps and the wait for the node to be ready come from limitedBy.
func (n *Node) handleExchange(s network.Stream) {
	from := s.Conn().RemotePeer()
	timeout := 10 * n.cfg.QueryTimeout
	ctx, cancel := context.WithTimeout(n.life, timeout)
	defer cancel()
	defer guard(ctx, s)()
	_ = s.SetDeadline(time.Now().Add(timeout))
	// The two header bytes first: a model this node would refuse anyway
	// (another exchange, or a sender over its share) is read past, never
	// held.
	limit := MaxExchangeFrame(n.task.NumParams())
	r := bufio.NewReader(io.LimitReader(s, int64(limit)+binary.MaxVarintLen64))
	size, err := readFrameLen(r, limit)
	var hdr [2]byte
	if err == nil && size < len(hdr) {
		err = fmt.Errorf("%w: exchange request of %d bytes", ErrWire, size)
	}
	if err == nil {
		_, err = io.ReadFull(r, hdr[:])
	}
	if err == nil && hdr[0] != wireVersion {
		err = fmt.Errorf("%w: exchange request version %d", ErrWire, hdr[0])
	}
	var reason gossip.Reason
	if err == nil {
		if reason = n.exch().screen(from, ExchangeKind(hdr[1])); reason != "" {
			_, err = io.CopyN(io.Discard, r, int64(size-len(hdr)))
		} else {
			var payload []byte
			if payload, err = n.payloads.read(r, size-len(hdr)); err == nil {
				reason = n.exch().accept(from, payload)
				n.payloads.put(payload)
			}
		}
	}
	if err != nil {
		n.xm.rejected.WithLabelValues(string(gossip.ReasonMalformed)).Inc()
		n.log.Debug("exchange request malformed", "from", from, "err", err)
		_ = s.Reset()
		return
	}
	if reason != "" {
		n.xm.rejected.WithLabelValues(string(reason)).Inc()
	}
	reply := []byte{wireVersion, exchangeCode(reason), byte(n.cfg.Exchange.Kind)}
	if err := writeFrame(s, reply); err != nil {
		_ = s.Reset()
		return
	}
	_ = s.Close()
}

// otherExchange refuses a model sent by a peer that runs another exchange
// than this node's, and says so once.
func (n *Node) otherExchange(from peer.ID, kind ExchangeKind) gossip.Reason {
	n.warnOnce(from, "a peer sent a model by another exchange than this node's: nodes of a job must agree on --exchange",
		"peer", from, "peer_exchange", kindName(kind), "exchange", n.cfg.Exchange.String())
	return ReasonExchangeMismatch
}

func kindName(k ExchangeKind) string {
	switch k {
	case ExchangeGossip:
		return "gossip"
	case ExchangeEpidemic:
		return "epidemic"
	}
	return fmt.Sprintf("unknown (%d)", k)
}

// Send failures, by reason label.
const (
	sendUnsupported = "unsupported"       // the peer does not serve the exchange protocol
	sendMismatch    = "exchange_mismatch" // the peer runs another exchange
	sendRefused     = "refused"           // the peer refused the model (its reason is logged)
	sendError       = "error"             // the stream failed or timed out
	sendSkipped     = "skipped"           // too many sends in flight already
	sendInvalid     = "invalid"           // this node's own model is not finite or not encodable
)

// sendTo sends one request to p and reads its answer.
func (n *Node) sendTo(p peer.ID, step int64, req exchangeRequest) {
	ctx, cancel := context.WithTimeout(n.life, 10*n.cfg.QueryTimeout)
	defer cancel()
	var status byte
	var theirs ExchangeKind
	var err error
	if n.lacksExchange(p) {
		err = msmux.ErrNotSupported[protocol.ID]{Protos: []protocol.ID{n.exID}}
	} else {
		status, theirs, err = n.exchangeWith(ctx, p, req)
	}
	switch {
	case errors.Is(err, msmux.ErrNotSupported[protocol.ID]{}):
		n.xm.sendFailed.WithLabelValues(sendUnsupported).Inc()
		n.warnOnce(p, "a peer does not serve the exchange protocol (it runs an older pspnode): nodes of a job must agree on --exchange",
			"peer", p, "exchange", n.cfg.Exchange.String())
	case err != nil:
		if n.life.Err() == nil {
			n.xm.sendFailed.WithLabelValues(sendError).Inc()
			n.log.Debug("model not delivered", "peer", p, "step", step, "err", err)
		}
	case status == 0:
		n.xm.sent.Inc()
		n.xm.sentBytes.Add(float64(req.body))
	case exchangeCodes[status] == ReasonExchangeMismatch:
		n.xm.sendFailed.WithLabelValues(sendMismatch).Inc()
		n.warnOnce(p, "a peer refused this node's model: it runs another exchange; nodes of a job must agree on --exchange",
			"peer", p, "peer_exchange", kindName(theirs), "exchange", n.cfg.Exchange.String())
	default:
		n.xm.sendFailed.WithLabelValues(sendRefused).Inc()
		n.log.Debug("model refused by the peer", "peer", p, "step", step, "reason", string(exchangeCodes[status]))
	}
}

// lacksExchange reports whether identify has told this node p's protocols
// and the exchange protocol is not among them: then the model is not sent
// at all. (Otherwise a stream finds out, but go-libp2p negotiates lazily,
// so the model is on its way when the refusal comes, and the peer's reset
// can arrive before the refusal.)
func (n *Node) lacksExchange(p peer.ID) bool {
	ps := n.h.Peerstore()
	known, err := ps.GetProtocols(p)
	if err != nil || len(known) == 0 {
		return false
	}
	has, err := ps.SupportsProtocols(p, n.exID)
	return err == nil && len(has) == 0
}

// exchangeWith runs one exchange: open, request, read the reply. status is
// a valid index of exchangeCodes when err is nil.
func (n *Node) exchangeWith(ctx context.Context, p peer.ID, req exchangeRequest) (status byte, theirs ExchangeKind, err error) {
	s, err := n.h.NewStream(ctx, p, n.exID)
	if err != nil {
		return 0, 0, err
	}
	defer guard(ctx, s)()
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	if _, err := s.Write(req.frame); err != nil { // what writeFrame writes, framed once for every peer
		_ = s.Reset()
		return 0, 0, err
	}
	_ = s.CloseWrite()
	reply, err := readFrame(smallReader(s, 8), 8)
	if err == nil && (len(reply) != exchangeReplyLen || reply[0] != wireVersion || int(reply[1]) >= len(exchangeCodes)) {
		err = fmt.Errorf("%w: exchange reply % x", ErrWire, reply)
	}
	if err != nil {
		_ = s.Reset()
		return 0, 0, err
	}
	_ = s.Close()
	return reply[1], ExchangeKind(reply[2]), nil
}

// warnOnce logs msg at warning level the first time it concerns peer p
// (up to 256 peers; after that, at debug level).
func (n *Node) warnOnce(p peer.ID, msg string, args ...any) {
	n.warnMu.Lock()
	first := !n.warned[p] && len(n.warned) < 256
	if first {
		if n.warned == nil {
			n.warned = make(map[peer.ID]bool)
		}
		n.warned[p] = true
	}
	n.warnMu.Unlock()
	if first {
		n.log.Warn(msg, args...)
	} else {
		n.log.Debug(msg, args...)
	}
}

// exchangeMetrics are the exchange's Prometheus metrics (psp_exchange_*).
type exchangeMetrics struct {
	sent, sentBytes, received, receivedBytes, merged, merges, clipped prometheus.Counter
	rejected, sendFailed                                              *prometheus.CounterVec
}

func newExchangeMetrics(reg prometheus.Registerer) *exchangeMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: name, Help: help})
	}
	m := &exchangeMetrics{
		sent:          c("sent_total", "Models sent to peers and taken by them (epidemic exchange)."),
		sentBytes:     c("sent_bytes_total", "Bytes of the requests of the models counted in psp_exchange_sent_total."),
		received:      c("received_total", "Models received from peers and taken for averaging."),
		receivedBytes: c("received_bytes_total", "Encoded bytes of the models counted in psp_exchange_received_total."),
		merged:        c("averaged_models_total", "Received models averaged into this node's model."),
		merges:        c("averages_total", "Times this node averaged its model with received ones."),
		clipped:       c("clipped_models_total", "Received models whose pull on this node's model was clipped to the radius (the median distance of the models of recent averages, one per sender per round) when averaged."),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: "rejected_total",
			Help: "Received exchange requests refused, by reason (gossip's validation reasons, exchange_mismatch, distance, rate)."}, []string{"reason"}),
		sendFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "psp", Subsystem: "exchange", Name: "send_failed_total",
			Help: "Models not delivered, by reason: unsupported, exchange_mismatch, refused, error, skipped, invalid."}, []string{"reason"}),
	}
	reg.MustRegister(m.sent, m.sentBytes, m.received, m.receivedBytes, m.merged, m.merges, m.clipped, m.rejected, m.sendFailed)
	for _, r := range exchangeCodes[1:] {
		m.rejected.WithLabelValues(string(r))
	}
	for _, r := range []string{sendUnsupported, sendMismatch, sendRefused, sendError, sendSkipped, sendInvalid} {
		m.sendFailed.WithLabelValues(r)
	}
	return m
}

// ExchangeStats counts what the exchange did (see the psp_exchange_*
// metrics).
type ExchangeStats struct {
	Exchange      string            `json:"exchange"`
	Sent          uint64            `json:"models_sent"`
	SentBytes     uint64            `json:"sent_bytes"`
	Received      uint64            `json:"models_received"`
	ReceivedBytes uint64            `json:"received_bytes"`
	Averaged      uint64            `json:"models_averaged"`
	Averages      uint64            `json:"averages"`
	Rejected      map[string]uint64 `json:"rejected,omitempty"`
	SendFailed    map[string]uint64 `json:"send_failed,omitempty"`
}

// ExchangeStats returns the exchange's counts.
func (n *Node) ExchangeStats() ExchangeStats {
	st := ExchangeStats{Exchange: n.cfg.Exchange.String()}
	if !n.modelUp.Load() || n.xm == nil {
		return st
	}
	m := n.xm
	st.Sent, st.SentBytes = uint64(counterValue(m.sent)), uint64(counterValue(m.sentBytes))
	st.Received, st.ReceivedBytes = uint64(counterValue(m.received)), uint64(counterValue(m.receivedBytes))
	st.Averaged, st.Averages = uint64(counterValue(m.merged)), uint64(counterValue(m.merges))
	vec := func(v *prometheus.CounterVec, labels []string) map[string]uint64 {
		out := map[string]uint64{}
		for _, l := range labels {
			if c := uint64(counterValue(v.WithLabelValues(l))); c > 0 {
				out[l] = c
			}
		}
		return out
	}
	var reasons []string
	for _, r := range exchangeCodes[1:] {
		reasons = append(reasons, string(r))
	}
	st.Rejected = vec(m.rejected, reasons)
	st.SendFailed = vec(m.sendFailed, []string{sendUnsupported, sendMismatch, sendRefused, sendError, sendSkipped})
	return st
}

// UpdateStats counts the updates a node exchanged, whatever the exchange,
// as gossip.Stats: under gossip the topic's counts; under epidemic the
// models sent (one per peer) and taken, and the refused ones by reason.
func (n *Node) UpdateStats() gossip.Stats { return n.exch().stats() }

// payloadPool holds the buffers received models are read into: a model
// is read whole before it is judged, and a pool spares the node a large
// allocation (and the collector its clearing) per model received.
type payloadPool struct{ p sync.Pool }

// heads holds the buffers the first eagerBody bytes of a payload are read
// into.
var heads = sync.Pool{New: func() any { return new([eagerBody]byte) }}

// read reads an n-byte payload from r into a pooled buffer. The first
// eagerBody bytes go into a small buffer first, so that a peer that
// announces a large frame and stalls holds no model-sized buffer.
func (pp *payloadPool) read(r io.Reader, n int) ([]byte, error) {
	if n <= eagerBody {
		return readBody(r, n)
	}
	head := heads.Get().(*[eagerBody]byte)
	defer heads.Put(head)
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrWire, err)
	}
	var b []byte
	if v, ok := pp.p.Get().(*[]byte); ok && cap(*v) >= n {
		b = (*v)[:n]
	} else {
		b = make([]byte, n)
	}
	copy(b, head[:])
	if _, err := io.ReadFull(r, b[eagerBody:]); err != nil {
		pp.put(b)
		return nil, fmt.Errorf("%w: body: %w", ErrWire, err)
	}
	return b, nil
}

// put gives a buffer read returned back to the pool.
func (pp *payloadPool) put(b []byte) {
	if cap(b) > eagerBody {
		pp.p.Put(&b)
	}
}
