package wire

import (
	"encoding/binary"
	"io"
	"math"
)

// Compressed encodings of an exchanged model's values (an offer's
// Encoding), beside EncodingFloat32:
//
//   - EncodingBF16: each value as bfloat16 (the float32's upper 16 bits,
//     rounded to nearest even), 2 bytes little-endian: 8 bits of
//     mantissa, float32's range.
//   - EncodingInt8: the values in chunks of Int8Chunk, each chunk a
//     float32 scale s (little-endian, finite, >= 0) and then one signed
//     byte q per value, the value being q·s; the sender picks s =
//     max|value|/127, so 1 + 4/Int8Chunk bytes a value.
//   - EncodingInt4: the same chunks and scales, s = max|value|/7, each
//     value a signed 4-bit q in [-8, 7] (the sender uses [-7, 7]), two to
//     a byte, the first value in the low half; a chunk of odd length ends
//     with an unused half byte. 1/2 + 4/Int8Chunk bytes a value.
//
// Decoding cannot make a value that is not finite from int8 or int4: a
// scale that is negative, not finite, or so large that a value of its
// chunk would not be is refused (ReasonBadScale). A bfloat16 NaN or
// infinity decodes as one and is refused by the receiver's value check
// like a float32's.
const (
	EncodingBF16 = 2
	EncodingInt8 = 3
	EncodingInt4 = 4
	// Int8Chunk is the values that share one int8 or int4 scale.
	Int8Chunk = 256
)

// Compressed says whether enc is one of the compressed encodings.
func Compressed(enc byte) bool {
	return enc == EncodingBF16 || enc == EncodingInt8 || enc == EncodingInt4
}

// ReasonBadScale: an int8 or int4 chunk's scale is negative or not
// finite, or so large that a value of the chunk would not be.
const ReasonBadScale Reason = "bad_scale"

// EncodedLen is the bytes n values take in encoding enc.
func EncodedLen(enc byte, n int) int {
	switch enc {
	case EncodingBF16:
		return 2 * n
	case EncodingInt8:
		return n + 4*((n+Int8Chunk-1)/Int8Chunk)
	case EncodingInt4:
		full, rest := n/Int8Chunk, n%Int8Chunk
		b := full * (4 + Int8Chunk/2)
		if rest > 0 {
			b += 4 + (rest+1)/2
		}
		return b
	}
	return 4 * n
}

// Quantize writes to dst what src's values decode to after encoding enc:
// what a receiver takes. dst may be src.
func Quantize(enc byte, dst, src []float32) {
	switch enc {
	case EncodingBF16:
		for i, x := range src {
			dst[i] = fromBF16(toBF16(x))
		}
	case EncodingInt8, EncodingInt4:
		var q [Int8Chunk]int8
		for lo := 0; lo < len(src); lo += Int8Chunk {
			hi := min(lo+Int8Chunk, len(src))
			s := quantizeChunk(q[:hi-lo], src[lo:hi], levels(enc))
			for i := lo; i < hi; i++ {
				dst[i] = float32(q[i-lo]) * s
			}
		}
	default:
		copy(dst, src)
	}
}

// encodeValues appends the encoding enc of v to b.
func encodeValues(b []byte, enc byte, v []float32) []byte {
	switch enc {
	case EncodingBF16:
		for _, x := range v {
			b = binary.LittleEndian.AppendUint16(b, toBF16(x))
		}
	case EncodingInt8, EncodingInt4:
		var q [Int8Chunk]int8
		for lo := 0; lo < len(v); lo += Int8Chunk {
			hi := min(lo+Int8Chunk, len(v))
			s := quantizeChunk(q[:hi-lo], v[lo:hi], levels(enc))
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(s))
			if enc == EncodingInt8 {
				for _, x := range q[:hi-lo] {
					b = append(b, byte(x))
				}
				continue
			}
			for i := 0; i < hi-lo; i += 2 {
				lo4 := byte(q[i]) & 0x0f
				var hi4 byte
				if i+1 < hi-lo {
					hi4 = byte(q[i+1]) << 4
				}
				b = append(b, lo4|hi4)
			}
		}
	}
	return b
}

// readValues reads len(v) values of encoding enc (bf16, int8 or int4) from r
// into v, a chunk at a time: a refusal reason, or an error when r fails.
func readValues(r io.Reader, enc byte, v []float32) (Reason, error) {
	var raw [4 + 2*Int8Chunk]byte
	for lo := 0; lo < len(v); lo += Int8Chunk {
		hi := min(lo+Int8Chunk, len(v))
		switch enc {
		case EncodingBF16:
			b := raw[:2*(hi-lo)]
			if _, err := io.ReadFull(r, b); err != nil {
				return "", err
			}
			for i := lo; i < hi; i++ {
				v[i] = fromBF16(binary.LittleEndian.Uint16(b[2*(i-lo):]))
			}
		case EncodingInt8, EncodingInt4:
			b := raw[:EncodedLen(enc, hi-lo)] // the chunk's scale, then its values
			if _, err := io.ReadFull(r, b); err != nil {
				return "", err
			}
			s := math.Float32frombits(binary.LittleEndian.Uint32(b))
			if !scaleOK(s, levels(enc)+1) {
				return ReasonBadScale, nil
			}
			q := b[4:]
			for i := lo; i < hi; i++ {
				if enc == EncodingInt8 {
					v[i] = float32(int8(q[i-lo])) * s
					continue
				}
				x := q[(i-lo)/2]
				if (i-lo)%2 == 1 {
					x >>= 4
				}
				v[i] = float32(int8(x<<4)>>4) * s // sign-extend the half byte
			}
		default:
			return ReasonBadEncoding, nil
		}
	}
	return "", nil
}

// scaleOK says whether a chunk's scale s is one a sender can make: not
// negative, and finite times q, the largest |q| the encoding can hold
// (128 for int8, 8 for int4), so that every value decodes finite.
func scaleOK(s, q float32) bool {
	return s >= 0 && float64(s)*float64(q) <= math.MaxFloat32
}

// levels is the largest |q| encoding enc (int8 or int4) sends.
func levels(enc byte) float32 {
	if enc == EncodingInt4 {
		return 7
	}
	return 127
}

// quantizeChunk quantizes v to q (len(v) <= Int8Chunk) and returns the
// scale: max|v|/top, each q the nearest whole multiple of it, within
// ±top. Values that are not finite make the scale 0 (the model is not
// sent then: the sender checks its values before).
func quantizeChunk(q []int8, v []float32, top float32) float32 {
	var m float32
	for _, x := range v {
		if a := float32(math.Abs(float64(x))); a > m {
			m = a
		}
	}
	s := m / top
	if s == 0 || math.IsInf(float64(s), 0) || math.IsNaN(float64(s)) {
		clear(q)
		return 0
	}
	for i, x := range v {
		r := math.RoundToEven(float64(x / s))
		q[i] = int8(max(-float64(top), min(float64(top), r)))
	}
	return s
}

// toBF16 rounds x to the nearest bfloat16 (ties to even); a NaN stays a
// NaN.
func toBF16(x float32) uint16 {
	b := math.Float32bits(x)
	if x != x {
		return uint16(b>>16) | 0x40 // quiet, whatever the low bits held
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func fromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
