package node

import (
	"context"
	"encoding/hex"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// lateTask is a driven node's task whose model a trainer fixes later, as
// node/trainer's Task does: NumParams is 0 until then.
type lateTask struct {
	n  atomic.Int64
	id atomic.Uint32
}

func (t *lateTask) Step(context.Context) ([]float64, error) { return nil, nil }
func (t *lateTask) Apply([]float32, int64) error            { return nil }
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
			c.opts = append(c.opts, WithModel(task))
			c.Bootstrap = []string{job.Addrs()[0].String()}
		})[0]
		if e := driven.kin.ownExt(); e.HasModel {
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
		if k := job.kin.Admit(driven.ID(), r.Ext, false); k != lineage.Kin {
			t.Errorf("the job judges the driven node %v", k)
		}
		ext := job.kin.ownExt()
		if k := driven.kin.Admit(job.ID(), &ext, false); k != lineage.Kin {
			t.Errorf("the driven node judges the job %v", k)
		}

		// Its trainer fixes another model.
		task.n.Store(5)
		task.id.Store(0xdead)
		d, _ := driven.Driver()
		if err := d.Attach(t.Context()); err != nil {
			t.Fatal(err)
		}
		theirs := driven.kin.ownExt()
		if k := job.kin.Admit(driven.ID(), &theirs, false); k != lineage.OtherModel || !job.Overlay().HeldOut(driven.ID()) {
			t.Errorf("a driven node of another model: judged %v, held out %v", k, job.Overlay().HeldOut(driven.ID()))
		}
		if k := driven.kin.Admit(job.ID(), &ext, false); k != lineage.OtherModel {
			t.Errorf("the driven node judges the job's other model %v", k)
		}
		// Shown the job's model, it is let back in.
		same := ext
		if k := job.kin.Admit(driven.ID(), &same, false); k != lineage.Kin || job.Overlay().HeldOut(driven.ID()) {
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
		b.kin.lin.Set(exampleGenesis)
		a.kin.lin.Set(exampleGenesis)
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
		if want := b.kin.ownExt(); r.Ext == nil || *r.Ext != want {
			t.Errorf("the second reply reads as %+v, want b's fields %+v", r.Ext, want)
		}
		// Fields that change are sent again.
		g := lineage.NewGenesis(time.Now())
		b.kin.lin.Set(g)
		if r, err = a.queryStep(t.Context(), b.ID(), wire.StepRequest{Step: 3}); err != nil || r.Ext == nil || r.Ext.Genesis != g {
			t.Errorf("after b's genesis changed a reads %+v, %v", r.Ext, err)
		}
	})
}

// exampleGenesis is the genesis of docs/protocols.md's examples (6.12):
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = func() lineage.Genesis {
	var g lineage.Genesis
	b, _ := hex.DecodeString("1816687ec05700000102030405060708")
	copy(g[:], b)
	return g
}()
