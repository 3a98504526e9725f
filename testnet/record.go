package testnet

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// record takes one snapshot of every live node.
func (t *testnet) record(now time.Duration) report.Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := t.liveLocked()
	truth := float64(len(live))
	snap := report.Snapshot{Elapsed: now, Wall: -1, Live: len(live), EstimateError: math.NaN(), Accuracy: math.NaN()}
	var steps []int64
	var rel []float64
	sec := now.Seconds()
	for _, m := range live {
		if m.probe || m.quit {
			continue // reported apart (Hostility.Wedge), or no longer training
		}
		s := m.nd.Step()
		if s != m.lastStep {
			m.lastStep, m.freeSince, m.progressAt = s, -1, now
		}
		steps = append(steps, s)
		t.steps = append(t.steps, report.StepRow{T: sec, Node: m.idx, Step: s})
		if m.nd.Waiting() {
			snap.Waiting++
		}
		if est, _, err := m.nd.Overlay().Estimate(); err == nil {
			rel = append(rel, math.Abs(est-truth)/truth)
		} else {
			rel = append(rel, 1) // no estimate counts as 100 % off
		}
		if t.play.IsVictim(m.nd.ID()) {
			t.play.RecordVictim(m.nd, rel[len(rel)-1], truth)
		}
		if m.role == plan.Honest {
			used := m.nd.Population()
			t.usedErr = append(t.usedErr, math.Abs(used-truth)/truth)
			t.usedMax = max(t.usedMax, used)
			if used > 0 {
				t.usedOff = max(t.usedOff, used/truth, truth/used)
			}
		}
	}
	// Stalled: no progress for StallWindow while the node was free to go
	// on: its barrier, evaluated on the true live population, would have
	// let it all along, and it was not busy computing its own step (a
	// straggler's long step is not a stall) — unless that one step has
	// lasted stallStepShare times its mean task time, which no time model
	// draw explains (a machine starved of CPU does).
	minStep := slices.Min(append(steps, math.MaxInt64))
	s := t.cfg.Barrier.BaseStaleness()
	for _, m := range live {
		if m.probe || m.quit {
			continue
		}
		allowed := s < 0 || minStep >= m.lastStep-int64(s)
		free := stallFree(allowed, faults.Computing(m.nd), now-m.progressAt, t.longestStep(m))
		if m.noteFree(now, free, t.cfg.StallWindow) {
			t.stalls[m.idx] = true
		}
	}
	if row, ok := report.Summarise(&snap, steps, rel, sec, len(live)); ok {
		t.ests = append(t.ests, row)
	}
	t.relErr = rel
	if len(t.accs) > 0 {
		snap.Accuracy = t.accs[len(t.accs)-1].Accuracy
	}
	return snap
}

// stallStepShare is how many times its mean task time a node's step may
// take before the stall rule stops counting it as computing: the time
// model draws (Exp(1) + 1) × the mean / 2, so a step this long has odds
// below e^-19.
const stallStepShare = 10

// stallFree is the stall rule's "free to go on": the barrier on the true
// population allows the node's next step, and the node is not computing,
// or has been computing one step for longer than longest (when longest >
// 0) since its last progress.
func stallFree(allowed, computing bool, sinceProgress, longest time.Duration) bool {
	return allowed && (!computing || (longest > 0 && sinceProgress > longest))
}

// longestStep is the longest step the time model explains for m, or 0
// without a time model (steps take what their compute takes).
func (t *testnet) longestStep(m *member) time.Duration {
	if t.cfg.TimeScale <= 0 {
		return 0
	}
	return time.Duration(stallStepShare * 2 * t.cfg.TimeScale * m.factor * float64(time.Second))
}

// recordLoop records every RecordEvery until ctx ends; it calls started
// once its ticker is set.
func (t *testnet) recordLoop(ctx context.Context, started func()) {
	tick := time.NewTicker(t.cfg.RecordEvery)
	defer tick.Stop()
	started()
	var lastUpdates uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		snap := t.record(time.Since(t.start))
		if t.quarter == nil && snap.Elapsed >= t.cfg.Duration/4 {
			q := sampleResources(snap.Live)
			t.quarter = &q
		}
		if w := t.wallNow(); w >= 0 {
			snap.Wall = w - t.wall0
		}
		u := t.updatesReceived()
		snap.UpdatesPerSec = float64(u-lastUpdates) / t.cfg.RecordEvery.Seconds()
		lastUpdates = u
		if t.cfg.Progress != nil {
			t.cfg.Progress(snap)
		}
	}
}

func (t *testnet) updatesReceived() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, m := range t.members {
		n += m.updateStats().Received
	}
	return n
}

func (t *testnet) evalLoop(ctx context.Context) {
	tick := time.NewTicker(t.cfg.EvalEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.evaluate(time.Since(t.start))
		}
	}
}

// metric names what Accuracy measures for the configured model.
func (t *testnet) metric() string {
	if t.cfg.Model == "linreg" {
		return "r2"
	}
	return "accuracy"
}

// evaluate scores the models of up to three random honest live nodes on
// the held-out data and records their mean.
func (t *testnet) evaluate(now time.Duration) {
	t.mu.Lock()
	var honest []*member
	for _, m := range t.liveLocked() {
		if m.role == plan.Honest && !m.probe {
			honest = append(honest, m)
		}
	}
	var pick []*member
	for _, j := range t.rng.Perm(len(honest))[:min(3, len(honest))] {
		pick = append(pick, honest[j])
	}
	var updates float64
	for _, m := range t.members {
		updates += float64(m.updateStats().Sent)
	}
	inBytes := meanInBytes(honest)
	t.mu.Unlock()
	var acc, loss float64
	k := 0
	for _, m := range pick {
		ev, ok := m.nd.Model().(node.Evaluator)
		if !ok {
			continue
		}
		r, err := ev.Evaluate()
		if err != nil {
			continue
		}
		if t.cfg.Model == "linreg" {
			acc += r.R2
		} else {
			acc += r.Accuracy
		}
		loss += r.Loss
		k++
	}
	if k == 0 {
		return
	}
	t.mu.Lock()
	t.accs = append(t.accs, report.AccRow{T: now.Seconds(), Accuracy: acc / float64(k), Loss: loss / float64(k), Updates: updates, InBytes: inBytes})
	t.mu.Unlock()
}
