package exchange

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/ring"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// testNode is an exchange's node for unit tests: at step 0, with no
// peers, on no other lineage; it records what it heard.
type testNode struct {
	model     *vecModel
	staleness prometheus.Histogram
	mu        sync.Mutex
	heard     map[peer.ID]int64
}

func (n *testNode) Step() int64                           { return 0 }
func (n *testNode) Sample(context.Context, int) []peer.ID { return nil }
func (n *testNode) OtherLineage(peer.ID) bool             { return false }
func (n *testNode) PeerCount() int                        { return 0 }
func (n *testNode) Population() float64                   { return 0 }
func (n *testNode) Heard(from peer.ID, step int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.heard[from] = step
}

// vecModel is a model of its parameters alone, read and written as a
// built-in task's trainer does (Params copies out, SetParams copies in,
// Apply adds); it counts the updates applied.
type vecModel struct {
	mu      sync.Mutex
	p       []float64
	applied int
}

func (m *vecModel) NumParams() int  { return len(m.p) }
func (m *vecModel) ModelID() uint32 { return 7 }
func (m *vecModel) Params() []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.p)
}
func (m *vecModel) SetParams(p []float64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.p, p)
	return nil
}
func (m *vecModel) Apply(u []float64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range u {
		m.p[i] += x
	}
	m.applied++
	return nil
}

// testBase is the base of an exchange of S = s with the norm bound
// normBound over a model of params parameters, with no host: enough to
// judge, take in and average models, and to bound updates.
func testBase(t testing.TB, params, s int, normBound float64) (*base, *testNode) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Spec = Spec{Kind: Epidemic, S: s}
	cfg.NormBound = normBound
	reg := prometheus.NewRegistry()
	node := &testNode{model: &vecModel{p: make([]float64, params)}, heard: map[peer.ID]int64{},
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "staleness"})}
	c := func(name string) prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: name}) }
	d := Deps{Job: "test", Model: node.model, Node: node, Life: context.Background(), Log: slog.New(slog.DiscardHandler), Registry: reg,
		Counters: Counters{Applied: c("applied"), ApplyRejected: c("rejected"), NormRefused: c("norm"), Staleness: node.staleness}}
	return &base{d: d, cfg: cfg, m: newMetrics(reg)}, node
}

// exchangeFor is an epidemic exchange of testBase's.
func exchangeFor(t testing.TB, params, s int, normBound float64) (*epidemic, *testNode) {
	b, node := testBase(t, params, s, normBound)
	e := &epidemic{base: b, self: "self", s: s, p: params, lim: b.cfg.limits(params, 7), norms: newOwnNorms(),
		dists: ring.New(distWindow), lastIn: make(map[peer.ID]uint64), spacing: 1, sends: make(chan struct{}, 2*s)}
	return e, node
}

// takeModel is what the exchange protocol's server does with one
// received model, header and payload at once: screen, then accept. It
// returns why the model was refused, or "".
func takeModel(e *epidemic, from peer.ID, kind Kind, payload []byte) gossip.Reason {
	if r := e.Screen(from, byte(kind)); r != "" {
		return r
	}
	return e.Accept(from, payload)
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
		err  string
	}{
		{"gossip", Spec{}, ""},
		{"epidemic:4", Spec{Kind: Epidemic, S: 4}, ""},
		{"epidemic:1", Spec{Kind: Epidemic, S: 1}, ""},
		{"epidemic:0", Spec{}, "whole number >= 1"},
		{"epidemic:-2", Spec{}, "whole number >= 1"},
		{"epidemic:x", Spec{}, "whole number >= 1"},
		{"epidemic:", Spec{}, "whole number >= 1"},
		{"epidemic", Spec{}, "want gossip or epidemic:S"},
		{"Gossip", Spec{}, "want gossip or epidemic:S"},
	} {
		got, err := Parse(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Parse(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		case err == nil && got.String() != tc.in:
			t.Errorf("%q prints as %q", tc.in, got.String())
		}
	}
	c := DefaultConfig()
	c.Spec = Spec{Kind: Epidemic} // S 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "epidemic") {
		t.Errorf("S = 0 validated: %v", err)
	}
}

// noteOwnNorm records delta as a step of the exchange's own, as push does.
func (e *epidemic) noteOwnNorm(delta []float64) {
	e.mu.Lock()
	e.norms.note(delta)
	e.mu.Unlock()
}

