package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/f32"
)

// The update codec is hand-written rather than protobuf: the message is a
// fixed header and one large numeric array, which protobuf would encode no
// better (packed floats) and with no control over the index layout; the
// hand-written form needs no code generation, allocates only in proportion to
// the input, and is small enough to fuzz exhaustively. Every length is checked
// against the bytes that remain before anything is allocated, so a hostile
// message cannot make the decoder allocate more than a small multiple of its
// own size, and every decode error is returned, never a panic.
//
// Wire format, version 1 (all integers little-endian):
//
//	off  size  field
//	0    1     version (WireVersion = 1; anything else is rejected)
//	1    1     encoding kind (1 dense float32, 2 dense float16,
//	           3 sparse float32, 4 sparse float16)
//	2    1     L, length of the sender peer ID (1..MaxPeerIDLen)
//	3    L     sender peer ID, binary (must equal the signed pubsub From)
//	3+L  8     step, int64
//	     4     model ID, uint32 (architecture/config identifier)
//	     4     N, parameter count, uint32
//	dense:     N values (4 bytes float32 or 2 bytes float16 each), nothing after
//	sparse:    4  K, number of entries, uint32 (K <= N)
//	           1  index coding: 0 = uvarint gaps, 1 = bitmap
//	           4  B, byte length of the index block, uint32
//	           B  index block
//	           K  values (4 or 2 bytes each), nothing after
//
// Index codings. Gaps: K unsigned varints; the first is the first index, each
// next one is (index - previous index - 1), so indices are strictly
// increasing. For 10 % density the mean gap is 9, one byte per index. Bitmap:
// ceil(N/8) bytes, bit i (LSB first) set iff index i is present, padding bits
// zero, popcount == K; it is smaller above about 1/8 density. The encoder
// picks the smaller, and sends a dense message instead when that is smaller
// than the sparse one.

// WireVersion is the only update wire version this package reads and writes.
const WireVersion = 1

// MaxPeerIDLen bounds the sender field. Peer IDs are multihashes: 34 bytes for
// SHA-256 of an RSA key, 38 for an inlined Ed25519 key.
const MaxPeerIDLen = 128

// Encoding selects how the delta travels on the wire.
type Encoding uint8

const (
	// EncodingDense32 sends every parameter as float32 (the default).
	EncodingDense32 Encoding = 1
	// EncodingDense16 sends every parameter as IEEE float16.
	EncodingDense16 Encoding = 2
	// EncodingTopK32 sends the top-k entries by magnitude, values float32.
	EncodingTopK32 Encoding = 3
	// EncodingTopK16 sends the top-k entries by magnitude, values float16.
	EncodingTopK16 Encoding = 4
)

const (
	indexGaps   = 0
	indexBitmap = 1
)

// String returns the encoding's name as used in flags and metrics.
func (e Encoding) String() string {
	switch e {
	case EncodingDense32:
		return "dense32"
	case EncodingDense16:
		return "dense16"
	case EncodingTopK32:
		return "topk32"
	case EncodingTopK16:
		return "topk16"
	}
	return fmt.Sprintf("encoding(%d)", uint8(e))
}

// ParseEncoding is the inverse of Encoding.String.
func ParseEncoding(s string) (Encoding, error) {
	for _, e := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16} {
		if e.String() == s {
			return e, nil
		}
	}
	return 0, fmt.Errorf("gossip: unknown encoding %q (want dense32, dense16, topk32 or topk16)", s)
}

func (e Encoding) valid() bool  { return e >= EncodingDense32 && e <= EncodingTopK16 }
func (e Encoding) sparse() bool { return e == EncodingTopK32 || e == EncodingTopK16 }

// Sparse reports whether updates of this encoding carry some entries
// only (top-k).
func (e Encoding) Sparse() bool { return e.sparse() }
func (e Encoding) half() bool   { return e == EncodingDense16 || e == EncodingTopK16 }

func (e Encoding) valueSize() int {
	if e.half() {
		return 2
	}
	return 4
}

// Decode errors. Decoding wraps one of these with %w; Reason maps them to a
// rejection reason.
var (
	ErrUnsupportedVersion = errors.New("gossip: unsupported update version")
	ErrUnknownEncoding    = errors.New("gossip: unknown encoding")
	ErrMalformed          = errors.New("gossip: malformed update")
)

// Update is one model update: the sender's delta after its step Step. Values
// are float32 because that is what travels (float16 values are widened
// exactly). A dense update (EncodingDense32/16) has Indices == nil and
// len(Values) == ParamCount; a sparse one (EncodingTopK32/16) has len(Indices) == len(Values), indices strictly increasing
// and below ParamCount, and every absent index means zero.
type Update struct {
	Sender     peer.ID
	Step       int64
	ModelID    uint32
	ParamCount int
	Encoding   Encoding
	Indices    []uint32
	Values     []float32
	// WireSize is the size in bytes of the encoded message this update was
	// decoded from (set by DecodeUpdate; ignored by EncodeUpdate).
	WireSize int
}

