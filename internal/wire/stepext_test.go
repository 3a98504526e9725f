package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"testing"
)

// exampleGenesis is the genesis of docs/protocols.md's examples (6.12):
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = func() [GenesisLen]byte {
	var g [GenesisLen]byte
	b, _ := hex.DecodeString("1816687ec05700000102030405060708")
	copy(g[:], b)
	return g
}()

// The worked examples of docs/protocols.md, section 6.12, byte for byte.
func TestStepExtExamples(t *testing.T) {
	linreg := &StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21}
	frame := func(body []byte) string {
		return hex.EncodeToString(append(binary.AppendUvarint(nil, uint64(len(body))), body...))
	}
	for _, tc := range []struct {
		name, want string
		got        []byte
	}{
		{"query", "2e0101000000000000002a4068f00000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015",
			MarshalStepRequestExt(StepRequest{Step: 42, Estimate: 199.5}, *linreg)},
		{"reply", "360100000000000000002840690000000000003ff4000000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, *linreg)},
		{"reply with notices", "3c0100000000000000002840690000000000003ff400000000000001101816687ec0570000010203040506070802081f8601fc00000015030400000004",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21, Notices: true, Staleness: 4})},
		{"no fields", "1a0100000000000000002840690000000000003ff4000000000000",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{})},
		{"no model yet", "2c0100000000000000002840690000000000003ff4000000000000" + "01101816687ec05700000102030405060708",
			MarshalStepReplyExt(StepReply{Step: 40, Estimate: 200, Interval: 1.25}, StepExt{Genesis: exampleGenesis})},
		{"no model at all", "2401000000000000000028000000000000000000000000000000000208" + "0000000000000000",
			MarshalStepReplyExt(StepReply{Step: 40}, StepExt{HasModel: true})},
	} {
		if got := frame(tc.got); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
	// An unknown field (tag 9, 3 bytes) between and after the known ones
	// is skipped.
	b, _ := hex.DecodeString("0101000000000000002a4068f00000000000" + "01101816687ec05700000102030405060708" + "02081f8601fc00000015" + "0903aabbcc")
	q, err := UnmarshalStepRequestExt(b)
	if err != nil || q.Step != 42 || q.Ext == nil || *q.Ext != *linreg {
		t.Errorf("a request with an unknown field: %+v %v, %v", q, q.Ext, err)
	}
}

func TestStepExtRoundTrip(t *testing.T) {
	for _, e := range []StepExt{{}, {Genesis: exampleGenesis}, {HasModel: true}, {Notices: true}, {Genesis: [GenesisLen]byte{0x18, 15: 9}, HasModel: true, ModelID: 7, Params: math.MaxUint32, Notices: true, Staleness: 4}} {
		q := StepRequest{Leaving: true, Step: 9, Estimate: 3}
		got, err := UnmarshalStepRequestExt(MarshalStepRequestExt(q, e))
		if err != nil || got.Ext == nil || *got.Ext != e || got.Step != 9 || !got.Leaving || got.Estimate != 3 {
			t.Errorf("request %+v: got %+v (%+v), %v", e, got, got.Ext, err)
		}
		r := StepReply{Step: 9, Estimate: 3, Interval: 0.5}
		gr, err := UnmarshalStepReplyExt(MarshalStepReplyExt(r, e))
		if err != nil || gr.Ext == nil || *gr.Ext != e || gr.Step != 9 || gr.Interval != 0.5 {
			t.Errorf("reply %+v: got %+v (%+v), %v", e, gr, gr.Ext, err)
		}
	}
	// No fields read back as an empty Ext, never a nil one.
	got, err := UnmarshalStepRequestExt(MarshalStepRequestExt(StepRequest{Step: 1}, StepExt{}))
	if err != nil || got.Ext == nil || *got.Ext != (StepExt{}) {
		t.Errorf("no fields: %+v, %v", got, err)
	}
}

