package exchange

import (
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
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// testNode is an exchange's node for unit tests: at step 0, with no
// peers, on no other lineage; it records what it heard.
type testNode struct {
	step      int64
	model     *vecModel
	staleness prometheus.Histogram
	mu        sync.Mutex
	heard     map[peer.ID]int64
}

func (n *testNode) Step() int64                           { return n.step }
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
// node does its task's (Params copies out, SetParams copies in, Apply
// adds); it counts the updates applied.
type vecModel struct {
	mu      sync.Mutex
	p       []float32
	applied int
}

func (m *vecModel) NumParams() int  { return len(m.p) }
func (m *vecModel) ModelID() uint32 { return 7 }
func (m *vecModel) Params() []float32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.p)
}
func (m *vecModel) SetParams(p []float32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.p, p)
}
func (m *vecModel) Apply(u []float32, _ int64) error {
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
	node := &testNode{model: &vecModel{p: make([]float32, params)}, heard: map[peer.ID]int64{},
		staleness: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "staleness"})}
	c := func(name string) prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: name}) }
	d := Deps{Job: "test", Model: node.model, Node: node, Life: context.Background(), Log: slog.New(slog.DiscardHandler), Registry: reg,
		Counters: Counters{Applied: c("applied"), ApplyRejected: c("rejected"), NormRefused: c("norm"), Staleness: node.staleness}}
	return &base{d: d, cfg: cfg, m: newMetrics(reg)}, node
}

// exchangeFor is an epidemic exchange of testBase's.
func exchangeFor(t testing.TB, params, s int, normBound float64) (*epidemic, *testNode) {
	b, node := testBase(t, params, s, normBound)
	return newEpidemic(b), node
}

