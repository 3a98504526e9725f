package gossip

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// FuzzDecodeUpdate feeds arbitrary bytes to the decoder and the validator.
// Neither may panic; whatever decodes must re-encode and decode to the same
// update. Seeds: one valid message of every encoding and index coding, and a
// few hostile shapes. Run: go test -fuzz FuzzDecodeUpdate -fuzztime 30s ./gossip/
func FuzzDecodeUpdate(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 9))
	delta := gradient(r, 200)
	for _, enc := range []Encoding{EncodingDense32, EncodingDense16, EncodingTopK32, EncodingTopK16} {
		for _, frac := range []float64{0.05, 0.3} {
			e, err := NewEncoder(len(delta), enc, frac, 1e4)
			if err != nil {
				f.Fatal(err)
			}
			b, _ := encodeDelta(f, e, delta, 3)
			f.Add(b)
		}
	}
	nan := &Update{Sender: testSender, ParamCount: 2, Encoding: EncodingDense32, Values: []float32{float32(math.NaN()), 1}}
	b, _ := EncodeUpdate(nil, nan)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{WireVersion})
	f.Add([]byte{WireVersion, byte(EncodingTopK32), 1, 'x', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0, 0xff, 0xff, 0xff, 0xff})

	lim := Limits{MaxMessageSize: MaxEncodedSize(200), ParamCount: 200, ModelID: 7, MaxAbsValue: 1e4, MaxStepAhead: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, verr := Validate(data, testSender, 0, lim)
		// ValidateInto, which reads a dense float32 update in place,
		// agrees with Validate on every input.
		if _, err := ValidateInto(data, make([]float32, 200), testSender, 0, lim); ReasonOf(err) != ReasonOf(verr) {
			t.Fatalf("ValidateInto: %v; Validate: %v", err, verr)
		}
		u, err := DecodeUpdate(data)
		if err != nil {
			return
		}
		if u.Encoding.sparse() {
			if len(u.Indices) != len(u.Values) || len(u.Indices) > u.ParamCount {
				t.Fatalf("sparse shape: %d indices, %d values, %d params", len(u.Indices), len(u.Values), u.ParamCount)
			}
			for j := 1; j < len(u.Indices); j++ {
				if u.Indices[j] <= u.Indices[j-1] {
					t.Fatal("indices not increasing")
				}
			}
		} else if len(u.Values) != u.ParamCount {
			t.Fatalf("dense: %d values for %d params", len(u.Values), u.ParamCount)
		}
		again, err := EncodeUpdate(nil, u)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		v, err := DecodeUpdate(again)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if v.Sender != u.Sender || v.Step != u.Step || v.ModelID != u.ModelID || v.ParamCount != u.ParamCount || v.Encoding != u.Encoding || !slices.Equal(v.Indices, u.Indices) {
			t.Fatal("re-decoded header or indices differ")
		}
		for j := range u.Values {
			a, b := u.Values[j], v.Values[j]
			if a != b && !(a != a && b != b) {
				t.Fatalf("value %d: %v then %v", j, a, b)
			}
		}
		if u.ParamCount <= 1<<16 {
			_ = u.Dense()
		}
	})
}
