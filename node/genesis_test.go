package node

import (
	"context"
	"encoding/hex"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

func TestLineageJudge(t *testing.T) {
	l := newLineage(prometheus.NewRegistry(), Genesis{})
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	older, own, younger := NewGenesis(now.Add(-time.Hour)), NewGenesis(now), NewGenesis(now.Add(time.Hour))
	p, q, r := peer.ID("p"), peer.ID("q"), peer.ID("r")
	if l.judge(p, older, now) != kin || l.due(now) {
		t.Fatal("a node without a genesis judges lineages")
	}
	l.set(own)
	for _, g := range []Genesis{{}, own} {
		if l.judge(p, g, now) != kin || l.due(now) {
			t.Errorf("genesis %q is not kin of %q, or makes the node look for the job's lineage", g, own)
		}
	}
	// Another lineage, older or younger: it does not count, its updates
	// are dropped for forkHold, and the node looks whether it is the job's.
	for _, g := range []Genesis{younger, older} {
		if l.judge(q, g, now) != otherFork || !l.fromOther(q, now) || l.fromOther(q, now.Add(forkHold)) {
			t.Errorf("a peer on %s: another fork whose updates are dropped for forkHold", g)
		}
		if !l.due(now) || l.due(now.Add(forkHold)) {
			t.Errorf("a peer on %s: the node looks within forkHold of hearing it, not after", g)
		}
	}
	// Looks that find the node on the job's lineage come less and less
	// often, up to forkHold; one that moved it comes again soon.
	l.looked(now, true)
	if l.due(now) || !l.due(now.Add(convergeRetry)) {
		t.Error("the next look is not convergeRetry later")
	}
	l.looked(now, true)
	if l.due(now.Add(convergeRetry)) || !l.due(now.Add(2*convergeRetry)) {
		t.Error("the second look that stayed did not double the wait")
	}
	l.looked(now, false)
	if !l.due(now.Add(convergeRetry)) {
		t.Error("after a move the wait is convergeRetry again")
	}
	if l.judge(q, own, now) != kin || l.fromOther(q, now) {
		t.Error("a peer back on this node's lineage is kin again")
	}
	l.judge(r, older, now)
	l.set(older)
	if l.fromOther(r, now) || l.judge(r, older, now) != kin {
		t.Error("after taking a peer's genesis the peer is kin")
	}
	l.judge(p, own, now)
	l.forget(p)
	if l.fromOther(p, now) {
		t.Error("a forgotten peer is still held on another lineage")
	}
}

func TestPickLineage(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b, c := NewGenesis(now.Add(-time.Hour)), NewGenesis(now), NewGenesis(now.Add(time.Hour))
	cases := []struct {
		name   string
		counts map[Genesis]int
		want   Genesis
	}{
		{"none", map[Genesis]int{}, Genesis{}},
		{"only peers without a genesis", map[Genesis]int{{}: 3}, Genesis{}},
		{"the most peers", map[Genesis]int{a: 1, b: 3, c: 2}, b},
		{"a tie goes to the older", map[Genesis]int{c: 2, b: 2, a: 1}, b},
		{"1970 alone against three", map[Genesis]int{NewGenesis(time.Unix(0, 0)): 1, c: 3}, c},
		{"two alone: the older", map[Genesis]int{c: 1, a: 1}, a},
		{"peers without a genesis do not vote", map[Genesis]int{{}: 9, c: 1}, c},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickLineage(tc.counts); got != tc.want {
				t.Errorf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// lateTask is a driven node's task whose model a trainer fixes later, as
// node/trainer's Task does: NumParams is 0 until then.
type lateTask struct {
	n  atomic.Int64
	id atomic.Uint32
}

func (t *lateTask) Step(context.Context) ([]float64, error) { return nil, nil }
func (t *lateTask) Apply([]float64) error                   { return nil }
func (t *lateTask) Params() []float64                       { return make([]float64, t.n.Load()) }
func (t *lateTask) SetParams([]float64) error               { return nil }
func (t *lateTask) NumParams() int                          { return int(t.n.Load()) }
func (t *lateTask) ModelID() uint32                         { return t.id.Load() }
func (t *lateTask) Done() bool                              { return false }

// A driven node whose trainer has not fixed its model says nothing of a
// model, and judges no peer's: neither side takes the other for another
// model. Once fixed, its model counts like any other; a peer held out for
// another model is let back in when it shows this node's.
func TestDrivenNodeWithoutModelIsNoMismatch(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		job := buildTestNodes(t, 1, "pssp:1:1", 0.01, memHosts(t, mn))[0]
		task := &lateTask{}
		driven := buildTestNodesWith(t, 1, "pssp:1:1", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.Driven, c.WaitPeers = true, 0
			c.opts = append(c.opts, WithTask(task))
			c.Bootstrap = []string{job.Addrs()[0].String()}
		})[0]
		if e := driven.ownExt(); e.HasModel {
			t.Fatalf("a driven node without its model says it runs %+v", e)
		}
		// Over the wire: the job asks the driven node (idle: it answers
		// as leaving), and the driven node asks the job.
		r, err := job.queryStep(t.Context(), driven.ID(), wire.StepRequest{Step: 1})
		if err != nil || r.Ext == nil || r.Ext.HasModel || !r.Leaving {
			t.Fatalf("the driven node's reply: %+v (%+v), %v", r, r.Ext, err)
		}
		if _, err := driven.queryStep(t.Context(), job.ID(), wire.StepRequest{Step: 0}); err != nil {
			t.Fatal(err)
		}
		if job.Overlay().HeldOut(driven.ID()) || driven.Overlay().HeldOut(job.ID()) {
			t.Fatal("a driven node without a model was taken for another model")
		}
		if k := job.admit(driven.ID(), r.Ext, false); k != kin {
			t.Errorf("the job judges the driven node %v", k)
		}
		ext := job.ownExt()
		if k := driven.admit(job.ID(), &ext, false); k != kin {
			t.Errorf("the driven node judges the job %v", k)
		}

		// Its trainer fixes another model.
		task.n.Store(5)
		task.id.Store(0xdead)
		d, _ := driven.Driver()
		if err := d.Attach(t.Context()); err != nil {
			t.Fatal(err)
		}
		theirs := driven.ownExt()
		if k := job.admit(driven.ID(), &theirs, false); k != otherModel || !job.Overlay().HeldOut(driven.ID()) {
			t.Errorf("a driven node of another model: judged %v, held out %v", k, job.Overlay().HeldOut(driven.ID()))
		}
		if k := driven.admit(job.ID(), &ext, false); k != otherModel {
			t.Errorf("the driven node judges the job's other model %v", k)
		}
		// Shown the job's model, it is let back in.
		same := ext
		if k := job.admit(driven.ID(), &same, false); k != kin || job.Overlay().HeldOut(driven.ID()) {
			t.Errorf("a peer showing the job's model: judged %v, held out %v", k, job.Overlay().HeldOut(driven.ID()))
		}
	})
}

// On a reused step stream each side sends its 1.1.0 fields once: later
// exchanges cost what 1.0.0's do (19 and 27 bytes a frame), and each side
// still judges the other by the fields it sent first.
func TestStepFieldsOncePerStream(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 2, "pssp:1:1", 0.001)
		a, b := nodes[0], nodes[1]
		b.lin.set(exampleGenesis)
		a.lin.set(exampleGenesis)
		if _, err := a.queryStep(t.Context(), b.ID(), wire.StepRequest{Step: 1}); err != nil {
			t.Fatal(err)
		}
		st := stepStreamsTo(a, b)
		if len(st) != 1 || st[0].Protocol() != wire.StepProtocolExt(a.cfg.Job) {
			t.Fatalf("not one open 1.1.0 stream after a query: %v", st)
		}
		before := a.Traffic()
		r, err := a.queryStep(t.Context(), b.ID(), wire.StepRequest{Step: 2})
		if err != nil {
			t.Fatal(err)
		}
		if again := stepStreamsTo(a, b); len(again) != 1 || again[0].ID() != st[0].ID() {
			t.Fatal("the second query did not reuse the stream")
		}
		d := a.Traffic().Sub(before).Class("step")
		if d.OutBytes != 19 || d.InBytes != 27 {
			t.Errorf("a reused 1.1.0 exchange sent %d and received %d bytes, want 19 and 27", d.OutBytes, d.InBytes)
		}
		if want := b.ownExt(); r.Ext == nil || *r.Ext != want {
			t.Errorf("the second reply reads as %+v, want b's fields %+v", r.Ext, want)
		}
		// Fields that change are sent again.
		g := NewGenesis(time.Now())
		b.lin.set(g)
		if r, err = a.queryStep(t.Context(), b.ID(), wire.StepRequest{Step: 3}); err != nil || r.Ext == nil || r.Ext.Genesis != g {
			t.Errorf("after b's genesis changed a reads %+v, %v", r.Ext, err)
		}
	})
}

