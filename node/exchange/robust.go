package exchange

import (
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The epidemic exchange's robust references (see the epidemic type): how
// often a sender is taken (spacingFor), the clip radius of a block
// (senderDists), and the distance bound (distanceBoundLocked).

// spacingFor is how many averages must pass before a sender's model is
// taken again, in a job of population nodes where each sends its model to
// s sampled peers: a quarter of the averages between two of an honest
// sender's models to this node, (N − 1)/s, and at least 1. A peer that
// samples its peers, as every honest one does, comes about once in
// (N − 1)/s of its steps; one that pushes to every node every step (a
// poisoner) would otherwise fill every round of every node, however few
// such peers there are: with 10 of 100 pushing, they were most of every
// round's senders. An honest model refused by it is refused at its offer:
// its sender sends it to another peer.
func spacingFor(population float64, s int) uint64 {
	if s < 1 || !(population > 1) {
		return 1
	}
	return uint64(max(1, int((population-1)/float64(4*s))))
}

// senderDists is a block's recent distances, each with its sender.
type senderDists struct {
	d    []float64
	from []uint32
	next int
	full bool
}

func newSenderDists(n int) senderDists {
	return senderDists{d: make([]float64, n), from: make([]uint32, n)}
}

// add records a sender's distance, the oldest going.
func (s *senderDists) add(from uint32, d float64) {
	s.d[s.next], s.from[s.next] = d, from
	s.next = (s.next + 1) % len(s.d)
	s.full = s.full || s.next == 0
}

// radius is the clip radius of a block: clipFactor × the lower quartile
// (clipQuantile, rounded down: the least of up to four) of the latest
// distance of each sender among
// the recent ones (0, no clipping, before there is one). One vote a
// sender: a sender that comes more often than the others (a pusher, taken
// as often as the spacing lets it, four times an honest peer's rate) does
// not fill the reference with its distances; and the lower quartile is
// an honest sender's while honest senders are more than a quarter of
// them.
func (s *senderDists) radius() float64 {
	n := s.next
	if s.full {
		n = len(s.d)
	}
	if n == 0 {
		return 0
	}
	var seen [distWindow]uint32
	var latest [distWindow]float64
	k := 0
	for i := range n { // newest first
		j := (s.next - 1 - i + len(s.d)) % len(s.d)
		if !slices.Contains(seen[:k], s.from[j]) {
			seen[k], latest[k] = s.from[j], s.d[j]
			k++
		}
	}
	ds := latest[:k]
	slices.Sort(ds)
	return clipFactor * ds[int(clipQuantile*float64(k-1))]
}

// senderIndexLocked is a small number for from, for the distances'
// senders (they start again past maxSenders). mu is held.
func (e *epidemic) senderIndexLocked(from peer.ID) uint32 {
	i, ok := e.senders[from]
	if !ok {
		if len(e.senders) >= maxSenders {
			clear(e.senders)
		}
		e.nextSender++
		i = e.nextSender
		e.senders[from] = i
	}
	return i
}

// distanceBoundLocked is the norm bound's counterpart for models, per
// block: a received block is refused if its distance to this node's block
// exceeds NormBound × (1 + S) × the upper quartile of the norms of this
// node's own recent steps on the block. Averaged with k ≈ S others, a
// model at that distance moves this node's model by about NormBound of
// its own steps: the most one gossip update may (gossip.go). Honest
// peers' models differ from ours by the consensus distance and the steps
// they are ahead or behind, a few steps' worth. ok is false until the
// node has made a step; bound is 0 when the check is off (NormBound 0).
// mu is held.
func (e *epidemic) distanceBoundLocked(b int) (bound float64, ok bool) {
	nb := e.cfg.NormBound
	if nb <= 0 {
		return 0, true
	}
	med, ok := e.blk[b].norms.reference()
	if !ok {
		return 0, false
	}
	return nb * float64(1+e.s) * med, true
}
