package node

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
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/model"
)

func TestParseExchange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Exchange
		err  string
	}{
		{"gossip", Exchange{}, ""},
		{"epidemic:4", Exchange{Kind: ExchangeEpidemic, S: 4}, ""},
		{"epidemic:1", Exchange{Kind: ExchangeEpidemic, S: 1}, ""},
		{"epidemic:0", Exchange{}, "whole number >= 1"},
		{"epidemic:-2", Exchange{}, "whole number >= 1"},
		{"epidemic:x", Exchange{}, "whole number >= 1"},
		{"epidemic:", Exchange{}, "whole number >= 1"},
		{"epidemic", Exchange{}, "want gossip or epidemic:S"},
		{"Gossip", Exchange{}, "want gossip or epidemic:S"},
	} {
		got, err := ParseExchange(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseExchange(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseExchange(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		case err == nil && got.String() != tc.in:
			t.Errorf("%q prints as %q", tc.in, got.String())
		}
	}
	c := DefaultConfig()
	c.Exchange = Exchange{Kind: ExchangeEpidemic} // S 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "epidemic") {
		t.Errorf("S = 0 validated: %v", err)
	}
}

// exchangeNode is a node without a host, and its epidemic exchange:
// enough to take in models.
func exchangeNode(t testing.TB, params int, s int, normBound float64) (*Node, *epidemic) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Exchange = Exchange{Kind: ExchangeEpidemic, S: s}
	cfg.NormBound = normBound
	reg := prometheus.NewRegistry()
	n := &Node{cfg: cfg, xm: newExchangeMetrics(reg), m: newMetrics(reg), log: slog.New(slog.DiscardHandler),
		progress: newProgress(), wake: make(chan struct{}, 1), lin: newLineage(reg, Genesis{})}
	ex, err := newEpidemic(n, "self", params, 7)
	if err != nil {
		t.Fatal(err)
	}
	n.ex = ex
	n.modelUp.Store(true)
	return n, ex
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
	n, ex := exchangeNode(t, 3, 2, 4)
	a, b := peer.ID("peer-a"), peer.ID("peer-b")
	ex.noteOwnNorm([]float64{0.1, 0, 0}) // own steps of norm 0.1: bound 4·3·0.1 = 1.2
	ex.setRef(1, 1, 1)
	good := modelPayload(t, a, 1, []float32{1.5, 1, 1}) // 0.5 away
	if r := n.takeModel(a, ExchangeEpidemic, good); r != "" {
		t.Fatalf("a good model was refused: %s", r)
	}
	held := ex.roundOf()
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name    string
		from    peer.ID
		kind    ExchangeKind
		payload []byte
		want    gossip.Reason
	}{
		{"gossip kind", b, ExchangeGossip, good, wire.ReasonExchangeMismatch},
		{"unknown kind", b, 9, good, wire.ReasonExchangeMismatch},
		{"empty", b, ExchangeEpidemic, nil, gossip.ReasonMalformed},
		{"truncated", b, ExchangeEpidemic, good[:len(good)-1], gossip.ReasonMalformed},
		{"bad version", b, ExchangeEpidemic, append([]byte{9}, good[1:]...), gossip.ReasonBadVersion},
		{"oversize", b, ExchangeEpidemic, make([]byte, gossip.MaxEncodedSize(3)+1), gossip.ReasonOversize},
		{"sender is not the stream's peer", b, ExchangeEpidemic, good, gossip.ReasonSenderMismatch},
		{"NaN", b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{nan, 1, 1}), gossip.ReasonNonFinite},
		{"Inf", b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{float32(math.Inf(1)), 1, 1}), gossip.ReasonNonFinite},
		{"huge", b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{1e30, 1, 1}), gossip.ReasonValueTooLarge},
		{"wrong length", b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{1, 1}), gossip.ReasonWrongLength},
		{"negative step", b, ExchangeEpidemic, modelPayload(t, b, -1, []float32{1, 1, 1}), gossip.ReasonNegativeStep},
		{"far away", b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{1, 1, 3}), wire.ReasonDistance},
	} {
		if got := n.takeModel(tc.from, tc.kind, tc.payload); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
	}
	var otherModel bytes.Buffer
	otherModel.Write(good)
	otherModel.Bytes()[len(good)-3*4-8] ^= 1 // the model id's low byte
	if got := n.takeModel(a, ExchangeEpidemic, otherModel.Bytes()); got != gossip.ReasonModelMismatch {
		t.Errorf("another model id: reason %q", got)
	}
	if got := ex.roundOf(); len(got) != 1 || !slices.Equal(got[a], held[a]) {
		t.Errorf("refusals changed what the node holds: %v (was %v)", got, held)
	}
	// A sender has one vote per average: its later models replace its
	// earlier one, maxPerSender times in all, then "rate".
	later := modelPayload(t, a, 2, []float32{1.25, 1, 1})
	for i := 1; i < maxPerSender; i++ {
		if r := n.takeModel(a, ExchangeEpidemic, later); r != "" {
			t.Fatalf("model %d of a: %s", i+1, r)
		}
	}
	if r := n.takeModel(a, ExchangeEpidemic, good); r != wire.ReasonRate {
		t.Errorf("model %d of one sender: reason %q, want rate", maxPerSender+1, r)
	}
	if got := ex.roundOf(); len(got) != 1 || got[a][0] != 1.25 {
		t.Errorf("the round holds %v, want a's latest model alone", got)
	}
	if st := n.ExchangeStats(); st.Received != maxPerSender {
		t.Errorf("received %d, want %d", st.Received, maxPerSender)
	}
	// A round takes at most poolSize senders.
	for i := range ex.poolSize() + 1 {
		p := peer.ID(fmt.Sprintf("peer-%d", i))
		r := n.takeModel(p, ExchangeEpidemic, modelPayload(t, p, 1, []float32{1, 1, 1}))
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
	n, ex := exchangeNode(t, 2, 2, 4)
	tr := newTestTrainer(t, []float64{0, 0})
	n.task = tr
	a, b := peer.ID("a"), peer.ID("b")
	if r := n.takeModel(a, ExchangeEpidemic, modelPayload(t, a, 1, []float32{3, 0})); r != "" {
		t.Fatal(r)
	}
	if r := n.takeModel(b, ExchangeEpidemic, modelPayload(t, b, 1, []float32{300, 0})); r != "" {
		t.Fatal(r)
	}
	ex.merge()
	if p := tr.Params(); p[0] != 0 {
		t.Fatalf("held models were averaged before the first step: %v", p)
	}
	ex.noteOwnNorm([]float64{1, 0}) // bound 4·3·1 = 12
	ex.refFromTask(nil)             // the first step: the reference is the task's model, [0 0]
	ex.merge()
	if p := tr.Params(); p[0] != 1.5 || p[1] != 0 { // (0 + 3) / 2; 300 is too far
		t.Errorf("after averaging: %v, want [1.5 0]", p)
	}
	st := n.ExchangeStats()
	if st.Averaged != 1 || st.Averages != 1 || st.Rejected[string(wire.ReasonDistance)] != 1 {
		t.Errorf("stats %+v", st)
	}
	ex.merge() // nothing new: no change
	if p := tr.Params(); p[0] != 1.5 {
		t.Errorf("an empty average changed the model: %v", p)
	}
	if n.lrPopulation() != 1 {
		t.Errorf("an epidemic node scales its learning rate by 1/%v", n.lrPopulation())
	}
	if got := histCount(t, n.m.staleness); got != 1 {
		t.Errorf("staleness observed %d times, want once per model averaged", got)
	}
}

