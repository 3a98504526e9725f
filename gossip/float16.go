package gossip

import "math"

// IEEE 754 binary16 ("half precision") conversion.
//
// It is written here rather than imported (e.g. github.com/x448/float16)
// because it is about forty lines, it is exhaustively testable (there are only
// 65 536 half values, see float16_test.go) and the package then needs no new
// module in go.mod.

// maxFloat16 is the largest finite binary16 value.
const maxFloat16 = 65504

// float32ToHalf converts f to binary16, rounding to nearest, ties to even.
// Values too large become ±Inf, values too small ±0; NaN stays NaN (quiet).
func float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff

	if exp == 0xff { // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // rebias
	if e >= 0x1f {
		return sign | 0x7c00 // overflow
	}
	if e <= 0 {
		// Subnormal half (or zero): value = m × 2^-24.
		shift := uint(126 - exp) // ≥ 14
		if shift > 24 {
			return sign // below half of the smallest subnormal
		}
		full := mant | 0x800000
		m := full >> shift
		rem := full & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++ // may carry into the smallest normal: still correct
		}
		return sign | uint16(m)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is correct, up to Inf
	}
	return sign | uint16(h)
}

// halfToFloat32 converts binary16 to float32 exactly.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0:
		v := float32(mant) * (1.0 / (1 << 24)) // exact: mant < 2^10
		if sign != 0 {
			v = -v
		}
		return v
	default:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	}
}
