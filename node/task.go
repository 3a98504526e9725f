package node

import (
	"context"
	"fmt"

	"github.com/pspnode/pspnode/internal/task"
	"github.com/pspnode/pspnode/model"
)

// Model is the model a node holds, takes its peers' updates into and
// gives a joining peer (task.Model: declared below node, so that the
// built-in tasks, which node's own tests run, are node.Tasks by type).
type Model = task.Model

// Task is the work a node does between barriers when it runs its own
// steps (Run): a Model with a step (task.Task).
type Task = task.Task

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