// takeModel is what the exchange protocol's server does with one
// received model: the offer (checked as the server does), then its
// blocks, then the end. It returns why the model was refused, or "".
func takeModel(e *epidemic, from peer.ID, kind Kind, step int64, values []float32) gossip.Reason {
	o := wire.Offer{Kind: byte(kind), Encoding: wire.EncodingFloat32, Step: step, ModelID: 7, N: uint32(len(values)),
		Block: wire.ExchangeBlock, Count: uint32(wire.Blocks(len(values)))}
	r := o.Check(7, e.p)
	if r == "" {
		r = e.Offer(from, o)
	}
	if r != "" {
		return r
	}
	taken := 0
	for b := range int(o.Count) {
		lo, hi := wire.BlockRange(b, len(values))
		if r = e.Block(from, o, b, values[lo:hi]); r != "" {
			break
		}
		taken++
	}
	return e.End(from, o, taken, r)
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
		{"epidemic:4:bf16", Spec{Kind: Epidemic, S: 4, Encoding: wire.EncodingBF16}, ""},
		{"epidemic:2:int8", Spec{Kind: Epidemic, S: 2, Encoding: wire.EncodingInt8}, ""},
		{"epidemic:3:int4", Spec{Kind: Epidemic, S: 3, Encoding: wire.EncodingInt4}, ""},
		{"epidemic:4:fragments=2", Spec{Kind: Epidemic, S: 4, Fragments: 2}, ""},
		{"epidemic:3:int8:fragments=4", Spec{Kind: Epidemic, S: 3, Encoding: wire.EncodingInt8, Fragments: 4}, ""},
		{"epidemic:3:fragments=0", Spec{}, "want fragments=F"},
		{"epidemic:3:int8:fragments=x", Spec{}, "want fragments=F"},
		{"epidemic:3:fragments=2:int8", Spec{}, "want epidemic:S[:bf16|:int8|:int4][:fragments=F]"},
		{"epidemic:2:int2", Spec{}, "not one of bf16, int8, int4"},
		{"epidemic:2:", Spec{}, "not one of bf16, int8"},
		{"epidemic:x:int8", Spec{}, "whole number >= 1"},
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

// noteNorm records nrm as the norm of a step of the exchange's own on
// every block, as a push does.
func (e *epidemic) noteNorm(nrm float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for b := range e.blk {
		e.blk[b].norms.noteNorm(nrm)
	}
}

// setRef sets the exchange's reference, its model after its last step.
func (e *epidemic) setRef(v ...float32) {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	e.ref = v
	e.has.Store(true)
}

// refOf is a copy of the reference.
func (e *epidemic) refOf() []float32 {
	e.rmu.RLock()
	defer e.rmu.RUnlock()
	return slices.Clone(e.ref)
}

// roundSum is what the round holds: per block, the sum of the clip
// factors and the blocks taken, and the sum.
func (e *epidemic) roundSum() (sumC []float64, k []int, acc []float32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.blk {
		sumC, k = append(sumC, b.sumC), append(k, b.k)
	}
	for b, bl := range e.blk {
		if bl.k > 0 {
			lo, hi := e.lay.Range(b)
			acc = append(acc, e.acc[lo:hi]...)
		}
	}
	return sumC, k, acc
}

// Hostile or broken models are refused with their reason, at the offer
// when its head tells (before any of its bytes), and counted; they leave
// what the node holds as it was.
func TestTakeModelRefusesBadInput(t *testing.T) {
	ex, _ := exchangeFor(t, 3, 2, 4)
	a := peer.ID("peer-a")
	if r := takeModel(ex, a, Epidemic, 1, []float32{1.5, 1, 1}); r != wire.ReasonNoModel {
		t.Fatalf("a model before the node's first step: %q, want no_model", r)
	}
	ex.noteNorm(0.1) // own steps of norm 0.1: bound 4·3·0.1 = 1.2
	ex.setRef(1, 1, 1)
	if r := takeModel(ex, a, Epidemic, 1, []float32{1.5, 1, 1}); r != "" { // 0.5 away
		t.Fatalf("a good model was refused: %s", r)
	}
	sumC, k, acc := ex.roundSum()
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name   string
		kind   Kind
		step   int64
		values []float32
		want   gossip.Reason
	}{
		{"gossip kind", Gossip, 1, []float32{1, 1, 1}, wire.ReasonExchangeMismatch},
		{"unknown kind", 9, 1, []float32{1, 1, 1}, wire.ReasonExchangeMismatch},
		{"NaN", Epidemic, 1, []float32{nan, 1, 1}, gossip.ReasonNonFinite},
		{"Inf", Epidemic, 1, []float32{float32(math.Inf(1)), 1, 1}, gossip.ReasonNonFinite},
		{"huge", Epidemic, 1, []float32{1e30, 1, 1}, gossip.ReasonValueTooLarge},
		{"wrong length", Epidemic, 1, []float32{1, 1}, gossip.ReasonWrongLength},
		{"negative step", Epidemic, -1, []float32{1, 1, 1}, gossip.ReasonNegativeStep},
		{"step far ahead", Epidemic, 1 << 40, []float32{1, 1, 1}, gossip.ReasonStepTooFarAhead},
		{"far away", Epidemic, 1, []float32{1, 1, 3}, wire.ReasonDistance},
	} {
		// a fresh sender each time: a sender's second model of a round is
		// refused for rate whatever it holds
		from := peer.ID("peer-" + tc.name)
		if got := takeModel(ex, from, tc.kind, tc.step, tc.values); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
	}
	o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: 1, ModelID: 8, N: 3, Block: wire.ExchangeBlock, Count: 1}
	if got := o.Check(7, 3); got != gossip.ReasonModelMismatch {
		t.Errorf("another model id: %q", got)
	}
	o.ModelID, o.Block = 7, 1024
	if got := o.Check(7, 3); got != wire.ReasonBadBlock {
		t.Errorf("another block size: %q", got)
	}
	o.Block, o.Encoding = wire.ExchangeBlock, 5 // 2, 3 and 4 are bf16, int8 and int4
	if got := o.Check(7, 3); got != gossip.ReasonBadEncoding {
		t.Errorf("another encoding: %q", got)
	}
	if s2, k2, acc2 := ex.roundSum(); !slices.Equal(s2, sumC) || !slices.Equal(k2, k) || !slices.Equal(acc2, acc) {
		t.Errorf("refusals changed what the node holds: %v %v %v (was %v %v %v)", s2, k2, acc2, sumC, k, acc)
	}
	// A sender has one model per average: its next is refused at the
	// offer, for rate, until the node averages.
	if r := takeModel(ex, a, Epidemic, 2, []float32{1.25, 1, 1}); r != wire.ReasonRate {
		t.Errorf("a second model of one sender in a round: %q, want rate", r)
	}
	if st := ex.Stats(); st.Received != 1 || st.Declined[string(wire.ReasonRate)] != 0 {
		t.Errorf("stats %+v", st) // (takeModel calls the judge, not the server: nothing declined counted)
	}
	// A round takes at most poolSize senders.
	ex2, _ := exchangeFor(t, 3, 2, 4)
	ex2.noteNorm(1)
	ex2.setRef(1, 1, 1)
	for i := range ex2.poolSize() + 1 {
		p := peer.ID(fmt.Sprintf("peer-%d", i))
		r := takeModel(ex2, p, Epidemic, 1, []float32{1, 1, 1})
		if want := gossip.Reason(""); i >= ex2.poolSize() {
			want = wire.ReasonRate
			if r != want {
				t.Errorf("sender %d of a full round: %q", i, r)
			}
		} else if r != want {
			t.Errorf("sender %d: %q", i, r)
		}
	}
}

