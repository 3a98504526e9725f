package gossip

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestHalfRoundTripAllValues(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := halfToFloat32(h)
		if f != f { // NaN: must stay NaN
			if g := halfToFloat32(float32ToHalf(f)); g == g {
				t.Fatalf("NaN %#04x did not stay NaN", h)
			}
			continue
		}
		if got := float32ToHalf(f); got != h {
			t.Fatalf("half %#04x -> %v -> %#04x", h, f, got)
		}
	}
}

func TestHalfKnownValues(t *testing.T) {
	cases := []struct {
		f float32
		h uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65520, 0x7c00}, // rounds up to Inf
		{1e6, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{5.9604645e-08, 0x0001}, // smallest subnormal
		{2.9802322e-08, 0x0000}, // exactly half of it: ties to even -> 0
		{2.9802326e-08, 0x0001}, // just above half
		{6.1035156e-05, 0x0400}, // smallest normal
		{1.0009766, 0x3c01},     // 1 + 2^-10
		{1.00048828125, 0x3c00}, // 1 + 2^-11: tie, to even
		{1.00146484375, 0x3c02}, // 1 + 3·2^-11: tie, to even (up)
	}
	for _, c := range cases {
		if got := float32ToHalf(c.f); got != c.h {
			t.Errorf("float32ToHalf(%g) = %#04x, want %#04x", c.f, got, c.h)
		}
	}
}

// TestHalfNearest checks that conversion picks the nearest half for random
// inputs across the whole half range (including subnormals).
func TestHalfNearest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		f := float32(math.Ldexp(r.Float64()*2-1, r.IntN(42)-26))
		h := float32ToHalf(f)
		got := math.Abs(float64(halfToFloat32(h)) - float64(f))
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 || (n^h)&0x8000 != 0 {
				continue // Inf/NaN or sign flip
			}
			if d := math.Abs(float64(halfToFloat32(n)) - float64(f)); d < got {
				t.Fatalf("f=%g: chose %#04x (err %g) but %#04x is nearer (err %g)", f, h, got, n, d)
			}
		}
	}
}