// A sender that pushes models one way, round after round, moves the
// node's model by at most the clip radius per round (clipFactor × the
// median distance of recent models), shared with the other senders; an
// honest model within the radius is averaged as Epidemic Learning does.
func TestMergeClipsPull(t *testing.T) {
	n, ex := exchangeNode(t, 2, 2, 100) // a loose distance bound: clipping alone
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
			if r := n.takeModel(h, ExchangeEpidemic, modelPayload(t, h, int64(round), []float32{y, 0})); r != "" {
				t.Fatal(r)
			}
		}
		if r := n.takeModel(evil, ExchangeEpidemic, modelPayload(t, evil, int64(round), []float32{ex.ref[0] + 150, 0})); r != "" {
			t.Fatal(r)
		}
		before := ex.ref[0]
		if k := ex.merge32(delta); k != 4 {
			t.Fatalf("averaged %d models", k)
		}
		drift = max(drift, ex.ref[0]-before)
	}
	// Unclipped, the pusher would move the model by 150/5 = 30 a round.
	if drift > 1.5 {
		t.Errorf("one sender moved the model by %v in a round", drift)
	}
	if got := counterValue(n.xm.clipped); got < 20 {
		t.Errorf("clipped %v models, want the pusher's every round", got)
	}
	// Without the pusher nothing is clipped and the average is exact.
	n2, ex2 := exchangeNode(t, 1, 2, 100)
	ex2.noteOwnNorm([]float64{1})
	ex2.setRef(0)
	ex2.dists.add(1)
	for i, y := range []float32{1, -1, 0.5} {
		p := peer.ID(fmt.Sprintf("h%d", i))
		if r := n2.takeModel(p, ExchangeEpidemic, modelPayload(t, p, 1, []float32{y})); r != "" {
			t.Fatal(r)
		}
	}
	d := make([]float32, 1)
	ex2.merge32(d)
	if want := float32(0.5 / 4); d[0] != want || counterValue(n2.xm.clipped) != 0 {
		t.Errorf("honest average changed the model by %v, want %v; clipped %v", d[0], want, counterValue(n2.xm.clipped))
	}
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

