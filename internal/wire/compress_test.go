package wire

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/vclock"
)

// Quantize is what a value decodes to: bf16 within half a unit of its
// 8-bit mantissa, int8 within half its chunk's scale (max|v|/127), int4
// within half of max|v|/7, a chunk of zeros exactly.
func TestQuantizeBounds(t *testing.T) {
	src := make([]float32, 3*Int8Chunk+5)
	for i := range src {
		src[i] = float32(math.Sin(float64(i)*0.7)) * float32(1+i%17) * 1e-3
	}
	for i := Int8Chunk; i < 2*Int8Chunk; i++ {
		src[i] = 0 // a chunk of zeros
	}
	for _, tc := range []struct {
		name string
		enc  byte
	}{{"bf16", EncodingBF16}, {"int8", EncodingInt8}, {"int4", EncodingInt4}} {
		dst := make([]float32, len(src))
		Quantize(tc.enc, dst, src)
		for lo := 0; lo < len(src); lo += Int8Chunk {
			hi := min(lo+Int8Chunk, len(src))
			var m float64
			for _, x := range src[lo:hi] {
				m = math.Max(m, math.Abs(float64(x)))
			}
			for i := lo; i < hi; i++ {
				err := math.Abs(float64(dst[i] - src[i]))
				bound := math.Abs(float64(src[i])) / 256 // bf16: 2^-8 relative
				switch tc.enc {
				case EncodingInt8:
					bound = m / 127 / 2 * 1.0001
				case EncodingInt4:
					bound = m / 7 / 2 * 1.0001
				}
				if err > bound {
					t.Fatalf("%s: value %d: %g decodes to %g, off by %g > %g", tc.name, i, src[i], dst[i], err, bound)
				}
			}
		}
		again := make([]float32, len(src))
		Quantize(tc.enc, again, dst)
		if !slices.Equal(again, dst) {
			t.Errorf("%s: quantizing what a receiver takes changes it", tc.name)
		}
	}
}

// int4 packs two values a byte, the first in the low half: a chunk of odd
// length takes a half byte more, and every q in [-8, 7] a byte can hold
// decodes to q times the scale.
func TestInt4Layout(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 0}, {1, 5}, {2, 5}, {3, 6}, {Int8Chunk, 4 + Int8Chunk/2}, {Int8Chunk + 1, 4 + Int8Chunk/2 + 5},
	} {
		if got := EncodedLen(EncodingInt4, tc.n); got != tc.want {
			t.Errorf("EncodedLen(int4, %d) = %d, want %d", tc.n, got, tc.want)
		}
		v := make([]float32, tc.n)
		for i := range v {
			v[i] = float32(i%15-7) * 0.25
		}
		b := encodeValues(nil, EncodingInt4, v)
		if len(b) != tc.want {
			t.Fatalf("n %d: encoded in %d bytes, EncodedLen says %d", tc.n, len(b), tc.want)
		}
		got := make([]float32, tc.n)
		if reason, err := readValues(bytes.NewReader(b), EncodingInt4, got); reason != "" || err != nil {
			t.Fatalf("n %d: %q, %v", tc.n, reason, err)
		}
		want := make([]float32, tc.n)
		Quantize(EncodingInt4, want, v)
		if !slices.Equal(got, want) {
			t.Errorf("n %d: decoded %v, Quantize says %v", tc.n, got, want)
		}
	}
	// Every half byte a hostile sender may write, at scale 0.5.
	raw := binary.LittleEndian.AppendUint32(nil, math.Float32bits(0.5))
	for q := 0; q < 16; q += 2 {
		raw = append(raw, byte(q)|byte(q+1)<<4)
	}
	got := make([]float32, 16)
	if reason, err := readValues(bytes.NewReader(raw), EncodingInt4, got); reason != "" || err != nil {
		t.Fatalf("%q, %v", reason, err)
	}
	for q := range 16 {
		want := float32(int8(q<<4)>>4) * 0.5
		if got[q] != want || want < -4 || want > 3.5 {
			t.Errorf("half byte %#x decodes to %g, want %g", q, got[q], want)
		}
	}
}

// keeper is a judge that keeps the values it takes.
type keeper struct {
	mu   sync.Mutex
	vals []float32
}

func (k *keeper) Offer(peer.ID, Offer) Reason { return "" }

