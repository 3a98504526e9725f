package trainer

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Tensors are float32 little-endian vectors (see the .proto file). These
// helpers move them between the wire or the shared file and the daemon's
// buffers in one pass each.

// badValue describes the first value of v (float32 little-endian) whose
// magnitude is not finite or exceeds bound, or returns "" if there is
// none. Comparing the bits of |x| covers NaN and ±Inf in one test: they
// sort above every finite float32. The common case, no bad value, is one
// branch-free pass over two values at a time (anyBad); the first bad one
// is then found by a second pass.
func badValue(v []byte, bound float32) string {
	limit := math.Float32bits(bound)
	if !anyBad(v, limit) {
		return ""
	}
	for i := range len(v) / 4 {
		if w := binary.LittleEndian.Uint32(v[4*i:]); w&0x7fffffff > limit {
			return describe(i, math.Float32frombits(w), bound)
		}
	}
	return ""
}

// anyBad reports whether a value of v has |bits| above limit. Two values
// at a time, in a 64-bit word: for a half h ≤ 0x7fffffff, h > limit iff
// h + (0x7fffffff − limit) sets the half's top bit, and the sum cannot
// carry into the other half.
func anyBad(v []byte, limit uint32) bool {
	n := len(v) / 8
	const abs = 0x7fffffff7fffffff
	k := uint64(0x7fffffff-limit) * 0x0000000100000001
	var top uint64
	if littleEndian && n > 0 && uintptr(unsafe.Pointer(&v[0]))%8 == 0 {
		ws := unsafe.Slice((*uint64)(unsafe.Pointer(&v[0])), n)
		for len(ws) >= 4 {
			top |= (ws[0]&abs + k) | (ws[1]&abs + k) | (ws[2]&abs + k) | (ws[3]&abs + k)
			ws = ws[4:]
		}
		for _, w := range ws {
			top |= w&abs + k
		}
	} else {
		for i := range n {
			top |= binary.LittleEndian.Uint64(v[8*i:])&abs + k
		}
	}
	if top&0x8000000080000000 != 0 {
		return true
	}
	if len(v)%8 != 0 { // an odd count: the last value
		return binary.LittleEndian.Uint32(v[len(v)-4:])&0x7fffffff > limit
	}
	return false
}

func describe(i int, x float32, bound float32) string {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return fmt.Sprintf("value %d is %v", i, x)
	}
	return fmt.Sprintf("value %d is %v, beyond the bound of ±%v", i, x, bound)
}

// asWords views v as little-endian uint32 words in place, when the CPU is
// little-endian and v is 4-aligned.
func asWords(v []byte) ([]uint32, bool) {
	if len(v) < 4 || !littleEndian || uintptr(unsafe.Pointer(&v[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&v[0])), len(v)/4), true
}

// asFloats views v as float32 values in place (see asWords).
func asFloats(v []byte) ([]float32, bool) {
	if len(v) < 4 || !littleEndian || uintptr(unsafe.Pointer(&v[0]))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&v[0])), len(v)/4), true
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// toFloat64 converts float32 little-endian values into dst.
func toFloat64(dst []float64, v []byte) {
	if f, ok := asFloats(v); ok {
		for i, x := range f[:len(dst)] {
			dst[i] = float64(x)
		}
		return
	}
	for i := range dst {
		dst[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(v[4*i:])))
	}
}

// appendFloat32 appends v as float32 little-endian values to b.
func appendFloat32(b []byte, v []float32) []byte {
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// appendFloat64As32 appends v, rounded to float32, little-endian, to b.
func appendFloat64As32(b []byte, v []float64) []byte {
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(x)))
	}
	return b
}
