package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pspnode/pspnode/psp"
)

// Realigning: taking the job's step and model again after the join.
//
// A node takes the job's step and model when it joins (join.go). It takes
// them again, between two steps, when it finds either
//
//   - that its lineage is not the job's, as lineage.Decide rules on a
//     sample's answers and the node's own history (genesis.go); it
//     converges on that lineage; or
//   - that it is wedged: far ahead of every peer it samples, check after
//     check (psp.Wedge), as a node that adopted one liar's step at its join
//     would be; it takes the job's step and model on its own lineage.
//
// Either way the step is psp.JoinStep of several peers' answers and the
// model comes from a peer at that step, as at a join. A node that Runs
// sets its task's parameters; a driven node hands the step and model to
// its trainer (Driver.TakeReset), which replaces its own. Either is a
// reset, held to a rate and counted (resets.go).

// realignDue reports whether the node should realign before its next step.
func (n *Node) realignDue() bool {
	return n.bar.Wedged() || n.kin.lin.Due(time.Now())
}

// realign converges on the job's lineage, or unwedges, as due. It reports
// whether the node's step and model changed.
func (n *Node) realign(ctx context.Context) bool {
	moved := false
	if n.kin.lin.Due(time.Now()) {
		moved = n.converge(ctx)
	}
	if n.bar.TakeWedged() && !moved {
		moved = n.unwedge(ctx)
	}
	n.bar.ResetWedge()
	return moved
}

// converge looks whether the job's lineage is another than this node's,
// and if so moves the node onto it: it asks a uniform sample of its peers
// for their steps, and lineage.Decide says which lineage is the job's
// from their answers and what this node has seen of its own lineage and
// theirs (genesis.go). If that is another lineage, the node adopts
// psp.JoinStep of the steps of that lineage's peers in the sample (even
// below its own) and takes the model of one of them at that step; then
// takes that genesis and forgets what it judged of peers' reports under
// its old one. Only the sample counts: the peers heard on the other
// lineage are not asked first, so that a fork that talks a lot weighs no
// more than its share of the job. A move is a reset (resets.go): refused
// for the rate, the node looks again later, as if it had stayed.
func (n *Node) converge(ctx context.Context) bool {
	own := n.kin.lin.Own()
	v, from, ahead := n.readJob(ctx, n.bar.Sample(ctx, psp.JoinSample), n.step.Load())
	if ctx.Err() != nil {
		return false
	}
	n.kin.warnModels(v.others)
	if v.genesis.IsZero() || v.genesis == own || !n.resets.allowed(resetLineage) {
		n.kin.lin.Looked(time.Now(), true)
		return false
	}
	n.kin.lin.Looked(time.Now(), false)
	js := n.fetchJobModel(ctx, v, from, ahead, false, nil)
	was := n.step.Load()
	if !n.rebase(js, "met the job's lineage") {
		return false
	}
	n.resets.done(resetLineage)
	// Nodes that start a job together may each start a lineage and meet
	// in their first steps: that is no news. Later it is a fork worth a
	// warning (a node restarted apart from its peers).
	level := slog.LevelWarn
	if was <= quietConverge && js.adopt <= quietConverge {
		level = slog.LevelInfo
	}
	n.log.Log(ctx, level, "met the job's lineage (a fork, or nodes that started the job at once): took its step and model",
		"lineage", js.genesis.String(), "started", js.genesis.Time().UTC().Format(time.RFC3339), "step", js.adopt, "was", was,
		"model_from", js.from, "observed", js.observed)
	return true
}

// unwedge takes the job's step and model again for a node far ahead of
// every peer it samples (psp.Wedge): psp.JoinStep of a fresh sample's
// steps, if at least two peers answer and that step is still far behind
// this node's. It reports whether it did.
func (n *Node) unwedge(ctx context.Context) bool {
	was := n.step.Load()
	v, from, ahead := n.readJob(ctx, n.bar.Sample(ctx, psp.JoinSample), 0)
	if ctx.Err() != nil {
		return false
	}
	if v.observed < 2 || v.adopt >= was-n.bar.WedgeGap() {
		n.log.Debug("far ahead of the peers sampled, but the job's step is not clear", "step", was, "job_step", v.adopt, "observed", v.observed)
		return false
	}
	if !n.resets.allowed(resetWedged) {
		return false
	}
	js := n.fetchJobModel(ctx, v, from, ahead, false, nil)
	if !n.rebase(js, "far ahead of every peer it asked") {
		return false
	}
	n.resets.done(resetWedged)
	n.m.Unwedged.Inc()
	n.log.Warn("this node was far ahead of every peer it asked (it had taken a step no other peer has): took the job's step and model again",
		"step", js.adopt, "was", was, "model_from", js.from, "observed", js.observed)
	return true
}

// rebase makes the job's state in js the node's: its model (the task's
// parameters, or the driven node's trainer's through Driver.TakeReset),
// its step and its lineage. It reports false, and changes nothing, when no
// model came with js or the task refused it.
func (n *Node) rebase(js jobView, why string) bool {
	if n.model.NumParams() > 0 {
		if js.model == nil {
			n.log.Warn("could not fetch the job's model: trying again", "why", why, "err", js.fetchErr)
			return false
		}
		n.exch().Restart(js.model)
		if n.driver != nil {
			n.driver.setReset(Reset{Step: js.adopt, Params: js.model, Lineage: js.genesis.String(),
				Reason: fmt.Sprintf("%s: took the job's step %d and the model of peer %s", why, js.adopt, js.from)})
		} else if err := n.model.SetParams(to64(js.model)); err != nil {
			n.log.Warn("could not take the job's model: trying again", "why", why, "peer", js.from, "err", err)
			return false
		}
	}
	if !js.genesis.IsZero() && js.genesis != n.kin.lin.Own() {
		n.kin.lin.Set(js.genesis)
		n.kin.lin.Converged.Inc()
		n.kin.checkClock(js.genesis)
	}
	n.adoptStep(js.adopt)
	n.bar.ResetPeers() // reports judged under the old step or lineage
	return true
}