// newTestTrainer is a linreg task over 1-dimensional synthetic data whose
// parameters start at init (2 parameters: w and b).
func newTestTrainer(t testing.TB, init []float64) *ModelTask {
	t.Helper()
	ds := &model.Dataset{Name: "tiny", Dim: 1, X: []float64{0, 1, 2, 3}, Targets: []float64{0, 1, 2, 3}}
	m, err := model.New("linreg", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := model.NewTrainer(m, ds, init, model.DefaultSGDConfig())
	if err != nil {
		t.Fatal(err)
	}
	return NewModelTask(tr, nil, TimeModel{}, 1)
}

// Epidemic nodes train over the exchange protocol alone: no GossipSub
// topic, each node's models reach peers and are averaged in, and the
// models agree with each other far better than with where they started.
func TestEpidemicNodesTrain(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 6, "pssp:2:2", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.Exchange = Exchange{Kind: ExchangeEpidemic, S: 2}
			c.Genesis = exampleGenesis // one lineage from the start, as a testnet's
		})
		start := nodes[0].Task().Params()
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		if !waitFor(30*time.Second, func() bool { return minStep(nodes) >= 40 }) {
			t.Errorf("not every node reached step 40: lowest %d", minStep(nodes))
		}
		cancel()
		wait()
		var params [][]float64
		for _, nd := range nodes {
			if nd.Gossip() != nil {
				t.Errorf("node %s joined the gossip topic", nd.ID())
			}
			st, tr := nd.ExchangeStats(), nd.Traffic()
			if st.Sent == 0 || st.Received == 0 || st.Averaged == 0 || len(st.Rejected) != 0 {
				t.Errorf("node %s: %+v", nd.ID(), st)
			}
			if tr.Class("exchange").InBytes == 0 || tr.Class("gossip").InBytes != 0 {
				t.Errorf("node %s traffic: %+v", nd.ID(), tr.ByProtocol)
			}
			if s := nd.Status(); s.UpdatesReceived != st.Received || s.Exchange == nil || s.Exchange.Exchange != "epidemic:2" {
				t.Errorf("node %s status: %d received, exchange %+v", nd.ID(), s.UpdatesReceived, s.Exchange)
			}
			params = append(params, nd.Task().Params())
		}
		var spread, moved float64
		for i := range params {
			moved = max(moved, dist(params[i], start))
			for j := range i {
				spread = max(spread, dist(params[i], params[j]))
			}
		}
		if !(spread < moved/4) {
			t.Errorf("models %v apart after moving %v from the start: they do not average", spread, moved)
		}
	})
}

// A job whose nodes disagree on the exchange says so on both sides: the
// epidemic node's models are refused with exchange_mismatch, and each
// side logs a warning that names --exchange.
func TestExchangeMismatchIsRefused(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		var logs lockedBuffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		i := 0
		nodes := buildTestNodesWith(t, 2, "asp", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			if i == 0 {
				c.Exchange = Exchange{Kind: ExchangeEpidemic, S: 1}
			}
			c.opts = append(c.opts, WithLogger(log))
			i++
		})
		epi, gos := nodes[0], nodes[1]
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		ok := waitFor(10*time.Second, func() bool {
			return epi.ExchangeStats().SendFailed[sendMismatch] > 0 && gos.ExchangeStats().Rejected[string(wire.ReasonExchangeMismatch)] > 0
		})
		cancel()
		wait()
		if !ok {
			t.Fatalf("no mismatch counted: epidemic %+v, gossip %+v", epi.ExchangeStats(), gos.ExchangeStats())
		}
		if st := gos.ExchangeStats(); st.Received != 0 {
			t.Errorf("the gossip node took %d models", st.Received)
		}
		out := logs.String()
		if strings.Count(out, "must agree on --exchange") < 2 || !strings.Contains(out, "peer_exchange=gossip") || !strings.Contains(out, "peer_exchange=epidemic") {
			t.Errorf("logs do not name the mismatch on both sides:\n%s", out)
		}
	})
}

