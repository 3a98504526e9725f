// Package task declares what a node holds and runs: a Model (the
// parameters it takes its peers' updates into and gives a joining peer)
// and a Task (a Model with a step, for a node that runs its own steps).
// Package node names them node.Model and node.Task (read their docs
// there); they live here, below node, so that the built-in Go tasks
// (internal/builtin), which node's own tests run, can say they are
// node.Tasks without importing node.
package task

import "context"

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
