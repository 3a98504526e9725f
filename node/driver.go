package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"time"

	"github.com/pspnode/pspnode/internal/checkpoint"
	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/node/barrier"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

// Reset is the job's state a driven node hands its program when it moved
// to it between two steps (realign.go): the node left its lineage for the
// job's, or found itself far ahead of every peer. The program replaces its
// parameters by Params and its count of completed steps by Step; its next
// step is Step+1, whose barrier passes at once.
type Reset struct {
	Step    psp.Step
	Params  []float32
	Lineage string // the job's lineage (its genesis in hex)
	Reason  string
}

// setReset records a reset for the program, replacing one it has not
// taken.
func (d *Driver) setReset(r Reset) {
	d.resetMu.Lock()
	defer d.resetMu.Unlock()
	d.reset = &r
}

// TakeReset returns the reset the program must take, once (nil for none).
// The program takes it before its next step: a Barrier that returns
// BarrierResult.Reset set one.
func (d *Driver) TakeReset() *Reset {
	d.resetMu.Lock()
	defer d.resetMu.Unlock()
	r := d.reset
	d.reset = nil
	return r
}

// ErrStepOrder is wrapped by the errors of calls for a step out of order:
// a barrier or a step other than the next, or a step whose barrier has not
// passed.
var ErrStepOrder = errors.New("step out of order")

// ErrBadUpdate is wrapped by the errors about an update a driver hands
// over: the wrong length, a value that is not finite or exceeds the
// exchange's bound.
var ErrBadUpdate = errors.New("bad update")

// ErrNotDriven is returned by Driver for a node not built with
// Config.Driven, and by Run for one that is.
var ErrNotDriven = errors.New("node: not a driven node")

// Driver returns the node's driver (Config.Driven).
func (n *Node) Driver() (*Driver, error) {
	if n.driver == nil {
		return nil, ErrNotDriven
	}
	return n.driver, nil
}

// notReady says why the node cannot start a session yet ("" when it can):
// as /health, while the node has not joined; then while it knows no peer
// of its job.
func (n *Node) notReady() string {
	st := n.ov.JoinStatus()
	if !st.Joined {
		why := st.JoinError
		if why == "" {
			why = "joining"
		}
		return "not joined: " + why
	}
	if n.ov.PeerCount() == 0 && n.ov.Joining() {
		return "joined, but no peer of job " + n.cfg.Job + " known yet"
	}
	return ""
}

// Ready returns nil once a session can start without waiting, or why it
// would wait.
func (d *Driver) Ready() error {
	if why := d.n.notReady(); why != "" {
		return errors.New(why)
	}
	return nil
}

// Attach sets up the exchange for the node's model, once the task knows
// its shape (a trainer said what it runs). It is idempotent.
func (d *Driver) Attach(ctx context.Context) error {
	if d.n.model.NumParams() <= 0 {
		return errors.New("node: attach: the task has no parameters")
	}
	return d.n.attachModel(ctx)
}

// Start is where a session starts: the steps completed, and the
// parameters to start from when they are not the program's own.
type Start struct {
	Step   psp.Step
	Params []float32 // nil: the program keeps its own; else Begin's dst, or a new vector
	Source string    // where Params come from; "" for none
}

// waitingReportEvery is how often Begin reports that it is still waiting.
const waitingReportEvery = 2 * time.Second

