package wire

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"testing"
)

// modelReply is the bytes of a reply to a request for the blocks of
// values from first (the whole model's values), as ModelServer writes
// them.
func modelReply(step int64, shape ModelShape, first int, values []float32, count int) []byte {
	var w bytes.Buffer
	w.Write(AppendModelHead(nil, step, shape))
	for b := first; b < first+count; b++ {
		lo, hi := BlockRange(b, shape.N)
		_ = writeBlock(&w, b, values[lo:hi])
	}
	return w.Bytes()
}

func readModelBytes(b []byte, ours ModelShape, first, count int, maxAbs float64) ([]float32, int64, int, error) {
	dst := make([]float32, ours.N)
	step, taken, err := readModelReply(bufio.NewReader(bytes.NewReader(b)), ours, first, count, dst, 0, maxAbs, func() {})
	return dst, step, taken, err
}

func TestModelCodec(t *testing.T) {
	ours := ModelShape{ID: 0xabc, N: 4}
	vals := []float32{1, -2.5, 0, 3e-9}
	b := modelReply(12, ours, 0, vals, 1)
	got, step, taken, err := readModelBytes(b, ours, 0, 1, 0)
	if err != nil || step != 12 || taken != 1 || !slices.Equal(got, vals) {
		t.Fatalf("round trip: %v %d %d %v", got, step, taken, err)
	}
	// A head read alone (a peek) needs none of the parameters.
	if _, err := ReadModelHead(bufio.NewReader(bytes.NewReader(b[:1+ModelHeaderLen])), ours); err != nil {
		t.Errorf("head alone: %v", err)
	}
	nan := modelReply(1, ours, 0, []float32{1, float32(math.NaN()), 0, 0}, 1)
	big := modelReply(1, ours, 0, []float32{1, 1e9, 0, 0}, 1)
	badVersion := append([]byte(nil), b...)
	badVersion[1] = 9
	negative := modelReply(-1, ours, 0, vals, 1)
	wrongBlock := modelReply(1, ours, 0, vals, 1)
	wrongBlock[1+ModelHeaderLen+3] = 1 // block 1 where 0 was asked
	for name, tc := range map[string]struct {
		b      []byte
		maxAbs float64
	}{
		"truncated":   {b[:len(b)-3], 0},
		"head":        {b[:5], 0},
		"nan":         {nan, 0},
		"bound":       {big, 100},
		"version":     {badVersion, 0},
		"negative":    {negative, 0},
		"wrong block": {wrongBlock, 0},
	} {
		if _, _, _, err := readModelBytes(tc.b, ours, 0, 1, tc.maxAbs); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	if _, _, _, err := readModelBytes(big, ours, 0, 1, 0); err != nil {
		t.Errorf("no bound: %v", err)
	}
	// Another model is not a malformed message: the error names both sides.
	for name, want := range map[string]ModelShape{"model id": {0xdef, 4}, "count": {0xabc, 5}} {
		_, _, _, err := readModelBytes(b, want, 0, 1, 0)
		var mm *ModelMismatch
		if !errors.As(err, &mm) || errors.Is(err, ErrMalformed) || mm.Theirs != ours || mm.Ours != want {
			t.Fatalf("%s: want a ModelMismatch, got %v", name, err)
		}
	}
}

// A model of several blocks comes in any range of them: a reply cut short
// says how many whole blocks came, and they are in place.
func TestModelBlocks(t *testing.T) {
	ours := ModelShape{ID: 1, N: 2*ExchangeBlock + 5}
	vals := make([]float32, ours.N)
	for i := range vals {
		vals[i] = float32(i % 1000)
	}
	b := modelReply(3, ours, 1, vals, 2)
	got, _, taken, err := readModelBytes(b, ours, 1, 2, 0)
	if err != nil || taken != 2 || !slices.Equal(got[ExchangeBlock:], vals[ExchangeBlock:]) || got[0] != 0 {
		t.Fatalf("blocks 1 and 2: taken %d, %v", taken, err)
	}
	cut := b[:len(b)-10]
	got, _, taken, err = readModelBytes(cut, ours, 1, 2, 0)
	if !errors.Is(err, ErrMalformed) || taken != 1 || !slices.Equal(got[ExchangeBlock:2*ExchangeBlock], vals[ExchangeBlock:2*ExchangeBlock]) {
		t.Fatalf("a reply cut in its last block: taken %d, %v", taken, err)
	}
}

// FuzzModel reads any bytes as a model reply, as FetchBlocks does: a
// model of the reader's shape with finite parameters within the bound,
// or an error; never a panic.
func FuzzModel(f *testing.F) {
	f.Add(modelReply(1, ModelShape{ID: 7, N: 3}, 0, []float32{1, 2, 3}, 1))
	f.Add([]byte{byte(ModelHeaderLen), 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, step, taken, err := readModelBytes(b, ModelShape{ID: 7, N: 3}, 0, 1, 10)
		if err != nil {
			return
		}
		if taken != 1 || step < 0 {
			t.Fatalf("accepted step %d, %d blocks", step, taken)
		}
		for _, v := range got {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 10 {
				t.Fatalf("accepted the parameter %v", v)
			}
		}
	})
}

// The worked example of docs/protocols.md, section 7.4, byte for byte.
func TestModelExample(t *testing.T) {
	req := AppendModelRequest(nil, 0, 1)
	if got := hex.EncodeToString(req); got != "09020000000000000001" {
		t.Errorf("request %s", got)
	}
	reply := modelReply(12, ModelShape{ID: 0x44734f20, N: 3}, 0, []float32{0.5, -2.5, 1}, 1)
	if got := hex.EncodeToString(reply); got != "1502000000000000000c44734f20000000030004000000000000000000030000003f000020c00000803f" {
		t.Errorf("reply %s", got)
	}
}
