package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
)

// The node's side of the exchange protocol (its messages and streams
// are package wire's): an epidemic node sends its model to peers, and
// every node with a model takes models in, judged by its exchange. A
// node that does not run the epidemic exchange answers every request
// with the reason exchange_mismatch and its own exchange, so that a job
// whose nodes disagree on --exchange says so on both sides.

// serveExchange is the exchange protocol's stream handler.
func (n *Node) serveExchange(s network.Stream) { n.exServer.Serve(s) }

// otherExchange refuses a model sent by a peer that runs another exchange
// than this node's, and says so once.
func (n *Node) otherExchange(from peer.ID, kind ExchangeKind) gossip.Reason {
	n.warnOnce(from, "a peer sent a model by another exchange than this node's: nodes of a job must agree on --exchange",
		"peer", from, "peer_exchange", kindName(kind), "exchange", n.cfg.Exchange.String())
	return wire.ReasonExchangeMismatch
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
func (n *Node) sendTo(p peer.ID, step int64, req wire.ExchangeRequest) {
	ctx, cancel := context.WithTimeout(n.life, 10*n.cfg.QueryTimeout)
	defer cancel()
	var reason gossip.Reason
	var theirs byte
	var err error
	if n.lacksExchange(p) {
		err = msmux.ErrNotSupported[protocol.ID]{Protos: []protocol.ID{wire.ExchangeProtocol(n.cfg.Job)}}
	} else {
		reason, theirs, err = wire.SendExchange(ctx, n.h, p, n.cfg.Job, req)
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
	case reason == "":
		n.xm.sent.Inc()
		n.xm.sentBytes.Add(float64(req.Body))
	case reason == wire.ReasonExchangeMismatch:
		n.xm.sendFailed.WithLabelValues(sendMismatch).Inc()
		n.warnOnce(p, "a peer refused this node's model: it runs another exchange; nodes of a job must agree on --exchange",
			"peer", p, "peer_exchange", kindName(ExchangeKind(theirs)), "exchange", n.cfg.Exchange.String())
	default:
		n.xm.sendFailed.WithLabelValues(sendRefused).Inc()
		n.log.Debug("model refused by the peer", "peer", p, "step", step, "reason", string(reason))
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
	has, err := ps.SupportsProtocols(p, wire.ExchangeProtocol(n.cfg.Job))
	return err == nil && len(has) == 0
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
	for _, r := range wire.ExchangeReasons() {
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
	for _, r := range wire.ExchangeReasons() {
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

// exJudge is the node's exchange as the exchange server judges with it.
type exJudge struct{ ex exchanger }

func (j exJudge) Screen(from peer.ID, kind byte) gossip.Reason {
	return j.ex.screen(from, ExchangeKind(kind))
}

func (j exJudge) Accept(from peer.ID, payload []byte) gossip.Reason {
	return j.ex.accept(from, payload)
}
