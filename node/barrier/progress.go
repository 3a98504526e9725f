package barrier

import (
	"context"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/progress"
	"github.com/pspnode/pspnode/internal/wire"
)

// What a node knows of its peers' steps without asking, and whom it
// tells when it advances, is a progress.Table (b.progress); here is how
// the node feeds it and acts on it.

// noteAsker records what a step query tells about its sender: its step,
// and, if this node's step holds back the sender's barrier, that it waits.
func (b *Barrier) NoteAsker(from peer.ID, step int64) {
	b.boot.FirstPeer()
	b.progress.Saw(from, step)
	s := b.cfg.Check.Spec.BaseStaleness()
	if s < 0 {
		return // ASP never waits
	}
	if threshold := step - int64(s); b.step.Load() < threshold {
		b.progress.Wait(from, threshold, time.Now())
	}
}

// promised records the notice an answer promised: a reply below the
// request's step less the answerer's staleness bound, from an answerer
// that sends notices (the 1.1.0 notices field), holds the peer below that
// threshold until it says otherwise, for at most progress.PromiseSteps of this
// node's mean compute time (none before it has one) and half progress.WaiterTTL.
func (b *Barrier) Promised(p peer.ID, r wire.StepReply, asked int64) {
	if r.Ext == nil || !r.Ext.Notices {
		return
	}
	below := asked - int64(r.Ext.Staleness)
	if below <= 0 || r.Step >= below {
		return
	}
	hold := min(progress.WaiterTTL/2, dur(progress.PromiseSteps*math.Float64frombits(b.compute.Load())))
	if hold <= 0 {
		return
	}
	now := time.Now()
	b.progress.Promise(p, below, now, now.Add(hold))
}

// pushProgress tells the waiters this node's new step releases that it
// advanced: a step query each, whose arrival wakes their barrier. Each
// query ends within QueryTimeout or when ctx ends; nobody waits for them.
func (b *Barrier) PushProgress(ctx context.Context, step int64) {
	peers := b.progress.Release(step, time.Now())
	if len(peers) == 0 {
		return
	}
	b.m.Pushed.Add(float64(len(peers)))
	req := wire.StepRequest{Step: step, Estimate: b.pop.Estimate()}
	for _, p := range peers {
		go func() { // ends within QueryTimeout, or when the node stops
			r, err := b.Query(ctx, p, req)
			switch {
			case err != nil && ctx.Err() == nil:
				b.queryFailed(p)
			case err == nil && !r.Leaving:
				b.progress.Saw(p, r.Step)
			}
		}()
	}
}

// dropPeer forgets a peer that left or failed: the overlay holds it dead
// (out of samples and the known population) and its known step goes.
func (b *Barrier) DropPeer(p peer.ID) {
	b.ov.MarkDead(p)
	b.progress.Forget(p)
	b.asker.Drop(p)
	b.pop.Repopulate()
}

// queryFailed handles a step query that failed while the node runs.
func (b *Barrier) queryFailed(p peer.ID) {
	b.m.Timeouts.Inc()
	b.DropPeer(p)
	b.n.PeerFailed(p)
}
