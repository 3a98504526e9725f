package trainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pspnode/pspnode/internal/f32"
)

// RemoteModel is the node.Model of a driven node: the model lives in the trainer
// process, so the task holds only what the node needs of it.
//
//   - Its shape (name, model ID, parameter count) is fixed by the first
//     trainer that says Hello; NumParams is 0 until then.
//   - Under gossip, each peer update the node accepts is added (Apply,
//     float32 as it travels) to one accumulator, which the trainer takes
//     with Pull (copied into the shared region, or the reply); the steps
//     of the updates in it go with it, for their staleness. Under
//     epidemic the node's exchange holds the round and averages it into
//     the trainer's model at the step (node.Driver.Merge).
//   - Params for a peer's model fetch come from the trainer itself
//     (ParamsContext asks the session), except under epidemic, where the
//     node's model after the trainer's last step and average is the
//     trainer's model (model, set by the session).
type RemoteModel struct {
	// Fixed once by fix; numParams and modelID are also read without mu
	// (NumParams and ModelID are called on every model request).
	numParams atomic.Int64
	modelID   atomic.Uint32

	mu       sync.Mutex
	name     string
	epidemic bool
	accept   bool                                 // a session is active: take updates in
	acc      []float32                            // gossip: the sum of the updates since the last pull
	merged   int                                  // updates in acc (0: acc holds nothing)
	steps    []int64                              // the senders' steps of the updates in acc
	read     func(lo, hi int, dst []float32) bool // epidemic: the node's model, for peers' fetches
	sess     *session                             // the active session, nil for none
	cache    []float32                            // the last parameters the trainer gave (read only: shared with callers of Params32Context)
	cacheAt  int64                                // the step they had taken
	asking   chan struct{}                        // closed when the request in flight ends; nil for none
	askErr   error
	stepNow  func() int64 // the node's step (for the cache)
	received atomic.Uint64
}

// NewRemoteModel returns the model of a driven node (node.WithModel), whose
// shape the first trainer fixes.
func NewRemoteModel() *RemoteModel { return &RemoteModel{} }

// fix sets the task's shape, or checks a later trainer's against it.
func (t *RemoteModel) fix(name string, id uint32, n int, epidemic bool) (changed bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.numParams.Load() == 0 {
		t.name, t.epidemic = name, epidemic
		t.modelID.Store(id)
		t.numParams.Store(int64(n))
		return true, nil
	}
	if id != t.modelID.Load() || int64(n) != t.numParams.Load() {
		return false, fmt.Errorf("model mismatch: the trainer runs %q (model id %#08x) with %d float32 parameters; this daemon's job runs %q (model id %#08x) with %d, fixed by its first trainer: run the same model, or start another daemon (another --job) for this one",
			name, id, n, t.name, t.modelID.Load(), t.numParams.Load())
	}
	return false, nil
}

// shape returns the fixed shape.
func (t *RemoteModel) shape() (name string, id uint32, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.name, t.modelID.Load(), int(t.numParams.Load())
}

// begin starts taking updates for sess (gossip: into an accumulator of
// NumParams values, made once for the daemon's life); under epidemic
// read reads the node's model.
func (t *RemoteModel) begin(sess *session, read func(lo, hi int, dst []float32) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sess, t.accept = sess, true
	if !t.epidemic && t.acc == nil {
		t.acc = make([]float32, t.numParams.Load())
	}
	t.merged, t.steps = 0, t.steps[:0]
	t.read = read
	t.cache = nil
}

// end stops taking updates and drops what was not pulled.
func (t *RemoteModel) end(sess *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sess != sess {
		return
	}
	t.sess, t.accept = nil, false
	t.merged, t.steps, t.read, t.cache = 0, nil, nil, nil
}

// dropPending forgets the updates the trainer has not pulled yet and the
// cached parameters: the trainer takes the job's parameters in place of
// its own, which those updates were made against.
func (t *RemoteModel) dropPending() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.merged, t.steps = 0, t.steps[:0]
	t.cache = nil
}

