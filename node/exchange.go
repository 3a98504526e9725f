package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/vclock"
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
		Host: n.h, Job: n.cfg.Job, Model: (*exchangeModel)(n), Node: (*exchangeNode)(n), Gossip: n.cfg.Gossip,
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

func (x *exchangeNode) Sample(ctx context.Context, k int) []peer.ID { return x.bar.Sample(ctx, k) }

// Heard counts a peer's update or model of step as its answer (see
// progress), and wakes the barrier when the peer is at or behind this
// node: a waiting barrier may pass now.
func (x *exchangeNode) Heard(from peer.ID, step int64) {
	n := (*Node)(x)
	n.bar.Progress().Vouch(from, step, time.Now())
	if step <= n.step.Load() {
		n.bar.Poke()
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
	return x.pop.Population()
}

// exchangeModel is the node's model as its exchange sees it
// (exchange.Model): the task's, and the staleness of the gossip updates
// applied to it. A driven node's program says when it takes them
// (Driver.NoteApplied): that is their staleness there.
type exchangeModel Node

func (m *exchangeModel) NumParams() int  { return m.model.NumParams() }
func (m *exchangeModel) ModelID() uint32 { return m.model.ModelID() }

func (m *exchangeModel) Apply(update []float32, step int64) error {
	if err := m.model.Apply(update, step); err != nil {
		return err
	}
	if step >= 0 && m.driver == nil {
		m.m.Staleness.Observe(float64(m.step.Load() - step))
	}
	return nil
}

// lrPopulation is the population the learning rate is scaled by (see
// package exchange): the estimate under gossip, 1 under epidemic
// (exchange.Kind.Averages).
func lrPopulation(cfg *Config, pop *census) float64 {
	if cfg.Exchange.Kind.Averages() {
		return 1
	}
	return pop.Population()
}

// Gossip is the node's update topic, nil for a task without a model and
// under the epidemic exchange.
func (n *Node) Gossip() *gossip.Gossip { return exchange.TopicOf(n.exch()) }

// waitMesh waits, within ctx, until what the node publishes on its
// gossip topic t reaches peers (gossip.Gossip.WaitMesh); Run calls it
// before its first step. An exchange without a topic (t nil) sends its
// models over streams of their own, to peers sampled when they are sent:
// it has nothing to wait for.
func waitMesh(ctx context.Context, t *gossip.Gossip, log *slog.Logger) {
	if t != nil && !t.WaitMesh(ctx) && ctx.Err() == nil {
		log.Debug("no gossip mesh peer yet: the first updates may reach no one")
	}
}

// topicWait bounds how long waitSubscribed waits for the update topic to
// list a peer.
const topicWait = 2 * time.Second

// waitSubscribed waits, up to topicWait, until the node's gossip topic t
// lists a peer, when the node knows any (known > 0): peers send their updates only to
// the subscribers they know of, and an update sent between the fetch of
// the job's model and the moment peers learn of this node's subscription
// would be missed for good. (Peers without a trainer are not subscribed:
// a node whose known peers have none waits the whole bound.) The Driver
// calls it when a session begins.
func waitSubscribed(ctx context.Context, t *gossip.Gossip, known int) {
	if t == nil || known == 0 {
		return
	}
	deadline := time.Now().Add(topicWait)
	for len(t.Peers()) == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		vclock.Sleep(ctx, 10*time.Millisecond)
	}
}

// UpdateStats counts the updates a node exchanged, whatever the exchange,
// as gossip.Stats: under gossip the topic's counts; under epidemic the
// models sent (one per peer) and taken, and the refused ones by reason.
func (n *Node) UpdateStats() gossip.Stats {
	if t := n.Gossip(); t != nil {
		return t.Stats()
	}
	x := n.exch().Stats()
	st := gossip.Stats{Rejected: map[gossip.Reason]uint64{}, Declined: map[gossip.Reason]uint64{}}
	st.Sent, st.SentBytes, st.Received, st.ReceivedBytes = x.Sent, x.SentBytes, x.Received, x.ReceivedBytes
	for r, c := range x.Rejected {
		st.Rejected[gossip.Reason(r)] = c
	}
	for r, c := range x.Declined {
		st.Declined[gossip.Reason(r)] = c
	}
	return st
}

// exchangeStats are the exchange's counts (the psp_exchange_* metrics).
func (n *Node) exchangeStats() exchange.Stats {
	st := n.exch().Stats()
	st.Exchange = n.cfg.Exchange.Spec.String()
	return st
}

// topicPayloadBytes is the update payload the gossip topic t delivered
// (0 without a topic), for the gossip amplification (traffic.go).
func topicPayloadBytes(t *gossip.Gossip) uint64 {
	if t != nil {
		return t.Stats().ReceivedBytes
	}
	return 0
}