// exampleGenesis is the genesis of docs/protocols.md's examples (6.12):
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = func() Genesis {
	var g Genesis
	b, _ := hex.DecodeString("1816687ec05700000102030405060708")
	copy(g[:], b)
	return g
}()

func TestGenesisOrder(t *testing.T) {
	if got := exampleGenesis.Time().UTC(); !got.Equal(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("example genesis time %v", got)
	}
	a := NewGenesis(time.Unix(100, 0))
	b := NewGenesis(time.Unix(200, 0))
	if !a.Older(b) || b.Older(a) || a.Older(a) {
		t.Errorf("a genesis of t=100 s is not older than one of t=200 s: %s %s", a, b)
	}
	if !a.Older(Genesis{}) || (Genesis{}).Older(a) || (Genesis{}).Older(Genesis{}) {
		t.Error("every genesis is older than none, and none is older than anything")
	}
	c := NewGenesis(time.Unix(100, 0))
	if a == c || a.Older(c) == c.Older(a) {
		t.Errorf("two geneses of one instant are not totally ordered: %s %s", a, c)
	}
	if (Genesis{}).String() != "" || len(a.String()) != 32 {
		t.Errorf("String: %q %q", Genesis{}.String(), a.String())
	}
}

func TestClockOff(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		made time.Time
		off  bool
	}{
		{now.Add(-time.Hour), false},
		{now, false},
		{now.Add(30 * time.Second), false},
		{now.Add(5 * time.Minute), true},
	} {
		if _, off := clockOff(NewGenesis(tc.made), now); off != tc.off {
			t.Errorf("a genesis made at %v, seen at %v: off %v, want %v", tc.made, now, off, tc.off)
		}
	}
	if _, off := clockOff(Genesis{}, now); off {
		t.Error("no genesis is off")
	}
}
