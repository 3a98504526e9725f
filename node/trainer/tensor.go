package trainer

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/pspnode/pspnode/internal/f32"
)

// Tensors are float32 little-endian vectors (see the .proto file). These
// helpers move them between the wire or the shared file and the daemon's
// buffers in one pass each (package f32 does the work).

// badValue describes the first value of v (float32 little-endian) whose
// magnitude is not finite or exceeds bound, or returns "" if there is
// none: one comparison per value (f32.Beyond).
func badValue(v []byte, bound float32) string {
	i, x := f32.Beyond(v, bound)
	if i < 0 {
		return ""
	}
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return fmt.Sprintf("value %d is %v", i, x)
	}
	return fmt.Sprintf("value %d is %v, beyond the bound of ±%v", i, x, bound)
}

// asFloats views v as float32 values in place (f32.View).
func asFloats(v []byte) ([]float32, bool) { return f32.View(v) }

// toFloat32 copies float32 little-endian values into dst.
func toFloat32(dst []float32, v []byte) {
	if f, ok := f32.View(v); ok && len(f) >= len(dst) {
		copy(dst, f)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(v[4*i:]))
	}
}

// appendFloat32 appends v as float32 little-endian values to b.
func appendFloat32(b []byte, v []float32) []byte { return f32.Append(b, v) }

// appendFloat64As32 appends v, rounded to float32, little-endian, to b.
func appendFloat64As32(b []byte, v []float64) []byte {
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(x)))
	}
	return b
}
