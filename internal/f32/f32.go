// Package f32 holds the float32 vector routines the update path shares:
// the trainer API's tensors, the exchanges' wire payloads and the averages
// all hold little-endian float32 vectors, and these helpers check, view
// and measure them in one pass each, without converting them to float64.
//
// Checking is one comparison per value: the bits of |x| (the sign bit
// cleared) of NaN and ±Inf sort above those of every finite float32, and
// those of finite values sort as the values do, so "|x| ≤ bound" is
// "bits(|x|) ≤ bits(bound)", which NaN and ±Inf fail.
package f32

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// LittleEndian reports whether this CPU stores float32 as the wire does:
// views are free then, and copies otherwise.
var LittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// View returns b's little-endian float32 values in place, when the CPU is
// little-endian and b is 4-aligned; ok is false otherwise (copy with
// Decode). len(b) should be a multiple of 4: a tail is not viewed.
func View(b []byte) (v []float32, ok bool) {
	if len(b) < 4 || !LittleEndian || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, len(b) < 4
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), true
}

// Bytes returns v's memory as bytes: its little-endian wire form on a
// little-endian CPU (see LittleEndian).
func Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// Decode copies the little-endian float32 values of b into dst (len(dst)
// values; b must hold them).
func Decode(dst []float32, b []byte) {
	if LittleEndian {
		copy(Bytes(dst), b[:4*len(dst)])
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// Append appends v's little-endian wire form to b.
func Append(b []byte, v []float32) []byte {
	if LittleEndian {
		return append(b, Bytes(v)...)
	}
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// Beyond returns the index of the first value of b (little-endian
// float32) that is NaN, ±Inf or beyond ±bound, and that value; -1 when
// there is none. The common case, no such value, is one branch-free pass
// over two values at a time.
func Beyond(b []byte, bound float32) (int, float32) {
	limit := math.Float32bits(bound) & 0x7fffffff
	if !anyAbove(b, limit) {
		return -1, 0
	}
	for i := range len(b) / 4 {
		if w := binary.LittleEndian.Uint32(b[4*i:]); w&0x7fffffff > limit {
			return i, math.Float32frombits(w)
		}
	}
	return -1, 0
}

// BeyondValues is Beyond for values in memory.
func BeyondValues(v []float32, bound float32) (int, float32) {
	if LittleEndian {
		return Beyond(Bytes(v), bound)
	}
	limit := math.Float32bits(bound) & 0x7fffffff
	for i, x := range v {
		if math.Float32bits(x)&0x7fffffff > limit {
			return i, x
		}
	}
	return -1, 0
}

// anyAbove reports whether a value of b has |bits| above limit. Two
// values at a time, in a 64-bit word: for a half h ≤ 0x7fffffff, h > limit
// iff h + (0x7fffffff − limit) sets the half's top bit, and the sum cannot
// carry into the other half.
func anyAbove(b []byte, limit uint32) bool {
	n := len(b) / 8
	const abs = 0x7fffffff7fffffff
	k := uint64(0x7fffffff-limit) * 0x0000000100000001
	var top uint64
	if LittleEndian && n > 0 && uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		ws := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n)
		for len(ws) >= 4 {
			top |= (ws[0]&abs + k) | (ws[1]&abs + k) | (ws[2]&abs + k) | (ws[3]&abs + k)
			ws = ws[4:]
		}
		for _, w := range ws {
			top |= w&abs + k
		}
	} else {
		for i := range n {
			top |= binary.LittleEndian.Uint64(b[8*i:])&abs + k
		}
	}
	if top&0x8000000080000000 != 0 {
		return true
	}
	if len(b)%8 >= 4 { // an odd count: the last value
		return binary.LittleEndian.Uint32(b[8*n:])&0x7fffffff > limit
	}
	return false
}

// Norm is the L2 norm of v, summed in float64.
func Norm(v []float32) float64 {
	var s0, s1 float64
	i := 0
	for ; i+1 < len(v); i += 2 {
		a, b := float64(v[i]), float64(v[i+1])
		s0 += a * a
		s1 += b * b
	}
	if i < len(v) {
		a := float64(v[i])
		s0 += a * a
	}
	return math.Sqrt(s0 + s1)
}

// Dist is the L2 distance between a and b (of one length), summed in
// float64.
func Dist(a, b []float32) float64 {
	b = b[:len(a)]
	var s0, s1 float64
	i := 0
	for ; i+1 < len(a); i += 2 {
		d0, d1 := float64(a[i]-b[i]), float64(a[i+1]-b[i+1])
		s0 += d0 * d0
		s1 += d1 * d1
	}
	if i < len(a) {
		d := float64(a[i] - b[i])
		s0 += d * d
	}
	return math.Sqrt(s0 + s1)
}

// CopyDist copies src into dst (of one length) and returns the L2
// distance between src and what dst held: one pass for a step's new model
// and the norm of the step that made it.
func CopyDist(dst, src []float32) float64 {
	src = src[:len(dst)]
	var s float64
	for i, x := range src {
		d := float64(x - dst[i])
		s += d * d
		dst[i] = x
	}
	return math.Sqrt(s)
}

// Scale sets dst to c × src (of one length).
func Scale(dst, src []float32, c float32) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] = c * x
	}
}

// AddScaled adds c × src to dst (of one length).
func AddScaled(dst, src []float32, c float32) {
	src = src[:len(dst)]
	for i, x := range src {
		dst[i] += c * x
	}
}

// AddScaledAndAdd adds c × v to dst, then dst to v: for an average's
// change, dst = Σ c_j y_j − C·v, taken into the model v in the same pass.
func AddScaledAndAdd(dst, v []float32, c float32) {
	v = v[:len(dst)]
	for i, x := range v {
		d := dst[i] + c*x
		dst[i] = d
		v[i] = x + d
	}
}