// Begin starts a session for a program whose parameters have taken own
// steps. A node with bootstrap peers first waits until it knows a peer of
// its job, calling report (if not nil) every two seconds with the reason,
// as /health gives it. Then it takes the later of own and its checkpoint
// (Config.Checkpoint, if it holds this job's model), and asks peers for
// the job's step: if the job is ahead, the session starts at the job's
// step with a model fetched from a peer. It fetches a peer's model in any
// case, to check that the job runs the same model: a *ModelMismatchError
// says it does not. A job that is ahead but whose model no peer gave is an
// error, so that the program does not bring stale parameters into it; it
// can try again. The parameters to start from, when not the program's
// own, are written into dst (the model's length; nil: a new vector): a
// large model comes from several peers at once, each block straight to
// where the program reads it.
func (d *Driver) Begin(ctx context.Context, own psp.Step, report func(reason string, waited time.Duration), dst []float32) (Start, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.n
	if own < 0 {
		return Start{}, fmt.Errorf("%w: negative step %d", ErrStepOrder, own)
	}
	if !n.modelUp.Load() {
		return Start{}, errors.New("node: begin: no model attached (Driver.Attach)")
	}
	n.boot.mark(msSession)
	if n.ov.Joining() && !n.awaitFirstPeer(ctx, report) {
		return Start{}, ctx.Err()
	}
	waitSubscribed(ctx, n.Gossip(), (*exchangeNode)(n).PeerCount()) // gossip: a peer knows of this node's subscription
	if dst != nil && len(dst) != n.model.NumParams() {
		return Start{}, fmt.Errorf("node: begin: a destination of %d values for a model of %d", len(dst), n.model.NumParams())
	}
	start := Start{Step: own}
	if step, p, ok := d.readCheckpoint(own, dst); ok {
		start = Start{Step: step, Params: p, Source: "checkpoint " + n.cfg.Checkpoint}
	}
	fctx := ctx
	if report != nil {
		began := time.Now()
		fctx = withFetchProgress(ctx, func(line string) { report(line, time.Since(began)) })
	}
	js := n.jobState(fctx, start.Step, true, dst)
	if err := ctx.Err(); err != nil {
		return Start{}, err
	}
	if mm := (*ModelMismatchError)(nil); errors.As(js.fetchErr, &mm) {
		return Start{}, mm
	}
	if mm := n.kin.firstMM.Load(); mm != nil && js.observed == 0 && n.ov.PeerCount() == 0 && n.ov.Joining() {
		return Start{}, mm // every peer it met runs another model
	}
	n.kin.warnModels(js.others)
	// On another fork of the job (genesis.go), the job's lineage's step
	// and model are the job's, even below this node's.
	mine := n.kin.lin.Own()
	forked := !mine.IsZero() && !js.genesis.IsZero() && js.genesis != mine
	if js.adopt > start.Step || forked {
		if js.model == nil {
			return Start{}, fmt.Errorf("node: the job is at step %d but no peer gave its model (%v)", js.adopt, js.fetchErr)
		}
		src := fmt.Sprintf("peer %s at step %d", js.from, js.modelStep)
		if js.sources > 1 {
			src = fmt.Sprintf("%d peers, the first %s at step %d", js.sources, js.from, js.modelStep)
		}
		start = Start{Step: js.adopt, Params: js.model, Source: src}
	}
	if forked {
		n.kin.lin.Set(js.genesis)
		n.bar.ResetPeers()
		n.kin.lin.Converged.Inc()
		n.log.Warn("met the job's lineage (a fork): the session starts from its step and model", "lineage", js.genesis.String(), "step", js.adopt)
	}
	d.TakeReset() // the session starts from the job's state already
	n.kin.takeGenesis(js.genesis)
	n.exch().Restart(start.Params) // the session's model, or the program's own (nil: at its first push)
	n.adoptStep(start.Step)
	now := time.Now()
	d.first, d.passed, d.computeFrom = start.Step+1, start.Step+1, now
	n.lastStepAt = now
	n.boot.mark(msWelcome)
	return start, nil
}

// readCheckpoint reads the node's checkpoint into dst (nil: a new
// vector) if it holds this job's model at a step beyond own: it returns
// the step and the parameters.
func (d *Driver) readCheckpoint(own psp.Step, dst []float32) (psp.Step, []float32, bool) {
	n := d.n
	if n.cfg.Checkpoint == "" {
		return 0, nil, false
	}
	h, err := checkpoint.ReadHeader(n.cfg.Checkpoint)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, nil, false
	case err != nil:
		n.log.Error("ignoring checkpoint", "file", n.cfg.Checkpoint, "err", err)
		return 0, nil, false
	case h.Job != n.cfg.Job || h.ModelID != n.model.ModelID() || h.N != n.model.NumParams():
		n.log.Error("ignoring checkpoint of another job or model", "file", n.cfg.Checkpoint, "job", h.Job, "params", h.N)
		return 0, nil, false
	case h.Step <= own:
		return 0, nil, false
	}
	if dst == nil {
		dst = make([]float32, h.N)
	}
	if _, err := checkpoint.ReadInto(n.cfg.Checkpoint, dst); err != nil {
		n.log.Error("ignoring checkpoint", "file", n.cfg.Checkpoint, "err", err)
		return 0, nil, false
	}
	return h.Step, dst, true
}