func TestStepExtRejects(t *testing.T) {
	req := MarshalStepRequest(StepRequest{Step: 3})
	rep := MarshalStepReply(StepReply{Step: 3})
	gen := append([]byte{fieldGenesis, GenesisLen}, exampleGenesis[:]...)
	model := []byte{fieldModel, modelFieldLen, 0, 0, 0, 1, 0, 0, 0, 2}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for name, fields := range map[string][]byte{
		"cut tag":          {fieldGenesis},
		"cut value":        gen[:10],
		"genesis length":   cat([]byte{fieldGenesis, 15}, exampleGenesis[:15]),
		"zero genesis":     cat([]byte{fieldGenesis, GenesisLen}, make([]byte, GenesisLen)),
		"model length":     {fieldModel, 4, 0, 0, 0, 1},
		"notices length":   {fieldNotices, 1, 0},
		"notices first":    cat([]byte{fieldNotices, noticesFieldLen, 0, 0, 0, 0}, gen),
		"out of order":     cat(model, gen),
		"twice":            cat(gen, gen),
		"unknown, cut":     {9, 5, 1, 2},
		"unknown, reorder": cat(model, []byte{1, 0}),
	} {
		if _, err := UnmarshalStepRequestExt(cat(req, fields)); !errors.Is(err, ErrMalformed) {
			t.Errorf("request, %s: want ErrMalformed, got %v", name, err)
		}
		if _, err := UnmarshalStepReplyExt(cat(rep, fields)); !errors.Is(err, ErrMalformed) {
			t.Errorf("reply, %s: want ErrMalformed, got %v", name, err)
		}
	}
	// The 1.0.0 body's own checks still hold, and a body shorter than it
	// is malformed.
	bad := append([]byte(nil), rep...)
	bad[1] = 2 // a flag bit 1.0.0 does not define
	for name, b := range map[string][]byte{"short request": req[:17], "short reply": rep[:25], "flags": bad} {
		_, errQ := UnmarshalStepRequestExt(b)
		_, errR := UnmarshalStepReplyExt(b)
		if !errors.Is(errQ, ErrMalformed) || !errors.Is(errR, ErrMalformed) {
			t.Errorf("%s: %v, %v", name, errQ, errR)
		}
	}
}

func FuzzStepExtMessages(f *testing.F) {
	e := &StepExt{Genesis: exampleGenesis, HasModel: true, ModelID: 0x1f8601fc, Params: 21}
	f.Add(MarshalStepRequestExt(StepRequest{Step: 5, Estimate: 10}, *e))
	f.Add(MarshalStepReplyExt(StepReply{Step: 5, Estimate: 10, Interval: 1}, *e))
	f.Add(append(MarshalStepReply(StepReply{}), 9, 2, 0, 0, 1, 16))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := UnmarshalStepRequestExt(b); err == nil {
			if q.Ext == nil || q.Step < 0 || !(q.Estimate >= 0) || math.IsInf(q.Estimate, 0) {
				t.Fatalf("accepted a bad request %+v", q)
			}
			again, err := UnmarshalStepRequestExt(MarshalStepRequestExt(q, *q.Ext))
			if err != nil || again.Ext == nil || *again.Ext != *q.Ext || again.Step != q.Step || again.Leaving != q.Leaving {
				t.Fatalf("re-encoding changed %+v (%+v): %+v, %v", q, q.Ext, again, err)
			}
		}
		if r, err := UnmarshalStepReplyExt(b); err == nil {
			if r.Ext == nil || r.Step < 0 || !(r.Interval >= 0) || math.IsInf(r.Interval, 0) {
				t.Fatalf("accepted a bad reply %+v", r)
			}
			again, err := UnmarshalStepReplyExt(MarshalStepReplyExt(r, *r.Ext))
			if err != nil || again.Ext == nil || *again.Ext != *r.Ext || again.Step != r.Step || again.Leaving != r.Leaving {
				t.Fatalf("re-encoding changed %+v (%+v): %+v, %v", r, r.Ext, again, err)
			}
		}
	})
}
