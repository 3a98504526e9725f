package wire

import (
	"testing"
)

// A model cut into F fragments: the fragments cover its values once, in
// order, each within 1 of N/F values; their blocks are numbered across
// fragments and cover each fragment; F = 1 is the whole model's layout.
func TestLayout(t *testing.T) {
	for _, tc := range []struct{ n, f int }{{10, 1}, {10, 3}, {2*ExchangeBlock + 5, 1}, {2*ExchangeBlock + 5, 2}, {5*ExchangeBlock + 1, 4}, {7, 7}} {
		lay := Layout{N: tc.n, F: tc.f}
		next, block := 0, 0
		for f := range lay.Frags() {
			lo, hi := lay.Fragment(f)
			if lo != next || hi-lo < tc.n/tc.f || hi-lo > tc.n/tc.f+1 {
				t.Errorf("%+v: fragment %d is [%d, %d), after %d", lay, f, lo, hi, next)
			}
			first, count := lay.FragmentBlocks(f)
			if first != block {
				t.Errorf("%+v: fragment %d's blocks begin at %d, want %d", lay, f, first, block)
			}
			at := lo
			for b := first; b < first+count; b++ {
				blo, bhi := lay.Range(b)
				if blo != at || bhi <= blo || bhi-blo > ExchangeBlock || bhi > hi {
					t.Errorf("%+v: block %d is [%d, %d), at %d in [%d, %d)", lay, b, blo, bhi, at, lo, hi)
				}
				at = bhi
			}
			if at != hi {
				t.Errorf("%+v: fragment %d's blocks end at %d, want %d", lay, f, at, hi)
			}
			next, block = hi, first+count
		}
		if next != tc.n || block != lay.Blocks() {
			t.Errorf("%+v: fragments end at %d and block %d, want %d and %d", lay, next, block, tc.n, lay.Blocks())
		}
		if tc.f == 1 {
			for b := range Blocks(tc.n) {
				lo, hi := BlockRange(b, tc.n)
				if glo, ghi := lay.Range(b); glo != lo || ghi != hi {
					t.Errorf("%+v: block %d is [%d, %d), BlockRange's [%d, %d)", lay, b, glo, ghi, lo, hi)
				}
			}
		}
	}
	if got := (Layout{N: 10, F: 3}).FragmentOf(7); got != 1 {
		t.Errorf("step 7 of 3 fragments: fragment %d, want 1", got)
	}
}

// A fragment's offer carries its index and F, and comes back as sent;
// a receiver refuses one of another F, of a fragment it has not, or of
// other blocks than the fragment's, at the offer.
func TestFragmentOfferChecked(t *testing.T) {
	n := 3*ExchangeBlock + 10
	lay := Layout{N: n, F: 3}
	first, count := lay.FragmentBlocks(2)
	good := Offer{Kind: 1, Encoding: EncodingInt8, Step: 5, ModelID: 7, N: uint32(n), Block: ExchangeBlock,
		First: uint32(first), Count: uint32(count), Fragment: 2, Fragments: 3}
	for _, tc := range []struct {
		name string
		edit func(*Offer)
		lay  Layout
		why  Reason
	}{
		{"the fragment", func(*Offer) {}, lay, ""},
		{"another F", func(o *Offer) { o.Fragments = 4 }, lay, ReasonFragmentMismatch},
		{"to a whole model", func(*Offer) {}, Layout{N: n, F: 1}, ReasonFragmentMismatch},
		{"a whole model to fragments", func(o *Offer) { o.Fragment, o.Fragments, o.First, o.Count = 0, 0, 0, 4 }, lay, ReasonFragmentMismatch},
		{"an index beyond F", func(o *Offer) { o.Fragment = 3 }, lay, ReasonBadFragment},
		{"another fragment's blocks", func(o *Offer) { o.Fragment = 1 }, lay, ReasonBadFragment},
		{"a block more", func(o *Offer) { o.Count++ }, lay, ReasonBadFragment},
		{"another model", func(o *Offer) { o.ModelID = 8 }, lay, ReasonModelMismatch},
	} {
		o := good
		tc.edit(&o)
		b := AppendOffer(nil, o)
		got, err := ParseOffer(b[1:])
		if err != nil || got.Layout() != o.Layout() || got.Fragment != o.Fragment || got.First != o.First {
			t.Fatalf("%s: the offer came back %+v, %v", tc.name, got, err)
		}
		if r := got.CheckLayout(7, tc.lay); r != tc.why {
			t.Errorf("%s: %q, want %q", tc.name, r, tc.why)
		}
	}
	bad := AppendOffer(nil, good)[1:]
	bad[len(bad)-1] = 1 // a fragment's offer of one fragment
	if _, err := ParseOffer(bad); err == nil {
		t.Error("an offer of 1 fragment in the fragment layout parsed")
	}
}