// Activate makes the node a participant: its peers count it at their
// barriers again, and it takes in their updates. client names the
// driving program for Status.
func (d *Driver) Activate(client string) {
	d.infoMu.Lock()
	d.client = client
	d.infoMu.Unlock()
	d.n.idle.Store(false)
	d.n.log.Info("trainer session started", "client", client, "step", d.n.step.Load())
}

// Deactivate takes the node out of its peers' barriers and population:
// it answers step queries as leaving, and tells up to 32 peers at once
// (within 300 ms) that it leaves, as Leave does.
func (d *Driver) Deactivate(why string) {
	n := d.n
	if n.idle.Swap(true) {
		return
	}
	d.infoMu.Lock()
	client := d.client
	d.client = ""
	d.infoMu.Unlock()
	n.log.Info("trainer session ended: out of peers' barriers until a trainer returns", "client", client, "step", n.step.Load(), "why", why)
	n.announceLeave(deactivateNotice)
}

// deactivateNotice is how long Deactivate gives its leave notices.
const deactivateNotice = 300 * time.Millisecond

// Active reports whether the node participates (Activate was called and
// Deactivate not since).
func (d *Driver) Active() bool { return !d.n.idle.Load() }

// BarrierResult is what a barrier took.
type BarrierResult struct {
	Waited time.Duration
	Checks int
	// Reason is "" when the node did not wait; otherwise what the last
	// failed check saw.
	Reason string
	// Reset: instead of passing, the node took the job's step and model;
	// the program must take them (TakeReset) before its next step.
	Reset bool
}

// Barrier returns when the node may take step, which must be one more
// than the steps completed. The session's first step, and a step whose
// barrier already passed, pass at once.
func (d *Driver) Barrier(ctx context.Context, step psp.Step) (BarrierResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.n
	if done := n.step.Load(); step != done+1 {
		return BarrierResult{}, fmt.Errorf("%w: barrier for step %d, but %d steps are completed: the next barrier is for step %d", ErrStepOrder, step, done, done+1)
	}
	if step == d.passed {
		return BarrierResult{}, nil
	}
	if n.realignDue() && n.realign(ctx) { // between steps, as Run does
		return d.realigned(BarrierResult{}), nil
	}
	out, err := n.bar.Wait(ctx)
	if err != nil {
		return BarrierResult{Waited: out.Waited, Checks: out.Checks}, err
	}
	if out.Realigned {
		return d.realigned(BarrierResult{Waited: out.Waited, Checks: out.Checks}), nil
	}
	d.passed, d.computeFrom = step, time.Now()
	res := BarrierResult{Waited: out.Waited, Checks: out.Checks}
	if out.Checks > 1 {
		res.Reason = waitReason(n.cfg.Barrier, step-1, out)
	}
	return res, nil
}

// realigned completes res for a barrier at which the node took the job's
// step and model (realign.go): the program must take them (TakeReset)
// before its next step, which is the job's step + 1 and passes at once.
// d.mu is held.
func (d *Driver) realigned(res BarrierResult) BarrierResult {
	now := time.Now()
	next := d.n.step.Load() + 1
	d.first, d.passed, d.computeFrom = next, next, now
	d.n.lastStepAt = now
	res.Reset = true
	return res
}

// waitReason says what the last failed check of a barrier saw.
func waitReason(sp psp.Spec, done psp.Step, out barrier.Outcome) string {
	if out.Isolated {
		return fmt.Sprintf("%d check(s) failed; at the last, no peer answered: the node is isolated (it waits until a peer answers)", out.Checks-1)
	}
	who := "sampled"
	if sp.Global() {
		who = "known"
	}
	return fmt.Sprintf("%d check(s) failed; at the last, %d of %d %s peers were more than %d steps behind step %d",
		out.Checks-1, out.Failed.Lagging, out.Observed, who, out.Failed.Staleness, done)
}