func (k *keeper) Block(_ peer.ID, o Offer, b int, v []float32) Reason {
	if !f32.Within(v, f32.Limit(1e4)) {
		return ReasonNonFinite
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.vals == nil {
		k.vals = make([]float32, o.N)
	}
	lo, _ := BlockRange(b, int(o.N))
	copy(k.vals[lo:], v)
	return ""
}

func (k *keeper) End(_ peer.ID, _ Offer, _ int, r Reason) Reason { return r }

// A model sent in bf16 or int8 arrives as Quantize makes it, in
// EncodedLen bytes a block; an int8 chunk whose scale is not finite or is
// negative is refused and counted (bad_scale), a bf16 NaN as a float32's
// (non_finite), nothing of the block taken.
func TestExchangeCompressed(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		hs := connectedPair(t)
		n := ExchangeBlock + 1000
		k := &keeper{}
		rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rejected"}, []string{"reason"})
		sv := &ExchangeServer{Life: t.Context(), Timeout: time.Second, Kind: 1, ModelID: 7, N: n, Judge: k,
			Budget: NewBlockBudget(2, n), Rejected: rejected, Log: slog.New(slog.DiscardHandler)}
		hs[1].SetStreamHandler(ExchangeProtocol("t"), sv.Serve)
		model := make([]float32, n)
		for i := range model {
			model[i] = float32(math.Cos(float64(i)*0.01)) * 0.3
		}
		fill := func(b int, dst []float32) {
			lo, hi := BlockRange(b, n)
			copy(dst, model[lo:hi])
		}
		for _, enc := range []byte{EncodingBF16, EncodingInt8, EncodingInt4} {
			k.vals = nil
			o := Offer{Kind: 1, Encoding: enc, Step: 3, ModelID: 7, N: uint32(n), Block: ExchangeBlock, Count: 2}
			reason, _, st, err := SendModel(t.Context(), hs[0], hs[1].ID(), "t", o, fill, nil, time.Second)
			if err != nil || reason != "" || st.Blocks != 2 {
				t.Fatalf("encoding %d: %q, %+v, %v", enc, reason, st, err)
			}
			if want := 2*chunkHeadLen + EncodedLen(enc, ExchangeBlock) + EncodedLen(enc, 1000); st.Bytes != want {
				t.Errorf("encoding %d: %d bytes sent, want %d", enc, st.Bytes, want)
			}
			want := make([]float32, n)
			Quantize(enc, want, model)
			k.mu.Lock()
			if !slices.Equal(k.vals, want) {
				t.Errorf("encoding %d: the receiver took other values than Quantize's", enc)
			}
			k.mu.Unlock()
		}
		// Raw streams: an offer of encoding enc, then the bytes.
		raw := func(enc byte, after []byte) {
			o := Offer{Kind: 1, Encoding: enc, Step: 3, ModelID: 7, N: uint32(n), Block: ExchangeBlock, Count: 2}
			s, err := hs[0].NewStream(t.Context(), hs[1].ID(), ExchangeProtocol("t"))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = s.Write(AppendOffer(nil, o))
			_, _, _ = readReply(SmallReader(s, 8))
			_, _ = s.Write(after)
			_ = s.CloseWrite()
			_, _ = io.Copy(io.Discard, s)
			_ = s.Close()
		}
		int8Block := func(scale float32) []byte {
			b := appendBlockHead(nil, 0, ExchangeBlock)
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(scale))
			return append(b, make([]byte, Int8Chunk)...)
		}
		int4Block := func(scale float32) []byte {
			b := appendBlockHead(nil, 0, ExchangeBlock)
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(scale))
			return append(b, make([]byte, Int8Chunk/2)...)
		}
		bf16NaN := binary.LittleEndian.AppendUint16(appendBlockHead(nil, 0, ExchangeBlock), toBF16(float32(math.NaN())))
		bf16NaN = append(bf16NaN, make([]byte, 2*ExchangeBlock-2)...)
		for _, tc := range []struct {
			name  string
			enc   byte
			bytes []byte
			why   Reason
		}{
			{"int8 scale NaN", EncodingInt8, int8Block(float32(math.NaN())), ReasonBadScale},
			{"int8 scale +Inf", EncodingInt8, int8Block(float32(math.Inf(1))), ReasonBadScale},
			{"int8 scale negative", EncodingInt8, int8Block(-1), ReasonBadScale},
			{"int8 scale whose values overflow", EncodingInt8, int8Block(3e38), ReasonBadScale},
			{"int4 scale NaN", EncodingInt4, int4Block(float32(math.NaN())), ReasonBadScale},
			{"int4 scale negative", EncodingInt4, int4Block(-1), ReasonBadScale},
			{"bf16 NaN", EncodingBF16, bf16NaN, ReasonNonFinite},
		} {
			before := counted(rejected, string(tc.why))
			k.vals = nil
			raw(tc.enc, tc.bytes)
			deadline := time.Now().Add(5 * time.Second)
			for counted(rejected, string(tc.why)) == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			k.mu.Lock()
			if got := counted(rejected, string(tc.why)); got != before+1 || k.vals != nil {
				t.Errorf("%s: counted %v (was %v); values taken: %v", tc.name, got, before, k.vals != nil)
			}
			k.mu.Unlock()
		}
	})
}

// FuzzReadValues: whatever bytes a peer sends in a compressed encoding,
// reading them does not panic, and an int8 or int4 block that is not
// refused decodes to finite values.
func FuzzReadValues(f *testing.F) {
	f.Add(byte(EncodingInt4), 3, []byte{0, 0, 0, 63, 0x12, 0xf8})
	f.Add(byte(EncodingInt8), 2, []byte{0, 0, 128, 127, 1, 2})
	f.Add(byte(EncodingBF16), 1, []byte{0x80, 0x7f})
	f.Add(byte(9), 1, []byte{0})
	f.Fuzz(func(t *testing.T, enc byte, n int, b []byte) {
		n = min(max(n, 0), 3*Int8Chunk)
		v := make([]float32, n)
		reason, err := readValues(bytes.NewReader(b), enc, v)
		if err != nil || reason != "" || (enc != EncodingInt8 && enc != EncodingInt4) {
			return
		}
		for i, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("encoding %d: value %d decoded to %g", enc, i, x)
			}
		}
	})
}