// Dense returns the update as a dense vector of length ParamCount.
func (u *Update) Dense() []float32 {
	out := make([]float32, u.ParamCount)
	if !u.Encoding.sparse() {
		copy(out, u.Values)
		return out
	}
	for j, i := range u.Indices {
		if j < len(u.Values) && int(i) < len(out) {
			out[i] = u.Values[j]
		}
	}
	return out
}

// AddTo adds scale × the update to dst, which must have length ParamCount.
// A sparse update touches only its entries.
func (u *Update) AddTo(dst []float32, scale float32) error {
	if len(dst) != u.ParamCount {
		return fmt.Errorf("gossip: AddTo: vector has %d params, update %d", len(dst), u.ParamCount)
	}
	if !u.Encoding.sparse() {
		if len(u.Values) != len(dst) {
			return fmt.Errorf("gossip: AddTo: dense update has %d values, want %d", len(u.Values), len(dst))
		}
		for i, v := range u.Values {
			dst[i] += scale * v
		}
		return nil
	}
	if len(u.Values) != len(u.Indices) {
		return fmt.Errorf("gossip: AddTo: %d indices but %d values", len(u.Indices), len(u.Values))
	}
	for _, i := range u.Indices {
		if int(i) >= len(dst) {
			return fmt.Errorf("gossip: AddTo: index %d out of range %d", i, len(dst))
		}
	}
	for j, i := range u.Indices {
		dst[i] += scale * u.Values[j]
	}
	return nil
}

// headerSize is the fixed part of the header without the sender ID.
const headerSize = 1 + 1 + 1 + 8 + 4 + 4

// MaxEncodedSize is the largest message EncodeUpdate can produce for n
// parameters with a sender ID of at most MaxPeerIDLen bytes: a dense float32
// message, since the encoder never sends a sparse message larger than the
// dense one.
func MaxEncodedSize(n int) int {
	return headerSize + MaxPeerIDLen + 4*n
}

// EncodeUpdate appends the wire form of u to dst and returns the result.
// It checks structure (sizes, index order, sender length) but not values:
// validation is the receiver's job, and tests need to encode hostile input.
func EncodeUpdate(dst []byte, u *Update) ([]byte, error) {
	if !u.Encoding.valid() {
		return dst, fmt.Errorf("%w: %d", ErrUnknownEncoding, u.Encoding)
	}
	id := []byte(u.Sender)
	if len(id) == 0 || len(id) > MaxPeerIDLen {
		return dst, fmt.Errorf("gossip: encode: sender ID length %d not in 1..%d", len(id), MaxPeerIDLen)
	}
	if u.ParamCount < 0 || uint64(u.ParamCount) > math.MaxUint32 {
		return dst, fmt.Errorf("gossip: encode: param count %d out of range", u.ParamCount)
	}
	size := headerSize + len(id) + u.Encoding.valueSize()*len(u.Values)
	if u.Encoding.sparse() {
		size += 4 + 1 + 4 + min(gapsSize(u.Indices), (u.ParamCount+7)/8)
	}
	dst = appendHeader(slices.Grow(dst, size), u)

	if !u.Encoding.sparse() {
		if u.Indices != nil || len(u.Values) != u.ParamCount {
			return dst, fmt.Errorf("gossip: encode: dense update has %d values for %d params", len(u.Values), u.ParamCount)
		}
		return appendValues(dst, u.Values, u.Encoding.half()), nil
	}

	if len(u.Indices) != len(u.Values) {
		return dst, fmt.Errorf("gossip: encode: %d indices but %d values", len(u.Indices), len(u.Values))
	}
	for j, i := range u.Indices {
		if int64(i) >= int64(u.ParamCount) || (j > 0 && i <= u.Indices[j-1]) {
			return dst, fmt.Errorf("gossip: encode: indices must be strictly increasing and below %d (at %d: %d)", u.ParamCount, j, i)
		}
	}
	gapLen := gapsSize(u.Indices)
	bitmapLen := (u.ParamCount + 7) / 8
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(u.Indices)))
	if gapLen <= bitmapLen {
		dst = append(dst, indexGaps)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(gapLen))
		prev := int64(-1)
		for _, i := range u.Indices {
			dst = binary.AppendUvarint(dst, uint64(int64(i)-prev-1))
			prev = int64(i)
		}
	} else {
		dst = append(dst, indexBitmap)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(bitmapLen))
		start := len(dst)
		dst = append(dst, make([]byte, bitmapLen)...)
		for _, i := range u.Indices {
			dst[start+int(i/8)] |= 1 << (i % 8)
		}
	}
	return appendValues(dst, u.Values, u.Encoding.half()), nil
}

