package gossip

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// mnistParams is the size of MNIST multinomial logistic regression: 784×10 + 10.
const mnistParams = 7850

// testSender is a real Ed25519 peer ID (38 bytes), the usual size.
var testSender = mustPeerID("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")

func mustPeerID(s string) peer.ID {
	id, err := peer.Decode(s)
	if err != nil {
		panic(err)
	}
	return id
}

// gradient returns a delta shaped like a real gradient step: most entries
// small, a few large; float32 values, as float64 (exactly).
func gradient(r *rand.Rand, n int) []float64 {
	d := make([]float64, n)
	for i := range d {
		d[i] = r.NormFloat64() * 1e-3
		if r.IntN(20) == 0 {
			d[i] *= 30
		}
		d[i] = float64(float32(d[i]))
	}
	return d
}

// f32s is v as float32: the tests keep their deltas as float64 (of float32
// values), so that they can sum what is sent and kept exactly.
func f32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// dense64 is u.Dense() widened to float64 (exactly).
func dense64(u *Update) []float64 {
	d := u.Dense()
	out := make([]float64, len(d))
	for i, x := range d {
		out[i] = float64(x)
	}
	return out
}

// add64 adds u to dst in float64, as the tests sum what was sent.
func add64(dst []float64, u *Update) {
	for i, x := range dense64(u) {
		dst[i] += x
	}
}

func encodeDelta(t testing.TB, e *Encoder, delta []float64, step int64) ([]byte, *Update) {
	t.Helper()
	u, err := e.Encode(f32s(delta))
	if err != nil {
		t.Fatal(err)
	}
	u.Sender, u.Step, u.ModelID = testSender, step, 7
	b, err := EncodeUpdate(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	return b, u
}

func TestDense32ExactRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	delta := make([]float64, 1000)
	for i := range delta {
		delta[i] = float64(float32(r.NormFloat64())) // float32-representable
	}
	e, err := NewEncoder(len(delta), EncodingDense32, 0, 1e4)
	if err != nil {
		t.Fatal(err)
	}
	for step := int64(0); step < 3; step++ {
		b, _ := encodeDelta(t, e, delta, step)
		got, err := DecodeUpdate(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Sender != testSender || got.Step != step || got.ModelID != 7 || got.ParamCount != len(delta) || got.Encoding != EncodingDense32 || got.WireSize != len(b) {
			t.Fatalf("header mismatch: %+v", got)
		}
		if d := dense64(got); !slices.Equal(d, delta) {
			t.Fatalf("step %d: dense float32 round trip not exact", step)
		}
	}
	for _, v := range e.Residual() {
		if v != 0 {
			t.Fatal("residual non-zero for representable values")
		}
	}
}

func TestDense16RoundTripTolerance(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	delta := gradient(r, 2000)
	e, _ := NewEncoder(len(delta), EncodingDense16, 0, 1e4)
	b, _ := encodeDelta(t, e, delta, 1)
	if want := headerSize + len(testSender) + 2*len(delta); len(b) != want {
		t.Fatalf("dense16 size %d, want %d", len(b), want)
	}
	got, err := DecodeUpdate(b)
	if err != nil {
		t.Fatal(err)
	}
	res := e.Residual()
	for i, v := range dense64(got) {
		// relative error 2^-11 for normals, absolute 2^-25 in the subnormal range
		if tol := math.Max(math.Abs(delta[i])*math.Exp2(-11), math.Exp2(-25)); math.Abs(v-delta[i]) > tol {
			t.Fatalf("value %d: %g vs %g", i, v, delta[i])
		}
		if v+res[i] != delta[i] && math.Abs(v+res[i]-delta[i]) > 1e-18 {
			t.Fatalf("residual %d does not hold the rounding error", i)
		}
	}
}

func TestTopKKeepsLargestAndFeedsBackRest(t *testing.T) {
	for _, enc := range []Encoding{EncodingTopK32, EncodingTopK16} {
		t.Run(enc.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 3))
			n := 1000
			delta := gradient(r, n)
			e, err := NewEncoder(n, enc, 0.1, 1e4)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := encodeDelta(t, e, delta, 5)
			u, err := DecodeUpdate(b)
			if err != nil {
				t.Fatal(err)
			}
			if u.Encoding != enc || len(u.Indices) != 100 || len(u.Values) != 100 {
				t.Fatalf("got %v with %d entries, want %v with 100", u.Encoding, len(u.Indices), enc)
			}
			// The chosen ones are the 100 largest magnitudes.
			mags := make([]float64, n)
			for i, d := range delta {
				mags[i] = math.Abs(d)
			}
			sorted := slices.Clone(mags)
			sort.Sort(sort.Reverse(sort.Float64Slice(sorted)))
			for _, i := range u.Indices {
				if mags[i] < sorted[99] {
					t.Fatalf("index %d (|%g|) is not in the top 100 (threshold %g)", i, mags[i], sorted[99])
				}
			}
			// sent + residual == delta: nothing is lost.
			res := e.Residual()
			sent := dense64(u)
			for i := range delta {
				if math.Abs(sent[i]+res[i]-delta[i]) > 1e-15 {
					t.Fatalf("entry %d: sent %g + residual %g != delta %g", i, sent[i], res[i], delta[i])
				}
			}
			// Next step: the residual is added, so an entry left out last
			// time and repeated now can overtake; accumulated over many
			// steps of a zero delta, everything is eventually sent.
			total := sent
			zero := make([]float64, n)
			for step := int64(6); step < 60; step++ {
				b, _ := encodeDelta(t, e, zero, step)
				u, err := DecodeUpdate(b)
				if err != nil {
					t.Fatal(err)
				}
				add64(total, u)
			}
			// float16 rounding leaves a tail that is itself re-sent, ever
			// smaller; float32 converges to rounding noise.
			tol := 1e-12
			if enc.half() {
				tol = 1e-6
			}
			res = e.Residual()
			for i := range delta {
				if math.Abs(total[i]+res[i]-delta[i]) > 1e-15 {
					t.Fatalf("entry %d: sent %g + residual %g != delta %g", i, total[i], res[i], delta[i])
				}
				if math.Abs(total[i]-delta[i]) > tol {
					t.Fatalf("entry %d: total sent %g, delta %g", i, total[i], delta[i])
				}
			}
		})
	}
}

