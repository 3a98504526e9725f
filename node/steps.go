package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// The node's side of the step protocol (the messages and their streams
// are package wire's): how it asks a peer for its step, and what it
// answers when asked.

// queryStep asks one peer for its step, within the query timeout of the
// node's timing now.
func (n *Node) queryStep(ctx context.Context, p peer.ID, req wire.StepRequest) (wire.StepReply, error) {
	return n.bar.Query(ctx, p, req)
}

// stepAnswers is the node as its step server sees it (wire.StepHandler).
type stepAnswers Node

// Leaving takes a peer's leave notice: it is dropped at once.
func (a *stepAnswers) Leaving(from peer.ID) {
	n := (*Node)(a)
	n.iso.NoteLeft(from)
	n.bar.DropPeer(from)
	n.bar.Poke()
}

// Answer is the node's reply to a peer's step query. A peer of another
// model is held out (it learns why from the reply, and one answer is all
// it needs); one of another lineage is alive, but its step is not this
// node's job's (genesis.go).
func (a *stepAnswers) Answer(from peer.ID, q wire.StepRequest) (r wire.StepReply, more, drop bool) {
	n := (*Node)(a)
	k := n.kin.Admit(from, q.Ext, false)
	if k != lineage.OtherModel {
		n.iso.NoteHeard(from) // it reached us: the node is not cut off (isolation.go)
		n.ov.MarkAlive(from)
	}
	if k == lineage.OtherFork {
		// Its steps are another lineage's: what it showed on this one
		// (a step, a promise of a notice) no longer holds, and a barrier
		// that counted it would wait on a peer that no longer trains here.
		n.bar.Progress().Forget(from)
	}
	if q.Estimate > 0 && k == lineage.Kin {
		n.ov.ObserveEstimate(from, q.Estimate)
		n.pop.NotePeerEstimate(q.Estimate)
	}
	if k == lineage.Kin {
		// Before the reply's step is read: a reply below the asker's
		// threshold promises it a progress notice (the notices field),
		// so the asker must be a waiter before this node can advance
		// past the step it replies with (progress.go).
		n.bar.NoteAsker(from, q.Step)
		if q.Step <= n.step.Load() {
			n.bar.Poke() // a peer at or behind us has progressed
		}
	}
	r = wire.StepReply{Leaving: n.leaving.Load() || n.idle.Load(), Step: n.step.Load(), Estimate: n.pop.Estimate(), Interval: n.bar.StepInterval()}
	if f := n.cfg.faults; f.Misbehaves() {
		ctx, cancel := context.WithTimeout(n.life, n.cfg.Check.QueryTimeout)
		defer cancel()
		if n.lost() {
			<-ctx.Done() // the query is lost: the asker hears nothing
			return r, false, true
		}
		if f.ReplyDelay > 0 {
			vclock.Sleep(ctx, f.ReplyDelay)
		}
		if f.StepLie != nil {
			r.Step = f.StepLie(r.Step)
		}
	}
	return r, k != lineage.OtherModel, false
}

// serveStep is the stream handler of both versions of the step protocol:
// the inbound caps (a stream over its peer's cap, or over the node's that
// may evict no idle stream, is reset at once and counted), the wait for
// the node to be assembled, then the step server's loop.
func (n *Node) serveStep(s network.Stream) {
	sl, ok := n.stepIn.Enter(s.Conn().RemotePeer(), s, func() { n.m.Hostile.WithLabelValues(status.KindStepStreamEvicted).Inc() })
	if !ok {
		n.m.Refused.WithLabelValues("step").Inc()
		_ = s.Reset()
		return
	}
	defer n.stepIn.Leave(sl)
	if !n.awaitReady(s, "step") {
		return
	}
	n.stepServer.Serve(s, s.Protocol() == n.stepExtID, sl)
}

// newStepParts makes the asker and the server of the step protocol.
func (n *Node) newStepParts() {
	n.stepExtID = wire.StepProtocolExt(n.cfg.Job)
	n.asker = wire.NewAsker(n.h, n.cfg.Job, n.cfg.Limits.StepStreams, n.kin.ownExt, wire.AskerMetrics{
		Dials: n.m.StepDials, Stale: n.m.StaleStreams, BadReplies: n.m.QueryErrors, RTT: n.m.ObserveRTT,
	})
	n.stepIn = wire.NewInbound(n.cfg.Limits.MaxStreamsPerPeer, n.cfg.Limits.MaxInboundStreams)
	n.stepServer = &wire.StepServer{
		Life: n.life, QueryTimeout: n.cfg.Check.QueryTimeout, Handler: (*stepAnswers)(n), Inbound: n.stepIn,
		Own: n.kin.ownExt, Malformed: n.m.Malformed, Log: n.log,
	}
}
