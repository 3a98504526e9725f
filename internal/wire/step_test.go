package wire

import (
	"errors"
	"math"
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
		if _, err := UnmarshalStepRequest(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: want ErrMalformed, got %v", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"flags":    func() []byte { b := MarshalStepReply(StepReply{}); b[1] = 2; return b }(),
		"interval": MarshalStepReply(StepReply{Interval: math.NaN()}),
		"negative": MarshalStepReply(StepReply{Step: -1}),
		"short":    MarshalStepReply(StepReply{})[:10],
	} {
		if _, err := UnmarshalStepReply(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("reply %s: want ErrMalformed, got %v", name, err)
		}
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
	})
}
