package trainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Model is the node.Model of a driven node: the model lives in the trainer
// process, so the task holds only what the node needs of it.
//
//   - Its shape (name, model ID, parameter count) is fixed by the first
//     trainer that says Hello; NumParams is 0 until then.
//   - Under gossip, each peer update the node accepts is added (Apply32,
//     float32 as it travels) to an accumulator, which the trainer takes
//     with Pull; the steps of the updates in it go with it, for their
//     staleness. Under epidemic, the node's exchange averages the models
//     it holds and writes the change into the accumulator at the pull
//     (node.Driver.Merge32). Either way the trainer adds one vector to its
//     parameters.
//   - Params for a peer's model fetch come from the trainer itself
//     (ParamsContext asks the session), except under epidemic, where the
//     node's model after the trainer's last step and average is the
//     trainer's model (model, set by the session).
//
// The accumulator is two float32 buffers (with shared memory, two regions
// of the shared file): updates add into one while the trainer reads the
// other, so Pull copies nothing.
type Model struct {
	// Fixed once by fix; numParams and modelID are also read without mu
	// (NumParams and ModelID are called on every model request).
	numParams atomic.Int64
	modelID   atomic.Uint32

	mu       sync.Mutex
	name     string
	epidemic bool
	accept   bool             // a session is active: take updates in
	acc      [2][]float32     // accumulators; acc[cur] takes updates
	cur      int              // which accumulator takes updates
	fresh    bool             // acc[cur] holds nothing yet: the first update overwrites
	merged   int              // updates (or averages) in acc[cur]
	steps    []int64          // the senders' steps of the updates in acc[cur] (gossip)
	model    func() []float64 // epidemic: the node's model, for peers' fetches
	sess     *session         // the active session, nil for none
	cache    []float64        // the last parameters the trainer gave
	cacheAt  int64            // the step they had taken
	asking   chan struct{}    // closed when the request in flight ends; nil for none
	askErr   error
	stepNow  func() int64 // the node's step (for the cache)
	received atomic.Uint64
}

// NewModel returns the model of a driven node (node.WithModel), whose
// shape the first trainer fixes.
func NewModel() *Model { return &Model{} }

// fix sets the task's shape, or checks a later trainer's against it.
func (t *Model) fix(name string, id uint32, n int, epidemic bool) (changed bool, err error) {
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
func (t *Model) shape() (name string, id uint32, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.name, t.modelID.Load(), int(t.numParams.Load())
}

// begin starts taking updates for sess, into acc (two buffers of
// NumParams values each); under epidemic model gives the node's model.
func (t *Model) begin(sess *session, acc [2][]float32, model func() []float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sess, t.accept = sess, true
	t.acc, t.cur, t.fresh, t.merged, t.steps = acc, 0, true, 0, t.steps[:0]
	t.model = model
	t.cache = nil
}

// end stops taking updates and drops what was not pulled.
func (t *Model) end(sess *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sess != sess {
		return
	}
	t.sess, t.accept = nil, false
	t.acc, t.merged, t.steps, t.model, t.cache = [2][]float32{}, 0, nil, nil, nil
}

// dropPending forgets the updates the trainer has not pulled yet (the
// current accumulator is marked fresh: the next update overwrites it) and
// the cached parameters: the trainer takes the job's parameters in place
// of its own, which those updates were made against.
func (t *Model) dropPending() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fresh, t.merged, t.steps = true, 0, t.steps[:0]
	t.cache = nil
}

// Apply32 adds a peer's update (gossip), made at step, to the current
// accumulator. Without a trainer it is dropped: a new trainer starts from
// the job's model.
func (t *Model) Apply32(u []float32, step int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.accept {
		return nil
	}
	if len(u) != int(t.numParams.Load()) {
		return fmt.Errorf("update of %d values, the model has %d", len(u), t.numParams.Load())
	}
	a := t.acc[t.cur]
	if t.fresh {
		copy(a, u)
	} else {
		for i, x := range u {
			a[i] += x
		}
	}
	t.fresh = false
	t.merged++
	t.steps = append(t.steps, step)
	t.received.Add(1)
	return nil
}

// pullAverage (epidemic) has the node write the change its average makes
// into the current accumulator, through merge (node.Driver.Merge32), and
// hands it over as pull does.
func (t *Model) pullAverage(merge func([]float32) int) (buf []float32, index, merged int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.accept {
		return nil, 0, 0
	}
	k := merge(t.acc[t.cur])
	if k == 0 {
		return nil, 0, 0
	}
	buf, index = t.acc[t.cur], t.cur
	t.cur ^= 1
	t.fresh, t.merged = true, 0
	return buf, index, k
}

// pull hands the current accumulator to the trainer: it returns the
// buffer and its index, how many updates it merges (0: nothing, and the
// buffer is nil), and their senders' steps (valid until the next pull).
// The trainer may read the buffer until its next pull.
func (t *Model) pull() (buf []float32, index, merged int, steps []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.merged == 0 || !t.accept {
		return nil, 0, 0, nil
	}
	buf, index, merged = t.acc[t.cur], t.cur, t.merged
	steps = append([]int64(nil), t.steps...)
	t.cur ^= 1
	t.fresh, t.merged, t.steps = true, 0, t.steps[:0]
	return buf, index, merged, steps
}

// Apply adds a peer's update (gossip, float64: a sparse encoding's) to
// the accumulator, as Apply32 does; its step is not known.
func (t *Model) Apply(u []float64) error {
	v := make([]float32, len(u))
	for i, x := range u {
		v[i] = float32(x)
	}
	t.mu.Lock()
	accept := t.accept
	t.mu.Unlock()
	if !accept {
		return nil
	}
	if err := t.Apply32(v, -1); err != nil {
		return err
	}
	t.mu.Lock()
	t.steps = t.steps[:len(t.steps)-1] // no step to tell its staleness by
	t.mu.Unlock()
	return nil
}

// NumParams is the trainer's parameter count, 0 until a trainer fixes it.
func (t *Model) NumParams() int { return int(t.numParams.Load()) }

// ModelID is the trainer's model ID.
func (t *Model) ModelID() uint32 { return t.modelID.Load() }

// Params returns the trainer's parameters (see ParamsContext), waiting up
// to ten seconds; nil if the trainer does not give them.
func (t *Model) Params() []float64 {
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
func (t *Model) ParamsContext(ctx context.Context) ([]float64, error) {
	t.mu.Lock()
	if t.epidemic && t.model != nil {
		model := t.model
		t.mu.Unlock()
		if p := model(); p != nil {
			return p, nil
		}
		t.mu.Lock()
	}
	for {
		if t.sess == nil {
			t.mu.Unlock()
			return nil, errors.New("no trainer connected")
		}
		if t.cache != nil && t.stepNow != nil && t.cacheAt == t.stepNow() {
			p := append([]float64(nil), t.cache...)
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
	return append([]float64(nil), p...), nil
}

// SetParams is not used: a driven node's averages go to its trainer
// through Merge32, and the job's model at a session's start or a reset.
func (t *Model) SetParams([]float64) error {
	return errors.New("trainer: a driven node's model is its trainer's")
}