// setRef sets the exchange's reference, its model after its last step.
func (e *epidemic) setRef(v ...float32) {
	e.mu.Lock()
	e.ref = v
	e.mu.Unlock()
}

// roundOf lists the round's models as sender: values, for comparisons.
func (e *epidemic) roundOf() map[peer.ID][]float32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[peer.ID][]float32{}
	for _, m := range e.round {
		out[m.from] = slices.Clone(m.v)
	}
	return out
}

// modelPayload encodes params as a model of sender (model id 7).
func modelPayload(t testing.TB, sender peer.ID, step int64, params []float32) []byte {
	t.Helper()
	b, err := gossip.EncodeUpdate(nil, &gossip.Update{Sender: sender, Step: step, ModelID: 7, ParamCount: len(params),
		Encoding: gossip.EncodingDense32, Values: params})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Hostile or broken models are refused with their reason and counted, and
// leave what the node holds as it was.
func TestTakeModelRefusesBadInput(t *testing.T) {
	ex, _ := exchangeFor(t, 3, 2, 4)
	a, b := peer.ID("peer-a"), peer.ID("peer-b")
	ex.noteOwnNorm([]float64{0.1, 0, 0}) // own steps of norm 0.1: bound 4·3·0.1 = 1.2
	ex.setRef(1, 1, 1)
	good := modelPayload(t, a, 1, []float32{1.5, 1, 1}) // 0.5 away
	if r := takeModel(ex, a, Epidemic, good); r != "" {
		t.Fatalf("a good model was refused: %s", r)
	}
	held := ex.roundOf()
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name    string
		from    peer.ID
		kind    Kind
		payload []byte
		want    gossip.Reason
	}{
		{"gossip kind", b, Gossip, good, wire.ReasonExchangeMismatch},
		{"unknown kind", b, 9, good, wire.ReasonExchangeMismatch},
		{"empty", b, Epidemic, nil, gossip.ReasonMalformed},
		{"truncated", b, Epidemic, good[:len(good)-1], gossip.ReasonMalformed},
		{"bad version", b, Epidemic, append([]byte{9}, good[1:]...), gossip.ReasonBadVersion},
		{"oversize", b, Epidemic, make([]byte, gossip.MaxEncodedSize(3)+1), gossip.ReasonOversize},
		{"sender is not the stream's peer", b, Epidemic, good, gossip.ReasonSenderMismatch},
		{"NaN", b, Epidemic, modelPayload(t, b, 1, []float32{nan, 1, 1}), gossip.ReasonNonFinite},
		{"Inf", b, Epidemic, modelPayload(t, b, 1, []float32{float32(math.Inf(1)), 1, 1}), gossip.ReasonNonFinite},
		{"huge", b, Epidemic, modelPayload(t, b, 1, []float32{1e30, 1, 1}), gossip.ReasonValueTooLarge},
		{"wrong length", b, Epidemic, modelPayload(t, b, 1, []float32{1, 1}), gossip.ReasonWrongLength},
		{"negative step", b, Epidemic, modelPayload(t, b, -1, []float32{1, 1, 1}), gossip.ReasonNegativeStep},
		{"far away", b, Epidemic, modelPayload(t, b, 1, []float32{1, 1, 3}), wire.ReasonDistance},
	} {
		if got := takeModel(ex, tc.from, tc.kind, tc.payload); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
	}
	var otherModel bytes.Buffer
	otherModel.Write(good)
	otherModel.Bytes()[len(good)-3*4-8] ^= 1 // the model id's low byte
	if got := takeModel(ex, a, Epidemic, otherModel.Bytes()); got != gossip.ReasonModelMismatch {
		t.Errorf("another model id: reason %q", got)
	}
	if got := ex.roundOf(); len(got) != 1 || !slices.Equal(got[a], held[a]) {
		t.Errorf("refusals changed what the node holds: %v (was %v)", got, held)
	}
	// A sender has one vote per average: its later models replace its
	// earlier one, maxPerSender times in all, then "rate".
	later := modelPayload(t, a, 2, []float32{1.25, 1, 1})
	for i := 1; i < maxPerSender; i++ {
		if r := takeModel(ex, a, Epidemic, later); r != "" {
			t.Fatalf("model %d of a: %s", i+1, r)
		}
	}
	if r := takeModel(ex, a, Epidemic, good); r != wire.ReasonRate {
		t.Errorf("model %d of one sender: reason %q, want rate", maxPerSender+1, r)
	}
	if got := ex.roundOf(); len(got) != 1 || got[a][0] != 1.25 {
		t.Errorf("the round holds %v, want a's latest model alone", got)
	}
	if st := ex.Stats(); st.Received != maxPerSender {
		t.Errorf("received %d, want %d", st.Received, maxPerSender)
	}
	// A round takes at most poolSize senders.
	for i := range ex.poolSize() + 1 {
		p := peer.ID(fmt.Sprintf("peer-%d", i))
		r := takeModel(ex, p, Epidemic, modelPayload(t, p, 1, []float32{1, 1, 1}))
		if want := gossip.Reason(""); i >= ex.poolSize()-1 {
			want = wire.ReasonRate
			if r != want {
				t.Errorf("sender %d of a full round: %q", i, r)
			}
		} else if r != want {
			t.Errorf("sender %d: %q", i, r)
		}
	}
}