// The average is of the node's model and the model of each sender of the
// round, each with the same weight (Epidemic Learning).
func TestMergeAveragesReceived(t *testing.T) {
	ex, node := exchangeFor(t, 2, 2, 4)
	tr := node.model
	a, b := peer.ID("a"), peer.ID("b")
	ex.setRef(0, 0)                               // the model before the first step, [0 0]
	ex.Push(t.Context(), 1, []float32{1, 0}, nil) // the first step; bound 4·3·1 = 12
	tr.SetParams([]float32{1, 0})
	if r := takeModel(ex, a, Epidemic, 1, []float32{0.5, 0}); r != "" { // the first model of the round: nothing to clip it by
		t.Fatal(r)
	}
	if r := takeModel(ex, b, Epidemic, 1, []float32{300, 0}); r != wire.ReasonDistance {
		t.Fatalf("a model 300 away: %q", r)
	}
	merge := func() { // as node.Run merges a task's model
		x := tr.Params()
		if ex.Merge(-1, x) > 0 {
			tr.SetParams(x)
		}
	}
	merge()
	if p := tr.Params(); p[0] != 0.75 || p[1] != 0 { // (1 + 0.5) / 2
		t.Errorf("after averaging: %v, want [0.75 0]", p)
	}
	if r := ex.refOf(); r[0] != 0.75 {
		t.Errorf("the reference after averaging: %v", r)
	}
	st := ex.Stats()
	if st.Averaged != 1 || st.Averages != 1 || st.Rejected[string(wire.ReasonDistance)] != 0 {
		t.Errorf("stats %+v", st) // (the judge alone counts nothing rejected: the server does)
	}
	merge() // nothing new: no change
	if p := tr.Params(); p[0] != 0.75 {
		t.Errorf("an empty average changed the model: %v", p)
	}
	if !ex.cfg.Kind.Averages() || Gossip.Averages() {
		t.Error("an epidemic node scales its learning rate, or a gossip node does not")
	}
	if got := histCount(t, node.staleness); got != 1 {
		t.Errorf("staleness observed %d times, want once per model averaged", got)
	}
}