// appendHeader appends u's header (version to parameter count) to dst;
// the caller has checked the encoding, the sender and the count.
func appendHeader(dst []byte, u *Update) []byte {
	dst = append(dst, WireVersion, byte(u.Encoding), byte(len(u.Sender)))
	dst = append(dst, u.Sender...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(u.Step))
	dst = binary.LittleEndian.AppendUint32(dst, u.ModelID)
	return binary.LittleEndian.AppendUint32(dst, uint32(u.ParamCount))
}

// AppendDense appends to dst the wire form of a dense float32 update of
// values from sender after step, as EncodeUpdate would of an Update with
// those Values, with no copy of them beside the message's (one copy on a
// little-endian CPU). Like EncodeUpdate it does not check the values.
func AppendDense(dst []byte, sender peer.ID, step int64, modelID uint32, values []float32) ([]byte, error) {
	u := &Update{Sender: sender, Step: step, ModelID: modelID, ParamCount: len(values), Encoding: EncodingDense32}
	if len(sender) == 0 || len(sender) > MaxPeerIDLen {
		return dst, fmt.Errorf("gossip: encode: sender ID length %d not in 1..%d", len(sender), MaxPeerIDLen)
	}
	if uint64(len(values)) > math.MaxUint32 {
		return dst, fmt.Errorf("gossip: encode: param count %d out of range", len(values))
	}
	dst = appendHeader(slices.Grow(dst, headerSize+len(sender)+4*len(values)), u)
	return f32.Append(dst, values), nil
}

// sparseSize is the encoded size of a sparse payload (after the header).
func sparseSize(indices []uint32, n, valueSize int) int {
	idx := min(gapsSize(indices), (n+7)/8)
	return 4 + 1 + 4 + idx + valueSize*len(indices)
}

func gapsSize(indices []uint32) int {
	size := 0
	prev := int64(-1)
	for _, i := range indices {
		g := uint64(int64(i) - prev - 1)
		size += uvarintLen(g)
		prev = int64(i)
	}
	return size
}

func uvarintLen(x uint64) int {
	return (bits.Len64(x|1) + 6) / 7
}

func appendValues(dst []byte, vals []float32, half bool) []byte {
	start := len(dst)
	if half {
		dst = append(dst, make([]byte, 2*len(vals))...)
		out := dst[start:]
		for i, v := range vals {
			binary.LittleEndian.PutUint16(out[2*i:], float32ToHalf(v))
		}
		return dst
	}
	dst = append(dst, make([]byte, 4*len(vals))...)
	out := dst[start:]
	for i, v := range vals {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return dst
}

// reader is a bounds-checked cursor over an input message.
type reader struct {
	b   []byte
	off int
}

func (r *reader) remaining() int { return len(r.b) - r.off }

func (r *reader) bytes(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, fmt.Errorf("%w: need %d bytes at offset %d, have %d", ErrMalformed, n, r.off, r.remaining())
	}
	out := r.b[r.off : r.off+n]
	r.off += n
	return out, nil
}