// The average is of the node's model and the latest model of each sender
// of the round, each with the same weight (Epidemic Learning); before
// the node's first step models are held, then judged.
func TestMergeAveragesReceived(t *testing.T) {
	ex, node := exchangeFor(t, 2, 2, 4)
	tr := node.model
	a, b := peer.ID("a"), peer.ID("b")
	if r := takeModel(ex, a, Epidemic, modelPayload(t, a, 1, []float32{3, 0})); r != "" {
		t.Fatal(r)
	}
	if r := takeModel(ex, b, Epidemic, modelPayload(t, b, 1, []float32{300, 0})); r != "" {
		t.Fatal(r)
	}
	ex.Merge()
	if p := tr.Params(); p[0] != 0 {
		t.Fatalf("held models were averaged before the first step: %v", p)
	}
	ex.noteOwnNorm([]float64{1, 0}) // bound 4·3·1 = 12
	ex.refFromTask(nil)             // the first step: the reference is the task's model, [0 0]
	ex.Merge()
	if p := tr.Params(); p[0] != 1.5 || p[1] != 0 { // (0 + 3) / 2; 300 is too far
		t.Errorf("after averaging: %v, want [1.5 0]", p)
	}
	st := ex.Stats()
	if st.Averaged != 1 || st.Averages != 1 || st.Rejected[string(wire.ReasonDistance)] != 1 {
		t.Errorf("stats %+v", st)
	}
	ex.Merge() // nothing new: no change
	if p := tr.Params(); p[0] != 1.5 {
		t.Errorf("an empty average changed the model: %v", p)
	}
	if ex.ScalesLR() {
		t.Error("an epidemic node scales its learning rate")
	}
	if got := histCount(t, node.staleness); got != 1 {
		t.Errorf("staleness observed %d times, want once per model averaged", got)
	}
}

// A sender that pushes models one way, round after round, moves the
// node's model by at most the clip radius per round (clipFactor × the
// median distance of recent models), shared with the other senders; an
// honest model within the radius is averaged as Epidemic Learning does.
func TestMergeClipsPull(t *testing.T) {
	ex, _ := exchangeFor(t, 2, 2, 100) // a loose distance bound: clipping alone
	ex.noteOwnNorm([]float64{1, 0})
	ex.setRef(0, 0)
	honest := []peer.ID{"h1", "h2", "h3"}
	evil := peer.ID("evil")
	delta := make([]float32, 2)
	drift := float32(0)
	for round := range 20 {
		for _, h := range honest {
			// Honest peers sit about 1 away on either side of the model.
			y := ex.ref[0] + []float32{1, -1, 0.5}[slices.Index(honest, h)]
			if r := takeModel(ex, h, Epidemic, modelPayload(t, h, int64(round), []float32{y, 0})); r != "" {
				t.Fatal(r)
			}
		}
		if r := takeModel(ex, evil, Epidemic, modelPayload(t, evil, int64(round), []float32{ex.ref[0] + 150, 0})); r != "" {
			t.Fatal(r)
		}
		before := ex.ref[0]
		if k := ex.Merge32(delta); k != 4 {
			t.Fatalf("averaged %d models", k)
		}
		drift = max(drift, ex.ref[0]-before)
	}
	// Unclipped, the pusher would move the model by 150/5 = 30 a round.
	if drift > 1.5 {
		t.Errorf("one sender moved the model by %v in a round", drift)
	}
	if got := counterValue(ex.m.clipped); got < 20 {
		t.Errorf("clipped %v models, want the pusher's every round", got)
	}
	// Without the pusher nothing is clipped and the average is exact.
	ex2, _ := exchangeFor(t, 1, 2, 100)
	ex2.noteOwnNorm([]float64{1})
	ex2.setRef(0)
	ex2.dists.Add(1)
	for i, y := range []float32{1, -1, 0.5} {
		p := peer.ID(fmt.Sprintf("h%d", i))
		if r := takeModel(ex2, p, Epidemic, modelPayload(t, p, 1, []float32{y})); r != "" {
			t.Fatal(r)
		}
	}
	d := make([]float32, 1)
	ex2.Merge32(d)
	if want := float32(0.5 / 4); d[0] != want || counterValue(ex2.m.clipped) != 0 {
		t.Errorf("honest average changed the model by %v, want %v; clipped %v", d[0], want, counterValue(ex2.m.clipped))
	}
}