// A sender that pushes models one way, round after round, moves the
// node's model by at most the clip radius per round (clipFactor × the
// lower quartile of the senders' recent distances), shared with the other senders; an
// honest model within the radius is averaged as Epidemic Learning does.
func TestMergeClipsPull(t *testing.T) {
	ex, _ := exchangeFor(t, 2, 2, 100) // a loose distance bound: clipping alone
	ex.noteNorm(1)
	ex.setRef(0, 0)
	honest := []peer.ID{"h1", "h2", "h3"}
	evil := peer.ID("evil")
	drift := float32(0)
	x := []float32{0, 0}
	for round := range 20 {
		ref := ex.refOf()
		for i, h := range honest {
			// Honest peers sit about 1 away on either side of the model.
			if r := takeModel(ex, h, Epidemic, int64(round), []float32{ref[0] + []float32{1, -1, 0.5}[i], 0}); r != "" {
				t.Fatal(r)
			}
		}
		if r := takeModel(ex, evil, Epidemic, int64(round), []float32{ref[0] + 150, 0}); r != "" {
			t.Fatal(r)
		}
		ex.spacing = 0 // every sender every round, for the test
		before := x[0]
		if k := ex.Merge(int64(round), x); k != 4 {
			t.Fatalf("averaged %d models", k)
		}
		drift = max(drift, x[0]-before)
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
	ex2.noteNorm(1)
	ex2.setRef(0)
	ex2.blk[0].dists.add(0, 1)
	for i, y := range []float32{1, -1, 0.5} {
		if r := takeModel(ex2, peer.ID(fmt.Sprintf("h%d", i)), Epidemic, 1, []float32{y}); r != "" {
			t.Fatal(r)
		}
	}
	x2 := []float32{0}
	ex2.Merge(1, x2)
	if want := float32(0.5 / 4); x2[0] != want || counterValue(ex2.m.clipped) != 0 {
		t.Errorf("honest average moved the model to %v, want %v; clipped %v", x2[0], want, counterValue(ex2.m.clipped))
	}
}

// As many pushers as honest senders, each pusher coming every round and
// each honest sender every other: the radius reads one distance a
// sender, its lower quartile, so the round moves the model by about the
// honest senders' distance, not by the pushers'.
func TestMergeClipsPullOfAsManyPushers(t *testing.T) {
	ex, _ := exchangeFor(t, 1, 4, 100) // a loose distance bound: clipping alone
	ex.noteNorm(1)
	ex.setRef(0)
	x := []float32{0}
	drift := float32(0)
	for round := range 40 {
		ref := ex.refOf()
		ids, ys := []string{"h1", "h2", "h3"}, []float32{0.1, -0.1, 0.05}
		if round%2 == 1 {
			ids = []string{"h4", "h5", "h6"}
		}
		ids, ys = append(ids, "p1", "p2", "p3"), append(ys, 30, 30, 30)
		for i, id := range ids {
			if r := takeModel(ex, peer.ID(id), Epidemic, int64(round), []float32{ref[0] + ys[i]}); r != "" {
				t.Fatal(r)
			}
		}
		ex.spacing = 0 // every sender every round, for the test
		before := x[0]
		if k := ex.Merge(int64(round), x); k != 6 {
			t.Fatalf("averaged %d models", k)
		}
		drift = max(drift, x[0]-before)
	}
	// Under the median of every recent model's distance (30, the pushers'
	// most of the entries) they moved it 90/7 ≈ 13 a round.
	if drift > 0.1 {
		t.Errorf("three pushers of six senders moved the model by %v in a round, want about the honest distance (0.1)", drift)
	}
}

// A model made k steps behind the node's counts 1/(1 + k/StaleSteps) of a
// fresh one: it pulls the node's model less.
func TestStaleModelsWeighLess(t *testing.T) {
	for _, tc := range []struct {
		lag  int64
		want float32 // the average of 0 and a model at 2
	}{{0, 1}, {4, 0.5}, {12, 0.25}, {-3, 1}} {
		ex, node := exchangeFor(t, 1, 2, 0)
		node.step = 20
		ex.setRef(0)
		if r := takeModel(ex, "p", Epidemic, 20-tc.lag, []float32{2}); r != "" {
			t.Fatal(r)
		}
		x := []float32{0}
		ex.Merge(21, x) // (0 + w·2 − w·0)/2
		if x[0] != tc.want {
			t.Errorf("a model %d steps behind: the average %v, want %v", tc.lag, x[0], tc.want)
		}
	}
	c := DefaultConfig()
	c.StaleSteps = -1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "StaleSteps") {
		t.Errorf("StaleSteps -1 validated: %v", err)
	}
}

