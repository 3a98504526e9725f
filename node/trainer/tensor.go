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
// sort above every finite float32.
func badValue(v []byte, bound float32) string {
	limit := math.Float32bits(bound)
	n := len(v) / 4
	if words, ok := asWords(v); ok {
		for i, w := range words {
			if w&0x7fffffff > limit {
				return describe(i, math.Float32frombits(w), bound)
			}
		}
		return ""
	}
	for i := range n {
		if w := binary.LittleEndian.Uint32(v[4*i:]); w&0x7fffffff > limit {
			return describe(i, math.Float32frombits(w), bound)
		}
	}
	return ""
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