// Apply adds u, a peer's update (gossip) made at step (-1: not known,
// and then not in the staleness the pull notes), to the accumulator.
// Without a trainer it is dropped: a new trainer starts from the job's
// model.
func (t *RemoteModel) Apply(u []float32, step int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.accept || t.acc == nil {
		return nil
	}
	if len(u) != len(t.acc) {
		return fmt.Errorf("update of %d values, the model has %d", len(u), len(t.acc))
	}
	if t.merged == 0 {
		copy(t.acc, u)
	} else {
		f32.Axpy(t.acc, u, 1)
	}
	t.merged++
	if step >= 0 {
		t.steps = append(t.steps, step)
	}
	t.received.Add(1)
	return nil
}

// pull copies the updates accumulated since the last pull into dst (the
// model's length) and starts a new sum: it returns how many it merges (0:
// nothing, dst untouched) and their senders' steps (valid until the next
// pull).
func (t *RemoteModel) pull(dst []float32) (merged int, steps []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.merged == 0 || !t.accept || len(dst) != len(t.acc) {
		return 0, nil
	}
	copy(dst, t.acc)
	merged = t.merged
	steps = append([]int64(nil), t.steps...)
	t.merged, t.steps = 0, t.steps[:0]
	return merged, steps
}

// NumParams is the trainer's parameter count, 0 until a trainer fixes it.
func (t *RemoteModel) NumParams() int { return int(t.numParams.Load()) }

// ModelID is the trainer's model ID.
func (t *RemoteModel) ModelID() uint32 { return t.modelID.Load() }

// Params returns the trainer's parameters (see ParamsContext), waiting up
// to ten seconds; nil if the trainer does not give them.
func (t *RemoteModel) Params() []float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, _ := t.ParamsContext(ctx)
	return p
}

// ParamsContext returns the trainer's parameters: under epidemic the
// model it published after its last step; under gossip it asks the
// trainer, within ctx. Requests that come while one is in flight share
// its answer, and an answer serves later requests until the node's step
// moves on.
func (t *RemoteModel) ParamsContext(ctx context.Context) ([]float64, error) {
	t.mu.Lock()
	read := t.read // set under epidemic only
	t.mu.Unlock()
	if read != nil {
		p := make([]float32, t.NumParams())
		if read(0, len(p), p) {
			return widen(p), nil
		}
	}
	p, err := t.Params32Context(ctx)
	if err != nil {
		return nil, err
	}
	return widen(p), nil
}

// widen is p as float64.
func widen(p []float32) []float64 {
	out := make([]float64, len(p))
	for i, x := range p {
		out[i] = float64(x)
	}
	return out
}

// Params32Context is ParamsContext's gossip path, as the trainer gives
// them: float32, one vector that later callers share until the node's
// step moves on (read only). The model protocol serves a gossip node's
// model from it, so that a daemon holds one copy of the trainer's
// parameters for its peers, not float64 ones (4 copies of a float32
// model).
func (t *RemoteModel) Params32Context(ctx context.Context) ([]float32, error) {
	t.mu.Lock()
	for {
		if t.sess == nil {
			t.mu.Unlock()
			return nil, errors.New("no trainer connected")
		}
		if t.cache != nil && t.stepNow != nil && t.cacheAt == t.stepNow() {
			p := t.cache
			t.mu.Unlock()
			return p, nil
		}
		if t.asking == nil {
			break
		}
		wait := t.asking
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		t.mu.Lock()
		if t.askErr != nil {
			err := t.askErr
			t.mu.Unlock()
			return nil, err
		}
	}
	sess := t.sess
	done := make(chan struct{})
	t.asking, t.askErr = done, nil
	t.mu.Unlock()

	p, step, err := sess.requestParams(ctx)

	t.mu.Lock()
	t.asking, t.askErr = nil, err
	if err == nil && t.sess == sess {
		t.cache, t.cacheAt = p, step
	}
	t.mu.Unlock()
	close(done)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// SetParams is not used: a driven node's averages go to its trainer
// through its steps, and the job's model at a session's start or a reset.
func (t *RemoteModel) SetParams([]float64) error {
	return errors.New("trainer: a driven node's model is its trainer's")
}