// A model of several blocks is averaged block by block: a transfer cut
// short counts for the blocks that came, a refused block ends the model
// and leaves the blocks before it, and StepMerge32 is Push32 then Merge32
// in one pass.
func TestBlocks(t *testing.T) {
	n := 2*wire.ExchangeBlock + 100 // three blocks, the last short
	fill := func(v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v
		}
		return x
	}
	setup := func() *epidemic {
		ex, _ := exchangeFor(t, n, 2, 0) // no distance bound
		ex.setRef(fill(0)...)
		return ex
	}
	// A whole model and a model cut after its first block.
	ex := setup()
	if r := takeModel(ex, "a", Epidemic, 1, fill(3)); r != "" {
		t.Fatal(r)
	}
	o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: 1, ModelID: 7, N: uint32(n), Block: wire.ExchangeBlock, Count: 3}
	if r := ex.Offer("b", o); r != "" {
		t.Fatal(r)
	}
	if r := ex.Block("b", o, 0, fill(6)[:wire.ExchangeBlock]); r != "" {
		t.Fatal(r)
	}
	ex.End("b", o, 1, gossip.ReasonMalformed) // the stream broke
	x := fill(0)
	if k := ex.Merge(2, x); k != 2 {
		t.Fatalf("averaged %d senders, want 2", k)
	}
	// Block 0: b's block, 6·√B away, is clipped to the radius a's made,
	// 3·√B: (0 + 3 + 6·½)/3 = 2; blocks 1 and 2: (0 + 3)/2.
	for _, c := range []struct {
		i    int
		want float32
	}{{0, 2}, {wire.ExchangeBlock, 1.5}, {n - 1, 1.5}} {
		if x[c.i] != c.want {
			t.Errorf("value %d: %v, want %v", c.i, x[c.i], c.want)
		}
	}
	if st := ex.Stats(); st.Received != 1 {
		t.Errorf("received %d whole models, want 1", st.Received)
	}
	// A bad block: the blocks before it stay.
	ex = setup()
	bad := fill(2)
	bad[wire.ExchangeBlock+5] = float32(math.NaN())
	if r := takeModel(ex, "c", Epidemic, 1, bad); r != gossip.ReasonNonFinite {
		t.Fatalf("a model with a NaN in its second block: %q", r)
	}
	if _, k, _ := ex.roundSum(); !slices.Equal(k, []int{1, 0, 0}) {
		t.Errorf("blocks taken %v, want the first alone", k)
	}
	// StepMerge32 against Push32 then Merge32.
	e1, e2 := setup(), setup()
	r := rand.New(rand.NewPCG(1, 1))
	y := make([]float32, n)
	for i := range y {
		y[i] = float32(r.NormFloat64())
	}
	for _, e := range []*epidemic{e1, e2} {
		if r := takeModel(e, "d", Epidemic, 1, y); r != "" {
			t.Fatal(r)
		}
	}
	x1, x2 := fill(0.5), fill(0.5)
	k1 := e1.Merge(2, x1)
	e2.Push(t.Context(), 2, x2, nil)
	k2 := e2.Merge(-1, x2)
	if k1 != 1 || k2 != 1 || !slices.Equal(x1, x2) || !slices.Equal(e1.refOf(), e2.refOf()) || !slices.Equal(e1.refOf(), x1) {
		t.Errorf("StepMerge32 (%d) differs from Push32 and Merge32 (%d)", k1, k2)
	}
	if n1, n2 := e1.blk[0].norms.r.Values(), e2.blk[0].norms.r.Values(); len(n1) != 1 || !slices.Equal(n1, n2) || n1[0] != 0.5*math.Sqrt(wire.ExchangeBlock) {
		t.Errorf("step norms %v and %v, want 0.5·√B", n1, n2)
	}
}

