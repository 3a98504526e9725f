package wire

import (
	"errors"
	"math"
	"testing"
)

func TestModelCodec(t *testing.T) {
	snap := ModelSnapshot{Step: 12, ModelID: 0xabc, Params: []float64{1, -2.5, 0, 3e-9}}
	b := MarshalModel(snap)
	got, err := UnmarshalModel(b, 0xabc, 4)
	if err != nil || got.Step != 12 || len(got.Params) != 4 || got.Params[1] != -2.5 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	bad := MarshalModel(ModelSnapshot{ModelID: 0xabc, Params: []float64{1, math.NaN(), 0, 0}})
	for name, tc := range map[string]struct {
		b  []byte
		id uint32
		n  int
	}{
		"truncated": {b[:len(b)-3], 0xabc, 4},
		"header":    {b[:5], 0xabc, 4},
		"nan":       {bad, 0xabc, 4},
	} {
		if _, err := UnmarshalModel(tc.b, tc.id, tc.n); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	// Another model is not a malformed message: the error names both sides.
	for name, tc := range map[string]struct {
		id uint32
		n  int
	}{"model id": {0xdef, 4}, "count": {0xabc, 5}} {
		_, err := UnmarshalModel(b, tc.id, tc.n)
		if !errors.Is(err, ErrModelMismatch) || errors.Is(err, ErrMalformed) {
			t.Fatalf("%s: want ErrModelMismatch, got %v", name, err)
		}
	}
}

func FuzzModel(f *testing.F) {
	f.Add(MarshalModel(ModelSnapshot{Step: 1, ModelID: 7, Params: []float64{1, 2, 3}}))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := UnmarshalModel(b, 7, 3)
		if err == nil {
			for _, v := range m.Params {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("accepted a non-finite parameter")
				}
			}
			if len(m.Params) != 3 {
				t.Fatalf("accepted %d params", len(m.Params))
			}
		}
	})
}
