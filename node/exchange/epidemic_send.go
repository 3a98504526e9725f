package exchange

import (
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
)

// The epidemic exchange's sending: the node's model to S sampled peers
// after each step, one in flight per peer.

// sendModel sends the reference, the node's model (with fragments, the
// step's fragment of it), to S peers drawn
// from the barrier's sampler, in the background (sendTo): one model in
// flight per peer at most (a peer whose link still carries the last one
// is passed over for another), each read from the reference block by
// block as it goes out.
func (e *epidemic) sendModel(step int64) {
	if wire.Compressed(e.cfg.Encoding) {
		e.quantizeRound()
	}
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.closed {
		return
	}
	busy := len(e.busy)
	if busy >= 2*e.s {
		e.m.sendFailed.WithLabelValues(sendSkipped).Add(float64(e.s))
		return
	}
	sent := 0
	for _, p := range e.d.Node.Sample(e.d.Life, e.s+busy) {
		if sent == e.s {
			break
		}
		if e.busy[p] {
			continue
		}
		e.busy[p] = true
		sent++
		e.wg.Go(func() { // ends within a deadline per block, or when the node closes
			last := e.sendTo(p, step)
			e.sendMu.Lock()
			delete(e.busy, last)
			e.sendMu.Unlock()
		})
	}
}

// sendTo sends this node's model to p, or another peer if p declines it
// at its offer; it returns the last peer tried (busy until the caller
// frees it).
func (e *epidemic) sendTo(p peer.ID, step int64) (last peer.ID) {
	f := e.lay.FragmentOf(step)
	first, count := e.lay.FragmentBlocks(f)
	o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: step, ModelID: e.id, N: uint32(e.p),
		Block: wire.ExchangeBlock, First: uint32(first), Count: uint32(count)}
	if e.lay.Frags() > 1 {
		o.Fragment, o.Fragments = uint32(f), uint32(e.lay.Frags())
	}
	read := e.ReadModel
	if wire.Compressed(e.cfg.Encoding) {
		o.Encoding, read = e.cfg.Encoding, e.readSent
	}
	fill := func(b int, dst []float32) {
		lo, hi := e.lay.Range(b)
		if !read(lo, hi, dst) {
			clear(dst)
		}
	}
	if poison := e.d.Faults.Poison; poison != nil {
		var ok bool
		if o, fill, ok = e.poisoned(step); !ok {
			return p
		}
	}
	var buf []float32
	if v, ok := e.bufs.Get().(*[]float32); ok {
		buf = *v
	} else {
		buf = make([]float32, min(e.p, wire.ExchangeBlock))
	}
	defer e.bufs.Put(&buf)
	// A peer that declines at the offer (it has this node's model of the
	// round, or its round is full) costs a few bytes; another is tried.
	tried := []peer.ID{p}
	for try := 1; e.sendModelTo(p, step, o, fill, buf) && try < sendTries; try++ {
		q, ok := e.another(p, tried)
		if !ok {
			return p
		}
		p = q
		tried = append(tried, q)
	}
	return p
}

// sendTries is how many peers one of a step's S sends tries before it
// gives up: the first, and others after declines at the offer.
const sendTries = 3

// another makes a peer of a fresh sample, not busy and not among tried,
// the one a send goes to in place of p (busy then); ok is false when
// there is none.
func (e *epidemic) another(p peer.ID, tried []peer.ID) (peer.ID, bool) {
	e.sendMu.Lock()
	busy := len(e.busy)
	e.sendMu.Unlock()
	cands := e.d.Node.Sample(e.d.Life, e.s+busy+len(tried))
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	for _, q := range cands {
		if !e.busy[q] && !slices.Contains(tried, q) && !e.closed {
			delete(e.busy, p)
			e.busy[q] = true
			return q, true
		}
	}
	return "", false
}

// poisoned is what a node playing a poisoner sends in place of its model:
// what faults.Poison makes of it (an update of the gossip wire format),
// with its own head. ok is false when there is nothing to send.
func (e *epidemic) poisoned(step int64) (wire.Offer, func(int, []float32), bool) {
	params := make([]float32, e.p)
	if !e.ReadModel(0, e.p, params) {
		return wire.Offer{}, nil, false
	}
	payload := e.d.Faults.Poison(step, params)
	if payload == nil {
		return wire.Offer{}, nil, false
	}
	u, err := gossip.DecodeUpdate(payload)
	if err != nil || len(u.Values) == 0 {
		return wire.Offer{}, nil, false
	}
	n := len(u.Values)
	o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: u.Step, ModelID: u.ModelID, N: uint32(u.ParamCount),
		Block: wire.ExchangeBlock, Count: uint32(wire.Blocks(n))}
	return o, func(b int, dst []float32) {
		lo, hi := wire.BlockRange(b, n)
		copy(dst, u.Values[lo:hi])
	}, true
}