func TestTopKFallsBackToDense(t *testing.T) {
	n := 100
	delta := make([]float64, n)
	for i := range delta {
		delta[i] = float64(i + 1)
	}
	e, _ := NewEncoder(n, EncodingTopK16, 0.9, 1e4)
	_, u := encodeDelta(t, e, delta, 0)
	if u.Encoding != EncodingDense16 {
		t.Fatalf("90%% top-k should go dense, got %v", u.Encoding)
	}
}

func TestBitmapIndexCoding(t *testing.T) {
	// 30 % density: the bitmap is smaller than gaps of mean 2.3... both work.
	n := 64
	u := &Update{Sender: testSender, ParamCount: n, Encoding: EncodingTopK32}
	for i := 0; i < n; i += 3 {
		u.Indices = append(u.Indices, uint32(i))
		u.Values = append(u.Values, float32(i))
	}
	// force sizes: gaps are 1 byte each (22), bitmap 8 bytes
	b, err := EncodeUpdate(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeUpdate(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Indices, u.Indices) || !slices.Equal(got.Values, u.Values) {
		t.Fatal("bitmap round trip mismatch")
	}
	idStart := 3 + len(testSender) + 8 + 4 + 4 + 4
	if b[idStart] != indexBitmap {
		t.Fatalf("expected bitmap index coding, got %d", b[idStart])
	}
}

func TestDecodeErrors(t *testing.T) {
	good := func() []byte {
		u := &Update{Sender: testSender, ParamCount: 100, Encoding: EncodingTopK32, Indices: []uint32{1, 3}, Values: []float32{1, 2}}
		b, err := EncodeUpdate(nil, u)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := DecodeUpdate(good()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mut  func([]byte) []byte
		want error
	}{
		{"empty", func([]byte) []byte { return nil }, ErrMalformed},
		{"version", func(b []byte) []byte { b[0] = 2; return b }, ErrUnsupportedVersion},
		{"encoding", func(b []byte) []byte { b[1] = 9; return b }, ErrUnknownEncoding},
		{"id length 0", func(b []byte) []byte { b[2] = 0; return b }, ErrMalformed},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, ErrMalformed},
		{"trailing", func(b []byte) []byte { return append(b, 0) }, ErrMalformed},
		{"index out of range", func(b []byte) []byte {
			off := 3 + len(testSender) + 8 + 4 + 4 + 4 + 1 + 4
			b[off+1] = 120 // second gap: 1+1+120 >= 100
			return b
		}, ErrMalformed},
		{"k > n", func(b []byte) []byte {
			off := 3 + len(testSender) + 8 + 4 + 4
			b[off] = 200
			return b
		}, ErrMalformed},
		{"bad index coding", func(b []byte) []byte {
			off := 3 + len(testSender) + 8 + 4 + 4 + 4
			b[off] = 7
			return b
		}, ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeUpdate(c.mut(good()))
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

func TestEncodedSizesMNIST(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	delta := gradient(r, mnistParams)
	sizes := map[Encoding]int{}
	for _, enc := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16} {
		e, err := NewEncoder(mnistParams, enc, 0.1, 1e4)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := encodeDelta(t, e, delta, 1)
		sizes[enc] = len(b)
		t.Logf("%-8s %6d bytes for %d params", enc, len(b), mnistParams)
	}
	if sizes[EncodingDense32] > 32<<10 {
		t.Errorf("dense32 %d bytes > 32 KiB", sizes[EncodingDense32])
	}
	if sizes[EncodingTopK16] > 8<<10 || sizes[EncodingTopK32] > 8<<10 {
		t.Errorf("top-k 10%% sizes %d (f16), %d (f32) > 8 KiB", sizes[EncodingTopK16], sizes[EncodingTopK32])
	}
	if MaxEncodedSize(mnistParams) > 32<<10 {
		t.Errorf("MaxEncodedSize %d > 32 KiB", MaxEncodedSize(mnistParams))
	}
}

func TestParseEncoding(t *testing.T) {
	for _, e := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16} {
		got, err := ParseEncoding(e.String())
		if err != nil || got != e {
			t.Fatalf("ParseEncoding(%q) = %v, %v", e.String(), got, err)
		}
	}
	if _, err := ParseEncoding("zip"); err == nil {
		t.Fatal("want error")
	}
}

func TestKthLargest(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 200; trial++ {
		n := 1 + r.IntN(50)
		a := make([]float64, n)
		for i := range a {
			a[i] = float64(r.IntN(10)) // many ties
		}
		s := slices.Clone(a)
		sort.Sort(sort.Reverse(sort.Float64Slice(s)))
		k := 1 + r.IntN(n)
		if got := kthLargest(slices.Clone(a), k); got != s[k-1] {
			t.Fatalf("kthLargest(%v, %d) = %v, want %v", a, k, got, s[k-1])
		}
	}
}

// AppendDense writes what EncodeUpdate writes for the same values, after
// whatever dst already holds.
func TestAppendDenseMatchesEncodeUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	values := make([]float32, 257)
	for i := range values {
		values[i] = float32(r.NormFloat64() * 1e3)
	}
	want, err := EncodeUpdate([]byte{9, 9}, &Update{Sender: testSender, Step: 42, ModelID: 7, ParamCount: len(values), Encoding: EncodingDense32, Values: values})
	if err != nil {
		t.Fatal(err)
	}
	got, err := AppendDense([]byte{9, 9}, testSender, 42, 7, values)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendDense differs from EncodeUpdate:\n got %x\nwant %x", got[:40], want[:40])
	}
	if _, err := AppendDense(nil, "", 1, 7, values); err == nil {
		t.Error("an empty sender was encoded")
	}
}
