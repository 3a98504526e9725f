package gossip

import (
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"math"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestValidateRejections(t *testing.T) {
	const n = 16
	lim := Limits{MaxMessageSize: MaxEncodedSize(n), ParamCount: n, ModelID: 7, MaxAbsValue: 100, MaxStepAhead: 1000}
	other := mustPeerID("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")
	base := func() *Update {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i) - 8
		}
		return &Update{Sender: testSender, Step: 10, ModelID: 7, ParamCount: n, Encoding: EncodingDense32, Values: v}
	}
	enc := func(u *Update) []byte {
		b, err := EncodeUpdate(nil, u)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name      string
		data      func() []byte
		from      string
		localStep int64
		want      Reason
	}{
		{"valid", func() []byte { return enc(base()) }, "", 0, ""},
		{"valid sparse f16", func() []byte {
			u := base()
			u.Encoding, u.Indices, u.Values = EncodingTopK16, []uint32{0, 15}, []float32{1, -1}
			return enc(u)
		}, "", 0, ""},
		{"NaN", func() []byte { u := base(); u.Values[3] = float32(math.NaN()); return enc(u) }, "", 0, ReasonNonFinite},
		{"+Inf", func() []byte { u := base(); u.Values[0] = float32(math.Inf(1)); return enc(u) }, "", 0, ReasonNonFinite},
		{"-Inf float16", func() []byte {
			u := base()
			u.Encoding = EncodingDense16
			u.Values[5] = 1e6 // overflows float16 to Inf
			return enc(u)
		}, "", 0, ReasonNonFinite},
		{"too large", func() []byte { u := base(); u.Values[1] = 101; return enc(u) }, "", 0, ReasonValueTooLarge},
		{"wrong length", func() []byte {
			u := base()
			u.ParamCount, u.Values = n+1, append(u.Values, 0)
			return enc(u)
		}, "", 0, ReasonWrongLength},
		{"oversize", func() []byte { return make([]byte, MaxEncodedSize(n)+1) }, "", 0, ReasonOversize},
		{"bad version", func() []byte { b := enc(base()); b[0] = 0; return b }, "", 0, ReasonBadVersion},
		{"bad encoding", func() []byte { b := enc(base()); b[1] = 0; return b }, "", 0, ReasonBadEncoding},
		{"malformed", func() []byte { return enc(base())[:20] }, "", 0, ReasonMalformed},
		{"sender mismatch", func() []byte { return enc(base()) }, string(other), 0, ReasonSenderMismatch},
		{"model mismatch", func() []byte { u := base(); u.ModelID = 8; return enc(u) }, "", 0, ReasonModelMismatch},
		{"negative step", func() []byte { u := base(); u.Step = -1; return enc(u) }, "", 0, ReasonNegativeStep},
		{"step far ahead", func() []byte { u := base(); u.Step = 2000; return enc(u) }, "", 999, ReasonStepTooFarAhead},
		{"step just ahead", func() []byte { u := base(); u.Step = 1999; return enc(u) }, "", 999, ""},
		{"step max int64", func() []byte { u := base(); u.Step = math.MaxInt64; return enc(u) }, "", 5, ReasonStepTooFarAhead},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from := testSender
			if c.from != "" {
				from = mustPeerIDBytes(c.from)
			}
			u, err := Validate(c.data(), from, c.localStep, lim)
			if got := ReasonOf(err); got != c.want {
				t.Fatalf("reason %q (err %v), want %q", got, err, c.want)
			}
			if c.want == "" && u == nil {
				t.Fatal("valid update not returned")
			}
			if c.want != "" && u != nil {
				t.Fatal("rejected update returned")
			}
			// ValidateInto says the same, and puts the values in dst.
			dst := make([]float32, n)
			ui, err := ValidateInto(c.data(), dst, from, c.localStep, lim)
			if got := ReasonOf(err); got != c.want {
				t.Fatalf("ValidateInto: reason %q (err %v), want %q", got, err, c.want)
			}
			if c.want == "" {
				want := make([]float32, n)
				if u.Encoding.sparse() {
					for j, i := range u.Indices {
						want[i] = u.Values[j]
					}
				} else {
					copy(want, u.Values)
				}
				for i := range want {
					if dst[i] != want[i] || ui.Values[i] != want[i] {
						t.Fatalf("ValidateInto: value %d is %v (%v), want %v", i, dst[i], ui.Values[i], want[i])
					}
				}
			}
		})
	}
}

func mustPeerIDBytes(s string) peer.ID { return peer.ID(s) }

func TestReasonIgnore(t *testing.T) {
	for _, r := range Reasons {
		if r.Ignore() != (r == ReasonStepTooFarAhead) {
			t.Errorf("%s.Ignore() = %v", r, r.Ignore())
		}
	}
}

// A handled message no longer holds its decoded values: the router keeps
// the message for its gossip history, and the decoded copy doubled what
// that history held.
func TestTakeUpdate(t *testing.T) {
	u := &Update{Step: 3, Values: make([]float32, 1000)}
	msg := &pubsub.Message{ValidatorData: u}
	got, ok := takeUpdate(msg)
	if !ok || got != u {
		t.Fatalf("takeUpdate = %v, %v", got, ok)
	}
	if msg.ValidatorData != nil {
		t.Errorf("the message still holds %T", msg.ValidatorData)
	}
	if _, ok := takeUpdate(&pubsub.Message{}); ok {
		t.Error("a message without an update gave one")
	}
}