// Done counts step, which must be the next and have passed its barrier,
// as completed; its update then goes to the exchange with Push.
func (d *Driver) Done(step psp.Step) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkOrderLocked(step); err != nil {
		return err
	}
	n := d.n
	n.countStep(n.life, time.Since(d.computeFrom))
	return nil
}

// Push hands the exchange what a step counted by Done made (nil: nothing):
// under gossip v is the step's delta, which is published; under epidemic
// (Info().Exchange.Kind.Averages()) it is the program's model after the
// step, which becomes the node's model (the base of its averages and the
// model it sends, which a peer that fetches the model gets) and goes to
// peers. v must have the model's length (else nothing is sent and the
// error wraps ErrBadUpdate), and every value must be finite and within
// the exchange's bound, which the caller has checked (CheckUpdate): Push
// does not read v twice. copied, if not nil, is called once v has been
// copied (into the node's model, or the message to send): the caller may
// change v from then on, while Push signs and sends (milliseconds for a
// large model under gossip). Push may run on another goroutine than the
// other calls, but pushes must come in the order of their steps, and
// under epidemic before the next Merge.
func (d *Driver) Push(step psp.Step, v []float32, copied func()) error {
	n := d.n
	if v != nil && len(v) != n.model.NumParams() {
		if copied != nil {
			copied()
		}
		return fmt.Errorf("%w: %d values, the model has %d parameters", ErrBadUpdate, len(v), n.model.NumParams())
	}
	n.exch().Push(n.life, step, v, copied)
	return nil
}

// CheckUpdate checks what a program hands Push or Merge: the model's
// length, and every value finite and within the exchange's bound
// (DriverInfo.MaxAbsValue). The error wraps ErrBadUpdate.
func (d *Driver) CheckUpdate(v []float32) error { return d.n.checkUpdate(v) }

// Merge averages the models received since the last merge into x, the
// program's model (the model's length), in place, and returns how many it
// averaged (epidemic); the program takes x as its parameters (when 0, x
// is as it was). With step < 0, x is the model as the program's last Push
// gave it; with step >= 0, x is the model after step, which Done counted
// and Push has not taken (the caller has checked it, as for Push): Merge
// takes it in the same pass, as Push would, and the average goes to
// peers. x of another length than the model's is not taken: 0. Under
// gossip it returns 0: the peers' updates reach the model as they arrive
// (Model.Apply).
func (d *Driver) Merge(step psp.Step, x []float32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(x) != d.n.model.NumParams() {
		return 0
	}
	return d.n.exch().Merge(step, x)
}

// ReadModel copies the values [lo, hi) of the node's model, as its
// exchange holds it (epidemic: the program's model after its last step
// and average), into dst; false when it holds none (gossip, or before the
// program's first step).
func (d *Driver) ReadModel(lo, hi int, dst []float32) bool { return d.n.exch().ReadModel(lo, hi, dst) }

// NoteApplied records that the program applied updates its peers made at
// the given steps (under gossip, at its pull): their staleness, the
// node's step now minus theirs, goes to psp_update_staleness_steps.
func (d *Driver) NoteApplied(steps []int64) {
	n := d.n
	now := n.step.Load()
	for _, s := range steps {
		n.m.Staleness.Observe(float64(now - s))
	}
}

// CheckOrder says whether step may be done now (Done would count it): it
// is the next step and has passed its barrier.
func (d *Driver) CheckOrder(step psp.Step) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checkOrderLocked(step)
}

func (d *Driver) checkOrderLocked(step psp.Step) error {
	if done := d.n.step.Load(); step != done+1 {
		return fmt.Errorf("%w: step %d done, but %d steps are completed: the next is step %d", ErrStepOrder, step, done, done+1)
	}
	if d.passed != step {
		return fmt.Errorf("%w: step %d has not passed its barrier: call Barrier(%d) first", ErrStepOrder, step, step)
	}
	return nil
}

