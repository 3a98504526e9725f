package node

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/exchange"
)

// The node's exchange (package exchange): built when the node's model is
// attached, driven by Run or the Driver, and told what the node knows of
// its peers through exchangeNode.

// newExchange builds the exchange of n's configuration for n's model, and
// serves the exchange protocol with it.
func (n *Node) newExchange(ctx context.Context) (exchange.Exchange, error) {
	ex, err := exchange.New(ctx, n.cfg.Exchange, exchange.Deps{
		Host: n.h, Job: n.cfg.Job, Model: n.model, Node: (*exchangeNode)(n), Gossip: n.cfg.Gossip,
		Life: n.life, SendTimeout: 10 * n.cfg.Check.QueryTimeout, Log: n.log, Registry: n.reg,
		Counters: exchange.Counters{Applied: n.m.Applied, ApplyRejected: n.m.ApplyRejected, NormRefused: n.m.NormRefused, Staleness: n.m.Staleness},
		Faults:   n.cfg.faults, Lost: n.lost,
	})
	if err != nil {
		return nil, err
	}
	n.exIn = wire.NewInbound(wire.ExchangeStreamsPerPeer, wire.ExchangeStreamsTotal)
	return ex, nil
}

// exch is the node's exchange: exchange.None until the model is attached
// (attachModel sets n.ex before modelUp).
func (n *Node) exch() exchange.Exchange {
	if !n.modelUp.Load() {
		return exchange.None
	}
	return n.ex
}

// exchangeNode is the node as its exchange sees it (exchange.Node).
type exchangeNode Node

func (x *exchangeNode) Step() int64 { return x.step.Load() }

func (x *exchangeNode) Sample(ctx context.Context, k int) []peer.ID { return x.bar.sample(ctx, k) }

// Heard counts a peer's update or model of step as its answer (see
// progress), and wakes the barrier when the peer is at or behind this
// node: a waiting barrier may pass now.
func (x *exchangeNode) Heard(from peer.ID, step int64) {
	n := (*Node)(x)
	n.bar.progress.Vouch(from, step, time.Now())
	if step <= n.step.Load() {
		n.bar.poke()
	}
}

// OtherLineage drops the work of a peer last heard on another lineage of
// the job (genesis.go), and counts it.
func (x *exchangeNode) OtherLineage(from peer.ID) bool {
	if x.kin.lin.FromOther(from, time.Now()) {
		x.kin.lin.OtherUpdates.Inc()
		return true
	}
	return false
}

func (x *exchangeNode) PeerCount() int {
	if x.ov == nil {
		return 0
	}
	return x.ov.PeerCount()
}

func (x *exchangeNode) Population() float64 {
	if x.ov == nil { // (a node under test without an overlay)
		return 0
	}
	return x.pop.population()
}

// lrPopulation is the population the learning rate is scaled by (see
// package exchange): the estimate under gossip, 1 under epidemic.
func (n *Node) lrPopulation() float64 {
	if !n.exch().ScalesLR() {
		return 1
	}
	return n.pop.population()
}

// UpdateStats counts the updates a node exchanged, whatever the exchange,
// as gossip.Stats: under gossip the topic's counts; under epidemic the
// models sent (one per peer) and taken, and the refused ones by reason.
func (n *Node) UpdateStats() gossip.Stats { return n.exch().Updates() }

// exchangeStats are the exchange's counts (the psp_exchange_* metrics).
func (n *Node) exchangeStats() exchange.Stats {
	st := n.exch().Stats()
	st.Exchange = n.cfg.Exchange.Spec.String()
	return st
}

// topicPayloadBytes is the update payload the gossip topic delivered (0
// without a topic), for the gossip amplification (traffic.go).
func (n *Node) topicPayloadBytes() uint64 {
	if t := n.exch().Topic(); t != nil {
		return t.Stats().ReceivedBytes
	}
	return 0
}
