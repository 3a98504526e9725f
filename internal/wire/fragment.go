package wire

import (
	"encoding/binary"
)

// Fragments: an exchanged model cut into F fragments that go on the wire
// one at a time (streaming DiLoCo: each outer step synchronises one
// fragment, so a round carries 1/F of the model). Fragment f is the
// values [f·N/F, (f+1)·N/F); each fragment is sent in blocks of
// ExchangeBlock values, its last block shorter, and the blocks of the
// model are numbered across fragments in order: fragment 0's blocks,
// then fragment 1's, and so on. With F = 1 the layout is the whole
// model's (Blocks, BlockRange) and the offer the 1.0 layout's.
//
// An offer of a fragment (F > 1) is the offer with its fourth byte 1 and
// two more fields, the fragment's index and F:
//
//	offer: version u8 (2) | exchange u8 | encoding u8 | 1 | step i64 |
//	       model id u32 | n u32 | block u32 | first u32 | count u32 | fragment u32 | fragments u32
//
// first and count must be the fragment's blocks: a receiver refuses any
// other range (ReasonBadFragment), and an offer of another F than its own
// (ReasonFragmentMismatch), before any of the values flow.

// MaxFragments bounds F.
const MaxFragments = 256

// FragmentOfferLen is the length of a fragment's offer body.
const FragmentOfferLen = OfferLen + 8

// Reasons a fragment is refused at its offer: it is cut into another
// number of fragments than the receiver's model (another job's
// configuration), or its index or blocks are not one of the receiver's
// fragments.
const (
	ReasonFragmentMismatch Reason = "fragment_mismatch"
	ReasonBadFragment      Reason = "bad_fragment"
)

// Layout is how a model of N values is cut into F fragments and blocks
// (F <= 1: one fragment, the whole model).
type Layout struct{ N, F int }

// Frags is the number of fragments, at least 1.
func (l Layout) Frags() int { return max(1, l.F) }

// Fragment is the values [lo, hi) of fragment f.
func (l Layout) Fragment(f int) (lo, hi int) {
	n, k := int64(l.N), int64(l.Frags())
	return int(int64(f) * n / k), int(int64(f+1) * n / k)
}

// FragmentBlocks are the blocks of fragment f: first to first+count−1.
func (l Layout) FragmentBlocks(f int) (first, count int) {
	for g := range f {
		lo, hi := l.Fragment(g)
		first += Blocks(hi - lo)
	}
	lo, hi := l.Fragment(f)
	return first, Blocks(hi - lo)
}

// Blocks is the number of blocks of the model.
func (l Layout) Blocks() int {
	first, count := l.FragmentBlocks(l.Frags() - 1)
	return first + count
}

// Range is the values [lo, hi) of block b (lo = hi = N past the last).
func (l Layout) Range(b int) (lo, hi int) {
	for f := range l.Frags() {
		flo, fhi := l.Fragment(f)
		nb := Blocks(fhi - flo)
		if b < nb {
			lo = flo + b*ExchangeBlock
			return lo, min(lo+ExchangeBlock, fhi)
		}
		b -= nb
	}
	return l.N, l.N
}

// FragmentOf is the fragment a step's round carries: step mod F (so that
// the F fragments take turns, each every F steps).
func (l Layout) FragmentOf(step int64) int {
	k := int64(l.Frags())
	return int(((step % k) + k) % k)
}

// Layout is the layout of the model the offer is of.
func (o Offer) Layout() Layout { return Layout{N: int(o.N), F: max(1, int(o.Fragments))} }

// CheckLayout is Check for a receiver whose model, of model ID id, is
// cut as lay: beside Check's reasons, an offer of another number of
// fragments, of a fragment lay has not, or of other blocks than its
// fragment's is refused.
func (o Offer) CheckLayout(id uint32, lay Layout) Reason {
	if r := o.checkHead(id, lay.N); r != "" {
		return r
	}
	if max(1, int(o.Fragments)) != lay.Frags() {
		return ReasonFragmentMismatch
	}
	if lay.Frags() == 1 {
		if o.Block != ExchangeBlock || o.Count == 0 || int64(o.First)+int64(o.Count) > int64(Blocks(lay.N)) {
			return ReasonBadBlock
		}
		return ""
	}
	if int(o.Fragment) >= lay.Frags() {
		return ReasonBadFragment
	}
	first, count := lay.FragmentBlocks(int(o.Fragment))
	if o.Block != ExchangeBlock || int(o.First) != first || int(o.Count) != count {
		return ReasonBadFragment
	}
	return ""
}

// appendFragment appends the fragment fields of an offer of F > 1.
func appendFragment(b []byte, o Offer) []byte {
	b = binary.BigEndian.AppendUint32(b, o.Fragment)
	return binary.BigEndian.AppendUint32(b, o.Fragments)
}
