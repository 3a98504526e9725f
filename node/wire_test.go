package node

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"runtime"
	"testing"
)

func TestStepCodecRoundTrip(t *testing.T) {
	for _, q := range []StepRequest{{}, {Step: 42, Estimate: 199.5}, {Leaving: true, Step: math.MaxInt64}} {
		got, err := UnmarshalStepRequest(MarshalStepRequest(q))
		if err != nil || got != q {
			t.Errorf("request %+v: got %+v, %v", q, got, err)
		}
	}
	for _, r := range []StepReply{{}, {Step: 7, Estimate: 3, Interval: 1.25}, {Leaving: true}} {
		got, err := UnmarshalStepReply(MarshalStepReply(r))
		if err != nil || got != r {
			t.Errorf("reply %+v: got %+v, %v", r, got, err)
		}
	}
}

func TestStepCodecRejects(t *testing.T) {
	good := MarshalStepRequest(StepRequest{Step: 3, Estimate: 10})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"empty":    {},
		"short":    good[:5],
		"long":     append(append([]byte(nil), good...), 0),
		"version":  mut(func(b []byte) []byte { b[0] = 9; return b }),
		"kind":     mut(func(b []byte) []byte { b[1] = 7; return b }),
		"negative": mut(func(b []byte) []byte { b[2] = 0x80; return b }),
		"nan":      MarshalStepRequest(StepRequest{Estimate: math.NaN()}),
		"inf":      MarshalStepRequest(StepRequest{Estimate: math.Inf(1)}),
	} {
		if _, err := UnmarshalStepRequest(b); !errors.Is(err, ErrWire) {
			t.Errorf("%s: want ErrWire, got %v", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"flags":    func() []byte { b := MarshalStepReply(StepReply{}); b[1] = 2; return b }(),
		"interval": MarshalStepReply(StepReply{Interval: math.NaN()}),
		"negative": MarshalStepReply(StepReply{Step: -1}),
		"short":    MarshalStepReply(StepReply{})[:10],
	} {
		if _, err := UnmarshalStepReply(b); !errors.Is(err, ErrWire) {
			t.Errorf("reply %s: want ErrWire, got %v", name, err)
		}
	}
}

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
		if _, err := UnmarshalModel(tc.b, tc.id, tc.n); !errors.Is(err, ErrWire) {
			t.Errorf("%s: want ErrWire, got %v", name, err)
		}
	}
	// Another model is not a malformed message: the error names both sides.
	for name, tc := range map[string]struct {
		id uint32
		n  int
	}{"model id": {0xdef, 4}, "count": {0xabc, 5}} {
		_, err := UnmarshalModel(b, tc.id, tc.n)
		var mm *ModelMismatchError
		if !errors.As(err, &mm) || errors.Is(err, ErrWire) {
			t.Fatalf("%s: want a ModelMismatchError, got %v", name, err)
		}
		if mm.PeerModel != 0xabc || mm.PeerParams != 4 || mm.OwnModel != tc.id || mm.OwnParams != int64(tc.n) {
			t.Errorf("%s: %+v", name, mm)
		}
	}
}

func TestFrameCap(t *testing.T) {
	var buf bytes.Buffer
	if err := writeFrame(&buf, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(bufio.NewReader(&buf), 64); !errors.Is(err, ErrWire) {
		t.Errorf("an oversized frame must be refused before reading it, got %v", err)
	}
	buf.Reset()
	_ = writeFrame(&buf, []byte{1, 2, 3})
	if b, err := readFrame(bufio.NewReader(&buf), 64); err != nil || len(b) != 3 {
		t.Errorf("frame: %v %v", b, err)
	}
	if _, err := readFrame(bufio.NewReader(bytes.NewReader([]byte{10, 1})), 64); !errors.Is(err, ErrWire) {
		t.Errorf("truncated frame: %v", err)
	}
}

func FuzzStepMessages(f *testing.F) {
	f.Add(MarshalStepRequest(StepRequest{Step: 5, Estimate: 10}))
	f.Add(MarshalStepReply(StepReply{Step: 5, Estimate: 10, Interval: 1}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := UnmarshalStepRequest(b); err == nil {
			if q.Step < 0 || !(q.Estimate >= 0) || math.IsInf(q.Estimate, 0) {
				t.Fatalf("accepted a bad request %+v", q)
			}
			if again, err := UnmarshalStepRequest(MarshalStepRequest(q)); err != nil || again != q {
				t.Fatalf("re-encoding changed %+v", q)
			}
		}
		if r, err := UnmarshalStepReply(b); err == nil {
			if r.Step < 0 || !(r.Interval >= 0) || math.IsInf(r.Interval, 0) {
				t.Fatalf("accepted a bad reply %+v", r)
			}
		}
		_, _ = readFrame(bufio.NewReader(bytes.NewReader(b)), maxStepFrame)
	})
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

// A frame that declares a large body and then sends a few bytes makes the
// reader hold about what arrived, not what was declared.
func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	const declared = 64 << 20
	var in bytes.Buffer
	in.Write(binary.AppendUvarint(nil, declared))
	in.WriteString("only these bytes")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readFrame(bufio.NewReader(&in), 2*declared)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrWire) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want a wire error for the short body", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > declared/8 {
		t.Errorf("reading a short %d-byte frame allocated %d bytes", declared, got)
	}
}