// FuzzTakeModel: whatever a peer sends, the node does not panic, and what
// it refuses leaves what it holds untouched.
func FuzzTakeModel(f *testing.F) {
	f.Add(byte(1), int64(1), float32(1), float32(2), float32(3))
	f.Add(byte(0), int64(-1), float32(1), float32(2), float32(3))
	f.Add(byte(1), int64(5), float32(math.NaN()), float32(2), float32(1e30))
	f.Fuzz(func(t *testing.T, kind byte, step int64, a, b, c float32) {
		ex, _ := exchangeFor(t, 3, 2, 4)
		ex.noteNorm(1)
		ex.setRef(rand.Float32(), 0, 0)
		_, _, before := ex.roundSum()
		r := takeModel(ex, "p", Kind(kind), step, []float32{a, b, c})
		_, _, after := ex.roundSum()
		if r != "" && !slices.Equal(before, after) {
			t.Fatalf("refused (%s) but held: %v", r, after)
		}
		for _, x := range after {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("the round holds %v", x)
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

// A peer that does not serve the exchange protocol at all is counted as
// unsupported once identify has said so, and the sender goes on.
func TestSendToUnsupportedPeer(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		hs := twoHosts(t)
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
		o := wire.Offer{Kind: byte(Epidemic), Encoding: wire.EncodingFloat32, Step: 1, ModelID: 7, N: 3, Block: wire.ExchangeBlock, Count: 1}
		b.sendModelTo(hs[1].ID(), 1, o, func(int, []float32) {}, nil)
		if st := b.Stats(); st.SendFailed[sendUnsupported] != 1 {
			t.Errorf("send to a peer without the protocol: %+v", st)
		}
	})
}

// A node sending its model compressed sends, round after round, models
// whose sum is the sum of its models within one rounding (error feedback):
// over K rounds of one model the mean sent is within half a quantum / K of
// it (a quantum of max|v|/127 in int8, max|v|/7 in int4), where rounding alone would stay half a quantum off for good. A
// restart drops the residual.
func TestCompressedSendsFeedBackTheirError(t *testing.T) {
	for _, enc := range []byte{wire.EncodingBF16, wire.EncodingInt8, wire.EncodingInt4} {
		e, _ := exchangeFor(t, 600, 1, 0)
		e.cfg.Encoding = enc
		model := make([]float32, 600)
		for i := range model {
			model[i] = 0.1 + float32(i)*1e-4 // far from every grid point of both encodings, most of them
		}
		e.setRef(slices.Clone(model)...)
		sum := make([]float64, len(model))
		const rounds = 64
		var first float64
		for r := range rounds {
			e.quantizeRound()
			sent := make([]float32, len(model))
			if !e.readSent(0, len(model), sent) {
				t.Fatal("nothing to send")
			}
			for i, x := range sent {
				sum[i] += float64(x)
				if r == 0 {
					first = max(first, math.Abs(float64(x-model[i])))
				}
			}
		}
		var worst float64
		for i, s := range sum {
			worst = max(worst, math.Abs(s/rounds-float64(model[i])))
		}
		// What is left over is within half a quantum: bf16's is about the
		// first round's error; an integer chunk's grows with the residual
		// in it, to (max|v| + half a quantum)/top.
		bound := first / rounds * 1.01
		if top := map[byte]float64{wire.EncodingInt8: 127, wire.EncodingInt4: 7}[enc]; top > 0 {
			m := float64(slices.Max(model))
			bound = m / top * (1 + 1/(2*top)) / 2 / rounds * 1.001
		}
		if first == 0 || worst > bound {
			t.Errorf("encoding %d: first round off by %g, the mean of %d rounds by %g: want <= %g", enc, first, rounds, worst, bound)
		}
		e.Restart(model)
		if slices.ContainsFunc(e.resid, func(x float32) bool { return x != 0 }) {
			t.Errorf("encoding %d: a restart left the residual", enc)
		}
	}
}

// A node's model before its first step (Merge with no step, as node.Run
// gives it) is the base its first push's norms are measured from, so the
// distance bound holds from the first push on; the node still takes no
// model before that push. Without the base the first push notes no norm,
// and a model of any distance is taken until the second.
func TestFirstPushMeasuredFromBase(t *testing.T) {
	for _, base := range []bool{true, false} {
		ex, _ := exchangeFor(t, 2, 2, 4)
		if base {
			if k := ex.Merge(-1, []float32{0, 0}); k != 0 {
				t.Fatalf("averaged %d models before the first push", k)
			}
			if r := takeModel(ex, "early", Epidemic, 0, []float32{0, 0}); r != wire.ReasonNoModel {
				t.Fatalf("a model before the first push: %q, want %q", r, wire.ReasonNoModel)
			}
		}
		ex.Push(t.Context(), 1, []float32{1, 0}, nil) // a step of norm 1: bound 4·3·1 = 12 away
		r := takeModel(ex, "far", Epidemic, 1, []float32{300, 0})
		if want := map[bool]gossip.Reason{true: wire.ReasonDistance, false: ""}[base]; r != want {
			t.Errorf("base %v: a model 300 away after the first push: %q, want %q", base, r, want)
		}
	}
	if TopicOf(None) != nil || TopicOf(newEpidemic(must(testBase(t, 1, 1, 0)))) != nil {
		t.Error("an exchange without a topic has one")
	}
}

// must is b, for a test's one-line use of testBase.
func must(b *base, _ *testNode) *base { return b }