// A peer that does not serve the exchange protocol at all is counted as
// unsupported, and the sender goes on.
func TestExchangeUnsupportedPeer(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := epidemicPair(t)
		nodes[1].Host().RemoveStreamHandler(wire.ExchangeProtocol(nodes[1].cfg.Job))
		// identify pushes the change: wait until node 0 knows it.
		if !waitFor(10*time.Second, func() bool { return nodes[0].lacksExchange(nodes[1].ID()) }) {
			t.Fatal("node 0 never learned that node 1 dropped the exchange protocol")
		}
		nodes[0].sendTo(nodes[1].ID(), 1, wire.FrameExchange([]byte{wire.Version, byte(ExchangeEpidemic)}))
		if st := nodes[0].ExchangeStats(); st.SendFailed[sendUnsupported] != 1 {
			t.Errorf("send to a peer without the protocol: %+v", st)
		}
	})
}

// The request frame is capped before it is read: a peer announcing a
// frame over the cap gets its stream reset and is counted.
func TestExchangeFrameOverCap(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := epidemicPair(t)
		a, b := nodes[0], nodes[1]
		body := make([]byte, wire.MaxExchangeFrame(b.task.NumParams())+1)
		body[0], body[1] = wire.Version, byte(ExchangeEpidemic)
		_, _, err := wire.SendExchange(t.Context(), a.h, b.ID(), a.cfg.Job, wire.FrameExchange(body))
		if err == nil {
			t.Error("an oversized request was answered")
		}
		if !waitFor(time.Second, func() bool { return b.ExchangeStats().Rejected[string(gossip.ReasonMalformed)] == 1 }) {
			t.Errorf("oversized request not counted: %+v", b.ExchangeStats())
		}
	})
}

// epidemicPair is two epidemic:1 nodes on a memnet, in the caller's
// bubble, not running.
func epidemicPair(t *testing.T) []*Node {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	return buildTestNodesWith(t, 2, "asp", 0.01, memHosts(t, mn), func(c *nodeSetup) {
		c.Exchange = Exchange{Kind: ExchangeEpidemic, S: 1}
	})
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FuzzTakeModel: whatever a peer sends, the node does not panic, and what
// it refuses leaves its sum untouched.
func FuzzTakeModel(f *testing.F) {
	good, _ := gossip.EncodeUpdate(nil, &gossip.Update{Sender: "p", Step: 1, ModelID: 7, ParamCount: 3, Encoding: gossip.EncodingDense32, Values: []float32{1, 2, 3}})
	f.Add(byte(1), good)
	f.Add(byte(1), good[:10])
	f.Add(byte(0), good)
	f.Fuzz(func(t *testing.T, kind byte, payload []byte) {
		n, ex := exchangeNode(t, 3, 2, 4)
		ex.noteOwnNorm([]float64{1, 0, 0})
		ex.setRef(rand.Float32(), 0, 0)
		r := n.takeModel("p", ExchangeKind(kind), payload)
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

// takeModel is what handleExchange does with one received model, header
// and payload at once: screen, then accept. It returns why the model was
// refused, or "".
func (n *Node) takeModel(from peer.ID, kind ExchangeKind, payload []byte) gossip.Reason {
	if r := n.ex.screen(from, kind); r != "" {
		return r
	}
	return n.ex.accept(from, payload)
}

// A sender counts at most once in spacingFor averages: as often as an
// honest peer, which sends to S of its N − 1 peers a step, could come. A
// poisoner that pushes to every node every round is taken that rarely.
func TestEpidemicSpacing(t *testing.T) {
	for _, tc := range []struct {
		population float64
		s          int
		want       uint64
	}{{0, 4, 1}, {4, 4, 1}, {8, 4, 1}, {20, 4, 1}, {40, 4, 2}, {100, 4, 6}, {100, 1, 24}, {1000, 4, 62}} {
		if got := spacingFor(tc.population, tc.s); got != tc.want {
			t.Errorf("spacingFor(%v, %d) = %d, want %d", tc.population, tc.s, got, tc.want)
		}
	}
	n, ex := exchangeNode(t, 1, 4, 100)
	ex.noteOwnNorm([]float64{1})
	ex.setRef(0)
	ex.mu.Lock()
	ex.spacing = 3
	ex.mu.Unlock()
	evil, honest := peer.ID("evil"), peer.ID("honest")
	taken := 0
	d := make([]float32, 1)
	for round := range 12 {
		if n.takeModel(evil, ExchangeEpidemic, modelPayload(t, evil, int64(round), []float32{1})) == "" {
			taken++
		}
		if round%6 == 0 { // an honest sender, as rare as its sampling makes it
			if r := n.takeModel(honest, ExchangeEpidemic, modelPayload(t, honest, int64(round), []float32{0.5})); r != "" {
				t.Fatalf("round %d: the honest sender refused: %s", round, r)
			}
		}
		ex.merge32(d)
		ex.mu.Lock()
		ex.spacing = 3 // merge32 sets it from the population; this node has none
		ex.mu.Unlock()
	}
	if taken != 4 {
		t.Errorf("a sender pushing every round was taken %d times in 12 rounds, want 4", taken)
	}
}
