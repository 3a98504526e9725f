package exchange

import (
	"errors"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
)

// Sending models over the exchange protocol (the epidemic exchange sends;
// every exchange serves, base.Serve), and what the two sides say when a
// job's nodes disagree on the exchange: each side warns once per peer.

// sendModelTo offers a model (o, its blocks from fill) to p and sends it
// if p takes it, counting what happened.
func (b *base) sendModelTo(p peer.ID, step int64, o wire.Offer, fill func(int, []float32), buf []float32) (declined bool) {
	var reason gossip.Reason
	var theirs byte
	var st wire.ExchangeStats
	var err error
	if b.lacksExchange(p) {
		err = msmux.ErrNotSupported[protocol.ID]{Protos: []protocol.ID{wire.ExchangeProtocol(b.d.Job)}}
	} else {
		reason, theirs, st, err = wire.SendModel(b.d.Life, b.d.Host, p, b.d.Job, o, fill, buf, b.d.SendTimeout)
	}
	b.m.sentBytes.Add(float64(st.Bytes))
	switch {
	case errors.Is(err, msmux.ErrNotSupported[protocol.ID]{}):
		b.m.sendFailed.WithLabelValues(sendUnsupported).Inc()
		b.warnOnce(p, "a peer does not serve the exchange protocol (it runs an older pspnode): nodes of a job must agree on --exchange and run a pspnode of the same exchange version",
			"peer", p, "exchange", b.cfg.Spec.String(), "protocol", wire.ExchangeProtocol(b.d.Job))
	case err != nil:
		if b.d.Life.Err() == nil {
			b.m.sendFailed.WithLabelValues(sendError).Inc()
			b.d.Log.Debug("model not delivered", "peer", p, "step", step, "blocks_sent", st.Blocks, "err", err)
		}
	case reason == "":
		b.m.sent.Inc()
	case reason == wire.ReasonExchangeMismatch:
		b.m.sendFailed.WithLabelValues(sendMismatch).Inc()
		b.warnOnce(p, "a peer refused this node's model: it runs another exchange; nodes of a job must agree on --exchange",
			"peer", p, "peer_exchange", Kind(theirs).String(), "exchange", b.cfg.Spec.String())
	case st.Blocks == 0:
		b.m.sendFailed.WithLabelValues(sendDeclined).Inc()
		b.d.Log.Debug("model declined by the peer at its offer", "peer", p, "step", step, "reason", string(reason))
		return true
	default:
		b.m.sendFailed.WithLabelValues(sendRefused).Inc()
		b.d.Log.Debug("model refused by the peer", "peer", p, "step", step, "reason", string(reason))
	}
	return false
}

// lacksExchange reports whether identify has told this node p's protocols
// and the exchange protocol is not among them: then the model is not sent
// at all. (Otherwise a stream finds out, but go-libp2p negotiates lazily,
// so the model is on its way when the refusal comes, and the peer's reset
// can arrive before the refusal.)
func (b *base) lacksExchange(p peer.ID) bool {
	ps := b.d.Host.Peerstore()
	known, err := ps.GetProtocols(p)
	if err != nil || len(known) == 0 {
		return false
	}
	has, err := ps.SupportsProtocols(p, wire.ExchangeProtocol(b.d.Job))
	return err == nil && len(has) == 0
}

// otherExchange refuses a model sent by a peer that runs another exchange
// than this node's, and says so once.
func (b *base) otherExchange(from peer.ID, kind Kind) gossip.Reason {
	b.warnOnce(from, "a peer sent a model by another exchange than this node's: nodes of a job must agree on --exchange",
		"peer", from, "peer_exchange", kind.String(), "exchange", b.cfg.Spec.String())
	return wire.ReasonExchangeMismatch
}

// warnings are the peers warned about (warnOnce).
type warnings struct {
	mu     sync.Mutex
	warned map[peer.ID]bool
}

// warnOnce logs msg at warning level the first time it concerns peer p
// (up to 256 peers; after that, at debug level).
func (b *base) warnOnce(p peer.ID, msg string, args ...any) {
	w := &b.warnings
	w.mu.Lock()
	first := !w.warned[p] && len(w.warned) < 256
	if first {
		if w.warned == nil {
			w.warned = make(map[peer.ID]bool)
		}
		w.warned[p] = true
	}
	w.mu.Unlock()
	if first {
		b.d.Log.Warn(msg, args...)
	} else {
		b.d.Log.Debug(msg, args...)
	}
}