// checkUpdate checks a driver's update: the model's length, finite
// values within the exchange's bound.
func (n *Node) checkUpdate(v []float32) error {
	if v == nil {
		return nil
	}
	if len(v) != n.model.NumParams() {
		return fmt.Errorf("%w: %d values, the model has %d parameters", ErrBadUpdate, len(v), n.model.NumParams())
	}
	bound := n.cfg.Exchange.MaxAbsValue
	if i, x := f32.First(v, f32.Limit(float32(min(bound, math.MaxFloat32)))); i >= 0 {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("%w: value %d is %v", ErrBadUpdate, i, x)
		}
		return fmt.Errorf("%w: value %d is %v, beyond the exchange's bound of ±%v", ErrBadUpdate, i, x, bound)
	}
	return nil
}

// Population returns the population estimate and the factor a step's
// update should be scaled by (Config.ScaleLR: 1/N̂ under gossip, 1 under
// epidemic; 1 without ScaleLR).
func (d *Driver) Population() (estimate, lrScale float64) {
	n := d.n
	lrScale = 1
	if n.cfg.ScaleLR {
		lrScale = 1 / max(lrPopulation(&n.cfg, n.pop), 1)
	}
	return n.pop.Population(), lrScale
}

// Evaluated records the driving program's held-out evaluation after step,
// for Status and the loss and accuracy metrics (accuracy NaN: none).
func (d *Driver) Evaluated(step psp.Step, loss, accuracy float64) {
	n := d.n
	n.m.Loss.Set(loss)
	if !math.IsNaN(accuracy) {
		n.m.Accuracy.Set(accuracy)
	}
	n.lastEval.Store(&evalResult{Step: step, Loss: loss, Accuracy: accuracy})
}

// ErrNoCheckpoint is returned by Driver.Checkpoint for a node without a
// checkpoint file.
var ErrNoCheckpoint = errors.New("no checkpoint file configured")

// Checkpoint writes params, which have taken step steps, to the node's
// checkpoint file (Config.Checkpoint), which Begin resumes from: params
// (the model's length), or, when nil, the node's model as its exchange
// holds it (ReadModel: the program's after its last step, epidemic). It
// is written as float32 a block at a time, and returns the file's path.
func (d *Driver) Checkpoint(step psp.Step, params []float32) (string, error) {
	n := d.n
	if n.cfg.Checkpoint == "" {
		return "", ErrNoCheckpoint
	}
	if step < 0 {
		return "", fmt.Errorf("%w: negative step %d", ErrStepOrder, step)
	}
	np := n.model.NumParams()
	read := func(lo, hi int, dst []float32) error {
		if !d.ReadModel(lo, hi, dst) {
			return errors.New("the node holds no model yet (before the program's first step)")
		}
		return nil
	}
	if params != nil {
		if len(params) != np {
			return "", fmt.Errorf("%w: %d values, the model has %d parameters", ErrBadUpdate, len(params), np)
		}
		read = func(lo, hi int, dst []float32) error { copy(dst, params[lo:hi]); return nil }
	}
	h := checkpoint.Header{Job: n.cfg.Job, Step: step, ModelID: n.model.ModelID(), N: np}
	if err := checkpoint.Write32(n.cfg.Checkpoint, h, read); err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadUpdate, err)
	}
	return n.cfg.Checkpoint, nil
}

// clientName returns who drives the node, "" for no one.
func (d *Driver) clientName() string {
	d.infoMu.Lock()
	defer d.infoMu.Unlock()
	return d.client
}

// DriverInfo describes the job a driven node is in.
type DriverInfo struct {
	Job      string
	PeerID   string
	Barrier  psp.Spec
	Exchange exchange.Spec
	// MaxAbsValue bounds every value of an update (Exchange.MaxAbsValue).
	MaxAbsValue float64
}

// Info describes the node's job.
func (d *Driver) Info() DriverInfo {
	n := d.n
	return DriverInfo{Job: n.cfg.Job, PeerID: n.ID().String(), Barrier: n.cfg.Barrier, Exchange: n.cfg.Exchange.Spec, MaxAbsValue: n.cfg.Exchange.MaxAbsValue}
}
