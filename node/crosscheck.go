package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// The cross-check of a fetched model. A joiner (or a node that realigns)
// takes the job's model from the peers nearest the step it adopts, each
// giving a range of blocks (a small model: one peer gives it all). What a
// peer serves is a claim: a peer at the job's step serving values of its
// own choosing (within the exchange's bound, so the blocks are well
// formed) would set the joiner's model. So each block range's giver is
// held to the job: for one block it gave, up to two other peers of the
// list (witnesses) serve their copy of that block. The giver's copy stands
// if it is near the first witness's, or the second's; it is outvoted when
// two witnesses agree with each other and not with it; when no two copies
// agree, or only one witness answers, one peer's word stands against
// another's and the copy stands (the peers' models differ by more than the
// tolerance: nobody can tell). An outvoted giver's blocks are fetched
// again without it (once), and it is counted
// (psp_hostile_messages_total{kind="model_outvoted"}).
//
// Near: the distance between two copies at most crossTol of the larger
// norm. Peers' models at about one step differ by far less (an epidemic
// average's spread, a few steps of training), and a model made up by a
// liar by far more, unless it is near the job's, and then it does no harm
// the exchange's distance bound does not already limit.

// crossTol is the largest relative distance between two copies of a block
// that agree.
const crossTol = 0.5

// crossWitnesses is how many witnesses a giver's block is compared with,
// at most.
const crossWitnesses = 2

// crossCheck holds each peer that gave a part of the model in dst (f) to
// the copies of other peers in from, and returns the givers two witnesses
// outvoted.
func (mp *modelProto) crossCheck(ctx context.Context, from []peer.ID, f fetched, dst []float32) (outvoted []peer.ID) {
	ours := mp.shape()
	var w [crossWitnesses][]float32
	for giver, b := range f.block {
		lo, hi := wire.BlockRange(b, ours.N)
		copies := 0
		for _, p := range from {
			if copies == crossWitnesses || ctx.Err() != nil {
				break
			}
			if p == giver {
				continue
			}
			if w[copies] == nil {
				w[copies] = make([]float32, wire.ExchangeBlock)
			}
			buf := w[copies][:hi-lo]
			if _, err := wire.FetchBlock(ctx, mp.h, p, mp.job, ours, b, buf, mp.maxAbs, 10*mp.timeout); err != nil {
				mp.log.Debug("cross-check: a witness did not serve its block", "peer", p, "block", b, "err", err)
				continue
			}
			copies++
			if near(dst[lo:hi], buf) {
				break // the giver's copy stands
			}
			if copies == 2 && near(w[0][:hi-lo], buf) {
				outvoted = append(outvoted, giver)
				mp.m.Hostile.WithLabelValues(status.KindModelOutvoted).Inc()
				mp.log.Warn("a peer served a model two other peers of the job disagree with: fetching its part again from others",
					"peer", giver, "block", b, "distance", relDist(dst[lo:hi], buf))
			}
		}
	}
	return outvoted
}

// near reports whether two copies of a block agree: their distance at
// most crossTol of the larger norm (two all-zero copies agree).
func near(a, b []float32) bool { return relDist(a, b) <= crossTol }

// relDist is ‖a − b‖ / max(‖a‖, ‖b‖), 0 when both are 0.
func relDist(a, b []float32) float64 {
	if m := max(f32.Norm(a), f32.Norm(b)); m > 0 {
		return f32.Dist(a, b) / m
	}
	return 0
}