func (r *reader) u8() (uint8, error) {
	b, err := r.bytes(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *reader) u32() (uint32, error) {
	b, err := r.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64() (uint64, error) {
	b, err := r.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// DecodeUpdate parses one wire message. It never panics, and it allocates at
// most a small multiple of len(b). It checks structure only; values, sizes
// against the local model, the sender and the step are checked by Validate.
func DecodeUpdate(b []byte) (*Update, error) {
	r := &reader{b: b}
	u, err := decodeHeader(r)
	if err != nil {
		return nil, err
	}
	if u.Encoding.sparse() {
		return decodeSparse(r, u)
	}
	n, vs := uint64(u.ParamCount), u.Encoding.valueSize()
	if uint64(r.remaining()) != n*uint64(vs) {
		return nil, fmt.Errorf("%w: dense payload is %d bytes, want %d", ErrMalformed, r.remaining(), n*uint64(vs))
	}
	u.Values = readValues(r.b[r.off:], int(n), u.Encoding.half())
	return u, nil
}

// decodeHeader reads the header every encoding shares: version,
// encoding, sender, step, model ID and parameter count.
func decodeHeader(r *reader) (*Update, error) {
	ver, err := r.u8()
	if err != nil {
		return nil, err
	}
	if ver != WireVersion {
		return nil, fmt.Errorf("%w: %d", ErrUnsupportedVersion, ver)
	}
	encByte, err := r.u8()
	if err != nil {
		return nil, err
	}
	enc := Encoding(encByte)
	if !enc.valid() {
		return nil, fmt.Errorf("%w: %d", ErrUnknownEncoding, encByte)
	}
	idLen, err := r.u8()
	if err != nil {
		return nil, err
	}
	if idLen == 0 || int(idLen) > MaxPeerIDLen {
		return nil, fmt.Errorf("%w: sender ID length %d", ErrMalformed, idLen)
	}
	id, err := r.bytes(int(idLen))
	if err != nil {
		return nil, err
	}
	step, err := r.u64()
	if err != nil {
		return nil, err
	}
	modelID, err := r.u32()
	if err != nil {
		return nil, err
	}
	n32, err := r.u32()
	if err != nil {
		return nil, err
	}
	u := &Update{
		Sender:   peer.ID(id), // string conversion copies
		Step:     int64(step),
		ModelID:  modelID,
		Encoding: enc,
		WireSize: len(r.b),
	}
	n := uint64(n32)
	if n > uint64(math.MaxInt32) {
		return nil, fmt.Errorf("%w: param count %d", ErrMalformed, n)
	}
	u.ParamCount = int(n)
	return u, nil
}

// decodeSparse reads a sparse payload after the header: the entry count,
// the index block and the values.
func decodeSparse(r *reader, u *Update) (*Update, error) {
	n, vs := uint64(u.ParamCount), u.Encoding.valueSize()
	k32, err := r.u32()
	if err != nil {
		return nil, err
	}
	coding, err := r.u8()
	if err != nil {
		return nil, err
	}
	blen, err := r.u32()
	if err != nil {
		return nil, err
	}
	k := uint64(k32)
	if k > n {
		return nil, fmt.Errorf("%w: %d entries for %d params", ErrMalformed, k, n)
	}
	if uint64(blen) > uint64(r.remaining()) {
		return nil, fmt.Errorf("%w: index block of %d bytes, %d remain", ErrMalformed, blen, r.remaining())
	}
	// Exact total length before allocating anything proportional to k.
	if uint64(r.remaining()) != uint64(blen)+k*uint64(vs) {
		return nil, fmt.Errorf("%w: sparse payload is %d bytes, want %d", ErrMalformed, r.remaining(), uint64(blen)+k*uint64(vs))
	}
	block, _ := r.bytes(int(blen)) // length checked above
	var indices []uint32
	switch coding {
	case indexGaps:
		indices, err = gapIndices(block, n, k)
	case indexBitmap:
		indices, err = bitmapIndices(block, n, k)
	default:
		err = fmt.Errorf("%w: index coding %d", ErrMalformed, coding)
	}
	if err != nil {
		return nil, err
	}
	if uint64(len(indices)) != k {
		return nil, fmt.Errorf("%w: %d indices, header says %d", ErrMalformed, len(indices), k)
	}
	u.Indices = indices
	u.Values = readValues(r.b[r.off:], int(k), u.Encoding.half())
	return u, nil
}

// gapIndices reads at most k increasing indices below n, coded as varint
// gaps.
func gapIndices(block []byte, n, k uint64) ([]uint32, error) {
	indices := make([]uint32, 0, k)
	next := uint64(0) // smallest admissible next index
	for len(block) > 0 {
		g, m := binary.Uvarint(block)
		if m <= 0 {
			return nil, fmt.Errorf("%w: bad index varint", ErrMalformed)
		}
		block = block[m:]
		if g >= n || next+g >= n { // next <= n, so no overflow
			return nil, fmt.Errorf("%w: index out of range %d", ErrMalformed, n)
		}
		if uint64(len(indices)) == k {
			return nil, fmt.Errorf("%w: more than %d indices", ErrMalformed, k)
		}
		i := next + g
		indices = append(indices, uint32(i))
		next = i + 1
	}
	return indices, nil
}

// bitmapIndices reads at most k indices below n, coded as a bitmap of
// (n+7)/8 bytes.
func bitmapIndices(block []byte, n, k uint64) ([]uint32, error) {
	if uint64(len(block)) != (n+7)/8 {
		return nil, fmt.Errorf("%w: bitmap is %d bytes, want %d", ErrMalformed, len(block), (n+7)/8)
	}
	indices := make([]uint32, 0, k)
	for bi, byt := range block {
		for byt != 0 {
			bit := bits.TrailingZeros8(byt)
			byt &= byt - 1
			i := uint64(bi)*8 + uint64(bit)
			if i >= n {
				return nil, fmt.Errorf("%w: bitmap padding bit set", ErrMalformed)
			}
			if uint64(len(indices)) == k {
				return nil, fmt.Errorf("%w: more than %d indices", ErrMalformed, k)
			}
			indices = append(indices, uint32(i))
		}
	}
	return indices, nil
}

// readValues reads count values; the caller has checked the length.
func readValues(b []byte, count int, half bool) []float32 {
	out := make([]float32, count)
	if half {
		for i := range out {
			out[i] = halfToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return out
	}
	f32.Decode(out, b)
	return out
}
