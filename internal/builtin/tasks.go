package builtin

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pspnode/pspnode/internal/task"
	"github.com/pspnode/pspnode/model"
)

// TimeModel is the PSP paper's synthetic task time: each step takes
// (Exp(1)+1) seconds × Factor × Scale, in addition to real compute.
// A zero Scale turns it off.
type TimeModel struct {
	Scale  float64
	Factor float64 // straggle factor, 1 for a normal node
}

// validate refuses a scale or factor that is not a finite number >= 0.
func (tm TimeModel) validate() error {
	ok := func(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }
	if !ok(tm.Scale) || !ok(tm.Factor) {
		return fmt.Errorf("task: time model: Scale %v and Factor %v must be finite numbers >= 0", tm.Scale, tm.Factor)
	}
	return nil
}

func (tm TimeModel) sleep(ctx context.Context, rng *rand.Rand) error {
	if tm.Scale <= 0 {
		return ctx.Err()
	}
	f := tm.Factor
	if f <= 0 {
		f = 1
	}
	d := time.Duration((rng.ExpFloat64() + 1) * f * tm.Scale * float64(time.Second))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every task here is a node.Task (task.Task, which node names Task).
var (
	_ task.Task = (*SleepTask)(nil)
	_ task.Task = (*ModelTask)(nil)
)

// SleepTask is a task without a model: each step only takes the time model's
// time. Useful to study barriers on real networks.
type SleepTask struct {
	time TimeModel
	mu   sync.Mutex
	rng  *rand.Rand
}

// NewSleepTask returns a SleepTask with its own random stream.
func NewSleepTask(tm TimeModel, seed uint64) *SleepTask {
	return &SleepTask{time: tm, rng: rand.New(rand.NewPCG(seed, 0x51ee9))}
}

func (t *SleepTask) Step(ctx context.Context) ([]float64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return nil, t.time.sleep(ctx, t.rng)
}
func (t *SleepTask) Apply([]float32, int64) error { return nil }
func (t *SleepTask) NumParams() int               { return 0 }
func (t *SleepTask) ModelID() uint32              { return 0 }
func (t *SleepTask) Params() []float64            { return nil }
func (t *SleepTask) SetParams(p []float64) error {
	if len(p) != 0 {
		return fmt.Errorf("a task without a model takes no parameters, got %d", len(p))
	}
	return nil
}
func (t *SleepTask) Done() bool { return false }

// ModelTask trains a model.SGD on its shard: a step is one SGD step
// plus the time model's delay, and its update is the parameter delta.
type ModelTask struct {
	sgd  *model.SGD
	test *model.Dataset
	time TimeModel
	id   uint32
	mu   sync.Mutex // guards rng
	rng  *rand.Rand

	amu sync.Mutex // guards buf
	buf []float64  // a received update, widened for the SGD
}

// NewModelTask wraps an SGD of a model on its shard. test is the held-out set for Evaluate (nil
// for none).
func NewModelTask(tr *model.SGD, test *model.Dataset, tm TimeModel, seed uint64) *ModelTask {
	return &ModelTask{
		sgd: tr, test: test, time: tm,
		id:  modelIDOf(tr.Model()),
		rng: rand.New(rand.NewPCG(seed, 0x7a5c)),
	}
}

// modelIDOf derives a model id from the model's name and shape, so nodes
// running different architectures reject each other's updates.
func modelIDOf(m model.Model) uint32 {
	h := sha256.Sum256([]byte(m.Name() + "|" + m.Shape().String()))
	return binary.BigEndian.Uint32(h[:4])
}

func (t *ModelTask) Step(ctx context.Context) ([]float64, error) {
	t.mu.Lock()
	// The time model stands for the step's compute: the parameters change
	// when it ends, so that what peers fetch and evaluations see meanwhile
	// is the model the step started from (under the epidemic exchange, the
	// average it just took), as on a node whose compute takes that long.
	delta, _, err := t.sgd.Compute(t.rng)
	if err == nil {
		if err = t.time.sleep(ctx, t.rng); err == nil {
			t.sgd.Commit(delta)
		}
	}
	t.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return delta, nil
}

// Apply adds a peer's update, float32 as it travels, to the SGD's float64
// parameters (widened in a buffer the task keeps: no allocation per
// update).
func (t *ModelTask) Apply(u []float32, _ int64) error {
	t.amu.Lock()
	defer t.amu.Unlock()
	if len(t.buf) != len(u) {
		t.buf = make([]float64, len(u))
	}
	for i, x := range u {
		t.buf[i] = float64(x)
	}
	return t.sgd.Apply(t.buf)
}

func (t *ModelTask) NumParams() int              { return t.sgd.Model().NumParams() }
func (t *ModelTask) ModelID() uint32             { return t.id }
func (t *ModelTask) Params() []float64           { return t.sgd.Params() }
func (t *ModelTask) SetParams(p []float64) error { return t.sgd.SetParams(p) }
func (t *ModelTask) Done() bool                  { return false }

// SetPopulation scales the learning rate by 1/n: with n nodes each adding
// every update, the sum of one round of updates is then one step of the
// mean gradient (see model.SGD.SetLRScale).
func (t *ModelTask) SetPopulation(n float64) {
	if n >= 1 {
		t.sgd.SetLRScale(1 / n)
	}
}

// SetStep moves the learning-rate schedule to the node's step (see
// node.StepAware and model.SGD.SetSteps).
func (t *ModelTask) SetStep(step int64) { t.sgd.SetSteps(int(step)) }

// ModelName is the model's name (linreg, logreg, mlp...), which a node's
// Status shows.
func (t *ModelTask) ModelName() string { return t.sgd.Model().Name() }

// SGD returns the wrapped SGD.
func (t *ModelTask) SGD() *model.SGD { return t.sgd }

// Evaluate reports loss and accuracy on the held-out set.
func (t *ModelTask) Evaluate() (model.Metrics, error) {
	if t.test == nil {
		return model.Metrics{}, fmt.Errorf("no held-out data")
	}
	return t.sgd.Evaluate(t.test)
}
