package wire

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"testing"
)

// readModel reads a whole model reply frame as FetchModel does.
func readModel(b []byte, ours ModelShape, maxAbs float64) (ModelSnapshot, error) {
	r := bufio.NewReader(bytes.NewReader(b))
	m, err := ReadModelHead(r, ours)
	if err == nil {
		m.Params, err = ReadModelParams(r, ours.N, maxAbs)
	}
	return m, err
}

func TestModelCodec(t *testing.T) {
	ours := ModelShape{ID: 0xabc, N: 4}
	snap := ModelSnapshot{Step: 12, ModelID: 0xabc, Params: []float64{1, -2.5, 0, 3e-9}}
	b := AppendModelReply(nil, snap)
	got, err := readModel(b, ours, 0)
	if err != nil || got.Step != 12 || len(got.Params) != 4 || got.Params[1] != -2.5 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	// A head read alone (a peek) needs none of the parameters.
	if _, err := ReadModelHead(bufio.NewReader(bytes.NewReader(b[:1+ModelHeaderLen])), ours); err != nil {
		t.Errorf("head alone: %v", err)
	}
	nan := AppendModelReply(nil, ModelSnapshot{ModelID: 0xabc, Params: []float64{1, math.NaN(), 0, 0}})
	big := AppendModelReply(nil, ModelSnapshot{ModelID: 0xabc, Params: []float64{1, 1e9, 0, 0}})
	badVersion := append([]byte(nil), b...)
	badVersion[1] = 9
	negative := AppendModelReply(nil, ModelSnapshot{Step: -1, ModelID: 0xabc, Params: make([]float64, 4)})
	for name, tc := range map[string]struct {
		b      []byte
		maxAbs float64
	}{
		"truncated": {b[:len(b)-3], 0},
		"head":      {b[:5], 0},
		"nan":       {nan, 0},
		"bound":     {big, 100},
		"version":   {badVersion, 0},
		"negative":  {negative, 0},
	} {
		if _, err := readModel(tc.b, ours, tc.maxAbs); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	if _, err := readModel(big, ours, 0); err != nil {
		t.Errorf("no bound: %v", err)
	}
	// Another model is not a malformed message: the error names both sides.
	for name, want := range map[string]ModelShape{"model id": {0xdef, 4}, "count": {0xabc, 5}} {
		_, err := readModel(b, want, 0)
		var mm *ModelMismatch
		if !errors.As(err, &mm) || errors.Is(err, ErrMalformed) || mm.Theirs != ours || mm.Ours != want {
			t.Fatalf("%s: want a ModelMismatch, got %v", name, err)
		}
	}
}

// FuzzModel reads any bytes as a model reply, as FetchModel does: a
// model of the reader's shape with finite parameters within the bound,
// or an error; never a panic.
func FuzzModel(f *testing.F) {
	f.Add(AppendModelReply(nil, ModelSnapshot{Step: 1, ModelID: 7, Params: []float64{1, 2, 3}}))
	f.Add([]byte{17 + 24, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readModel(b, ModelShape{ID: 7, N: 3}, 10)
		if err != nil {
			return
		}
		if len(m.Params) != 3 || m.ModelID != 7 || m.Step < 0 {
			t.Fatalf("accepted %+v", m)
		}
		for _, v := range m.Params {
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 10 {
				t.Fatalf("accepted the parameter %v", v)
			}
		}
	})
}
