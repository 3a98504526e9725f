package node

import (
	"context"
	"fmt"
	"github.com/pspnode/pspnode/model"
)

// Model is the model a node holds, takes its peers' updates into and
// gives a joining peer: all a driven node needs (WithModel), whose
// program computes the steps. Apply is called from the exchange's receive
// goroutine, the rest from any, so an implementation must be safe for
// that concurrency.
//
// Updates travel as float32, and Apply takes them as they travel; a
// task whose parameters are float64 (the built-in Go tasks) widens them
// as it adds them. Its Params and SetParams stay its own (float64).
type Model interface {
	// Apply adds an update received from a peer (gossip), made at the
	// peer's step (-1: not known). A bad update is an error and must
	// leave the task's state untouched. The slice is reused after Apply
	// returns: do not keep it.
	Apply(update []float32, step int64) error
	// NumParams is the length of the parameter vector (0 for none).
	NumParams() int
	// ModelID identifies the model architecture; peers must agree on it.
	ModelID() uint32
	// Params returns a copy of the parameters, for peers that join.
	Params() []float64
	// SetParams replaces the parameters (verified: length, finite).
	SetParams(p []float64) error
}

// Task is the work a node does between barriers when it runs its own
// steps (Run): the Go form of the Actor P2P engine's schedule/pull/push,
// a Model with a step. The engine calls Step from its loop.
type Task interface {
	Model
	// Step computes one iteration and returns the update to publish (nil to
	// publish nothing). It should return promptly when ctx is done.
	Step(ctx context.Context) (update []float64, err error)
	// Done reports whether the task's own stop criterion is met.
	Done() bool
}

// PopulationAware is implemented by tasks that adapt to the number of
// nodes, such as the CLI's model task, which scales its learning rate by 1/N̂. The
// engine calls SetPopulation with its estimate before every step.
type PopulationAware interface {
	SetPopulation(n float64)
}

// StepAware is implemented by tasks whose work depends on the node's step,
// such as the CLI's model task, whose learning-rate schedule follows it. The engine
// calls SetStep when the node takes a step it did not count itself: when it
// resumes from a checkpoint and when it joins a running job. Steps the node
// computes itself are not reported: the task counts its own Step calls.
type StepAware interface {
	SetStep(step int64)
}

// Evaluator is implemented by tasks that can report held-out loss and
// accuracy; the node exports them as metrics.
type Evaluator interface {
	Evaluate() (model.Metrics, error)
}

// noWork is the task of a node given none (WithTask): a step does no
// work and publishes nothing.
type noWork struct{}

func (noWork) Step(ctx context.Context) ([]float64, error) { return nil, ctx.Err() }
func (noWork) Apply([]float32, int64) error                { return nil }
func (noWork) NumParams() int                              { return 0 }
func (noWork) ModelID() uint32                             { return 0 }
func (noWork) Params() []float64                           { return nil }
func (noWork) SetParams(p []float64) error {
	if len(p) != 0 {
		return fmt.Errorf("a task without a model takes no parameters, got %d", len(p))
	}
	return nil
}
func (noWork) Done() bool { return false }