// FuzzTakeModel: whatever a peer sends, the node does not panic, and what
// it refuses leaves its sum untouched.
func FuzzTakeModel(f *testing.F) {
	good, _ := gossip.EncodeUpdate(nil, &gossip.Update{Sender: "p", Step: 1, ModelID: 7, ParamCount: 3, Encoding: gossip.EncodingDense32, Values: []float32{1, 2, 3}})
	f.Add(byte(1), good)
	f.Add(byte(1), good[:10])
	f.Add(byte(0), good)
	f.Fuzz(func(t *testing.T, kind byte, payload []byte) {
		ex, _ := exchangeFor(t, 3, 2, 4)
		ex.noteOwnNorm([]float64{1, 0, 0})
		ex.setRef(rand.Float32(), 0, 0)
		r := takeModel(ex, "p", Kind(kind), payload)
		if got := ex.roundOf(); r != "" && len(got) != 0 {
			t.Fatalf("refused (%s) but held: %v", r, got)
		}
		for _, v := range ex.roundOf() {
			for _, x := range v {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("the round holds %v", x)
				}
			}
		}
	})
}

// histCount is how many observations h holds.
func histCount(t testing.TB, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// The norm bound: a received update is taken if its norm is within
// NormBound × the upper quartile of the node's own recent updates';
// before the node's first step updates are held, then judged.
func TestNormBound(t *testing.T) {
	b, node := testBase(t, 2, 1, 4)
	g := newGossip(b) // no topic: the norm bound alone
	// Before the node's first step, updates are held, then checked.
	if g.withinNorm([]float64{0.5}) || g.withinNorm([]float64{50}) {
		t.Fatal("accepted an update before the node has a reference norm")
	}
	g.noteOwnNorm([]float64{1})
	if node.model.applied != 1 {
		t.Fatalf("applied %d held updates, want 1 (the other is over the bound)", node.model.applied)
	}
	for _, nrm := range []float64{1, 2, 1, 100} { // upper quartile 2; one outlier of our own
		g.noteOwnNorm([]float64{nrm})
	}
	for _, tt := range []struct {
		in   []float64
		want bool
	}{
		{[]float64{3, 0}, true},
		{[]float64{0, -8}, true}, // exactly at the bound
		{[]float64{300, 400}, false},
		{[]float64{0, -8.01}, false},
	} {
		if got := g.withinNorm(tt.in); got != tt.want {
			t.Errorf("withinNorm(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := counterValue(b.d.Counters.NormRefused); got != 3 {
		t.Errorf("refusal counter %v, want 3 (the held one over the bound and two others)", got)
	}
	b.cfg.NormBound = 0
	if !g.withinNorm([]float64{1e9}) {
		t.Error("NormBound 0 should disable the check")
	}
}

// A peer that does not serve the exchange protocol at all is counted as
// unsupported once identify has said so, and the sender goes on.
func TestSendToUnsupportedPeer(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		var hs [2]*memnet.Host
		for i := range hs {
			h, err := mn.NewHost(10, 20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close() })
			hs[i] = h
		}
		b, _ := testBase(t, 3, 1, 4)
		b.d.Host, b.d.Life, b.d.SendTimeout = hs[0], t.Context(), time.Second
		if err := hs[0].Connect(t.Context(), peer.AddrInfo{ID: hs[1].ID(), Addrs: hs[1].Addrs()}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !b.lacksExchange(hs[1].ID()) { // identify tells what the peer serves
			if time.Now().After(deadline) {
				t.Fatal("identify never said what the peer serves")
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.sendTo(hs[1].ID(), 1, wire.FrameExchange([]byte{wire.Version, byte(Epidemic)}))
		if st := b.Stats(); st.SendFailed[sendUnsupported] != 1 {
			t.Errorf("send to a peer without the protocol: %+v", st)
		}
	})
}
