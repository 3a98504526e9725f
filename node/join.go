package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/checkpoint"
	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/barrier"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// resume loads the checkpoint, if one is configured and present. A bad
// checkpoint is logged and ignored; join then fetches the model from peers.
func (n *Node) resume() {
	if n.cfg.Checkpoint == "" {
		return
	}
	c, err := checkpoint.Read(n.cfg.Checkpoint)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		n.log.Error("ignoring checkpoint; the model will come from peers", "file", n.cfg.Checkpoint, "err", err)
		return
	case c.Job != n.cfg.Job || c.ModelID != n.model.ModelID() || len(c.Params) != n.model.NumParams():
		n.log.Error("ignoring checkpoint of another job or model; the model will come from peers",
			"file", n.cfg.Checkpoint, "job", c.Job, "params", len(c.Params))
		return
	}
	if len(c.Params) > 0 {
		if err := n.model.SetParams(c.Params); err != nil {
			n.log.Error("ignoring checkpoint", "file", n.cfg.Checkpoint, "err", err)
			return
		}
	}
	n.adoptStep(c.Step)
	n.log.Info("resumed from checkpoint", "file", n.cfg.Checkpoint, "step", c.Step)
}

// adoptStep sets the node's step to one it did not count itself (from a
// checkpoint, or the job's on joining): the step it reports, its
// exchange's (a push of nothing: the gossip topic's step), and the task's
// (StepAware), whose learning-rate schedule would otherwise start again
// at LR0.
func (n *Node) adoptStep(step int64) {
	n.step.Store(step)
	n.m.Step.Set(float64(step))
	n.exch().Push(n.life, step, nil, nil)
	if sa, ok := n.model.(StepAware); ok {
		sa.SetStep(step)
	}
}

// checkpoint writes the step and model to the checkpoint file.
func (n *Node) checkpoint() {
	if n.cfg.Checkpoint == "" {
		return
	}
	c := checkpoint.Checkpoint{Job: n.cfg.Job, Step: n.step.Load(), ModelID: n.model.ModelID(), Params: n.model.Params()}
	if err := checkpoint.Write(n.cfg.Checkpoint, c); err != nil {
		n.log.Warn("checkpoint failed", "err", err)
	}
}

// waitPeers blocks until the overlay knows cfg.WaitPeers peers, or
// StartTimeout passes (then it goes on with what it has).
func (n *Node) waitPeers(ctx context.Context) error {
	if n.cfg.WaitPeers <= 0 {
		return nil
	}
	deadline := time.Now().Add(n.cfg.StartTimeout)
	for n.ov.PeerCount() < n.cfg.WaitPeers && time.Now().Before(deadline) {
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// join adopts a step and the model of a running job. A node given
// bootstrap peers first waits, however long it takes, until its overlay
// knows a peer of the job (the join keeps retrying meanwhile, see
// package overlay): a node that trained alone until its bootstrap came up
// would bring a model of its own into the job. Then it asks up to
// psp.JoinSample peers for their steps; if the job has started (the median
// is above this node's step), it adopts psp.JoinStep and fetches the model
// from an answering peer (trying up to three), verifying it. If every fetch
// fails it trains from its own parameters and says so. It takes the
// lineage of the peers it joined, or starts one (genesis.go). It fails
// only if it joins through bootstrap peers (or remembered ones) and the
// job runs another model than this node: a *ModelMismatchError. (A node
// without them starts the job: peers of another model that reach it are
// held out, and it goes on.)
func (n *Node) join(ctx context.Context) error {
	joining := n.ov.Joining() // (a node whose only bootstrap address is its own starts the job)
	if joining && !n.awaitFirstPeer(ctx, nil) {
		return nil
	}
	js := n.jobState(ctx, n.step.Load(), false, nil)
	if ctx.Err() != nil {
		return nil
	}
	mm := errModelMismatch(js.fetchErr)
	if mm == nil && js.observed == 0 {
		mm = n.kin.firstMM.Load() // every peer it met runs another model
	}
	if mm != nil && joining {
		return mismatchExit(mm)
	}
	n.kin.warnModels(js.others)
	n.kin.takeGenesis(js.genesis)
	if js.adopt <= n.step.Load() {
		return nil
	}
	if n.model.NumParams() > 0 {
		if js.model == nil {
			n.log.Warn("joined a running job but could not fetch the model: training from own parameters", "err", js.fetchErr)
		} else if err := n.model.SetParams(to64(js.model)); err != nil {
			n.log.Warn("joined a running job but could not take its model: training from own parameters", "peer", js.from, "err", err)
		} else {
			n.log.Info("joined a running job: fetched the model", "peer", js.from, "peer_step", js.modelStep, "peers", js.sources)
		}
	}
	n.adoptStep(js.adopt)
	n.log.Info("adopted step", "step", js.adopt, "observed", js.observed)
	return nil
}

// jobView is what a joining node learns of its job: the step to adopt
// (psp.JoinStep of the steps observed; the node's own when the job is not
// ahead), and, when the job is ahead, the model fetched from an answering
// peer.
type jobView struct {
	adopt     psp.Step
	observed  int
	model     []float32 // nil: not fetched
	modelStep psp.Step  // the step of the first peer that gave a part of it
	from      peer.ID   // that peer
	sources   int       // the peers that gave a part of it
	fetchErr  error     // why no model was fetched, when one was wanted
	// genesis is the lineage of the peers whose steps were observed:
	// the one lineage.Decide picks from the answers and this node's
	// history (zero if none said one).
	genesis lineage.Genesis
	// others are the peers met that run another model (their replies
	// said so, or their model did): held out, their steps not observed.
	// The caller says so (warnModels), or fails.
	others []*ModelMismatchError
	// said: a peer of the job's lineage said in its step reply that it
	// runs this node's model (step protocol 1.1.0), so the job's model is
	// known; unsaid are the peers of the lineage whose replies could not
	// say (1.0.0), whom only a model reply tells.
	said   bool
	unsaid []peer.ID
	// agreed: a strict majority of the answers lie within soloStep of
	// the adopted step.
	agreed bool
	// contested: at least joinDissent answers beyond soloStep lie
	// farther than soloStep from the adopted step: the answers of the
	// running job split into camps.
	contested bool
}

// jobState asks up to psp.JoinSample peers for their steps and, if the job
// is ahead of own, fetches the model from an answering peer, trying up to
// three. When the job is not ahead and verify is set, it reads only the
// head of a peer's model reply, to check that the job runs this node's
// model. When no peer that answered runs this node's model, fetchErr is a
// *ModelMismatchError.
//
// A step and a model to adopt are claims, and a joiner's first peers are
// whoever it was told to bootstrap through: when the job is beyond
// soloStep, jobState takes the lower median of the answers at once only
// when joinQuorum peers of the job answered and a strict majority of the
// answers lie within soloStep of that median
// (agreed); otherwise it asks a fresh sample every joinQuorumPoll, while
// its overlay meets more of the job, until that holds or
// joinQuorumWait passed, and then takes the median of what it heard.
// A few identities claiming a step far ahead, met first, thus wait for
// the honest peers the overlay finds, who outnumber them: the lower
// median is an honest step once most answers are honest. A joiner of a
// job of fewer than joinQuorum other nodes waits joinQuorumWait (three
// identities that agree are not enough to go on); the barrier's wedge watch
// corrects a lie that gets through (realign.go). A job at soloStep or
// below has just started (its other nodes are still joining): its
// answers are taken at once.
//
// Answers that split into camps (contested: joinDissent or more of them
// past soloStep and far from the median, whatever their number; a peer
// at soloStep or below, another joiner say, is no camp) are not taken at once
// either: a camp of identities that claim a step far ahead can be most of
// a joiner's first sample when it bootstrapped through one of them, even
// where honest nodes are most of the job. Then jobState asks every peer
// its overlay can draw (up to joinAskAll, and one host's identities no
// more than one peer of their own: Overlay.SampleUpTo), at once and then
// every joinQuorumPoll until joinQuorumWait has passed, and takes the
// lower median of the last answers: the honest step once honest nodes
// are most of the peers it knows. A job whose honest nodes are that far apart (slow workers more
// than soloStep behind the rest) costs a joiner that wait, and no more.
// The model, when fetched, goes into dst (the model's length; nil: a new
// vector).
func (n *Node) jobState(ctx context.Context, own psp.Step, verify bool, dst []float32) jobView {
	deadline := time.Now().Add(joinQuorumWait)
	contested, askedAll := false, false
	for {
		var peers []peer.ID
		if contested {
			peers, askedAll = drawAll(ctx, n.ov, n.bar), true
		} else {
			peers = n.bar.Sample(ctx, psp.JoinSample)
		}
		v, from, ahead := n.readJob(ctx, peers, own)
		if ahead && v.adopt > soloStep && v.contested && !contested {
			contested = true
			if ctx.Err() == nil {
				continue // ask every known peer now, even at the deadline
			}
		}
		settled := v.observed >= joinQuorum && v.agreed && !contested
		if !ahead || v.adopt <= soloStep || settled || !time.Now().Before(deadline) || ctx.Err() != nil {
			switch {
			case contested && askedAll && ahead:
				n.log.Warn("the peers' steps split into camps: took the lower median of every known peer's step",
					"step", v.adopt, "answers", v.observed, "waited", joinQuorumWait)
			case ahead && v.adopt > soloStep && !settled:
				n.log.Warn("few peers of the job answered, and not alike: taking the median of their steps",
					"step", v.adopt, "answers", v.observed, "waited", joinQuorumWait)
			}
			return n.fetchJobModel(ctx, v, from, ahead, verify, dst)
		}
		if vclock.Sleep(ctx, min(joinQuorumPoll, time.Until(deadline))); ctx.Err() != nil {
			return v
		}
	}
}

// drawAll is up to joinAskAll of the peers ov can draw, at most
// Overlay's PerAddress of one shared address (Overlay.SampleUpTo): one
// host's many identities count as one peer there too. (A closed overlay:
// the barrier's sample, which is then empty.)
func drawAll(ctx context.Context, ov *overlay.Overlay, bar *barrier.Barrier) []peer.ID {
	peers, err := ov.SampleUpTo(ctx, joinAskAll)
	if err != nil {
		return bar.Sample(ctx, psp.JoinSample)
	}
	return peers
}

const (
	// joinQuorumWait bounds how long jobState asks again for more
	// answers when few peers said the job is ahead.
	joinQuorumWait = 10 * time.Second
	// joinQuorumPoll is how often it asks.
	joinQuorumPoll = time.Second
	// joinQuorum answers, most of them within soloStep of their median
	// and fewer than joinDissent beyond it, are taken at once.
	joinQuorum = 5
	// joinDissent answers far from the median make the answers
	// contested (one may be a single liar); joinAskAll bounds how many
	// peers a contested join asks.
	joinDissent = 2
	joinAskAll  = 64
	// soloStep is the step up to which the answers are taken at once.
	soloStep = 64
)

// readJob asks peers for their steps. Of the answers, only those of the
// job's lineage among them count: the lineage lineage.Decide picks from
// them and this node's own history (all of them if none said one). If
// that is not the node's own genesis, the node is on another fork of the
// job: the lineage's step is adopted and its model fetched even when it
// is not ahead of own (genesis.go). It returns
// the view, the peers of the job's lineage that answered, those nearest
// the adopted step first (the model is fetched from them in that order,
// so a peer that claims a step beyond every other's gives neither), and
// whether the job is ahead (a step and model are to be adopted).
func (n *Node) readJob(ctx context.Context, peers []peer.ID, own psp.Step) (jobView, []peer.ID, bool) {
	v := jobView{adopt: own}
	if len(peers) == 0 {
		return v, nil, false
	}
	replies := n.bar.Ask(ctx, peers)
	type answered struct {
		p peer.ID
		r wire.StepReply
	}
	var good []answered
	for i, r := range replies {
		if r.Err != nil || r.Reply.Leaving {
			continue
		}
		p := peers[i]
		if n.kin.Admit(p, r.Reply.Ext, true) == lineage.OtherModel {
			v.others = append(v.others, n.kin.mismatchOf(p, r.Reply.Ext))
			continue
		}
		good = append(good, answered{p, r.Reply})
		if r.Reply.Estimate > 0 {
			// The joiner's own estimate needs time; until then its
			// learning rate follows what its peers report.
			n.ov.ObserveEstimate(p, r.Reply.Estimate)
			n.pop.NotePeerEstimate(r.Reply.Estimate)
		}
	}
	n.pop.Repopulate() // the estimates just reported count at once
	if len(good) == 0 {
		if len(v.others) > 0 {
			v.fetchErr = v.others[0]
		}
		return v, nil, false
	}
	genesisOf := func(r wire.StepReply) lineage.Genesis {
		if r.Ext == nil {
			return lineage.Genesis{}
		}
		return r.Ext.Genesis
	}
	mine := n.kin.lin.Own()
	ps, gs := make([]peer.ID, len(good)), make([]lineage.Genesis, len(good))
	for i, a := range good {
		ps[i], gs[i] = a.p, genesisOf(a.r)
	}
	v.genesis = n.kin.lin.Choose(ps, gs, time.Now())
	var steps []psp.Step
	var on []answered
	for _, a := range good {
		if v.genesis.IsZero() || genesisOf(a.r) == v.genesis {
			steps = append(steps, a.r.Step)
			on = append(on, a)
			switch {
			case a.r.Ext == nil:
				v.unsaid = append(v.unsaid, a.p)
			case a.r.Ext.HasModel && n.kin.modelFixed(): // admitted: this node's model
				v.said = true
			}
		}
	}
	v.observed = len(steps)
	if v.observed == 0 { // only this node is on the job's lineage
		v.genesis = mine
		return v, nil, false
	}
	converging := !mine.IsZero() && v.genesis != mine
	median := psp.JoinStep(steps)
	ahead := median > own || converging
	if ahead {
		v.adopt = median
	}
	near, far := 0, 0
	for _, s := range steps {
		switch {
		case stepGap(s, median) <= soloStep:
			near++
		case s > soloStep:
			far++ // a peer of the running job that disagrees
		}
	}
	v.agreed = 2*near > len(steps)
	// Peers at soloStep or below (other joiners, still at their start)
	// are no camp: they would make every join beside another one wait.
	v.contested = far >= joinDissent
	slices.SortStableFunc(on, func(a, b answered) int {
		return cmp.Compare(stepGap(a.r.Step, v.adopt), stepGap(b.r.Step, v.adopt))
	})
	from := make([]peer.ID, len(on))
	for i, a := range on {
		from[i] = a.p
	}
	return v, from, ahead
}

// stepGap is |a − b| without overflow.
func stepGap(a, b psp.Step) uint64 {
	if a > b {
		return uint64(a) - uint64(b)
	}
	return uint64(b) - uint64(a)
}

// fetchJobModel completes v: when the job is ahead, it fetches the model
// from the peers of from (fetchModel: several at once, in their order)
// into dst (nil: a new vector); otherwise, with verify, it checks that the
// job runs this node's model: done if a peer's step reply said so, else it
// reads the head of the model reply of a peer whose step reply could not
// say (1.0.0). A peer whose 1.1.0 reply named no model has none to show (a
// daemon before its trainer: its model stream resets), and is not asked:
// at a job's start, when no peer has its trainer yet, asking each cost a
// round trip of the session's start.
func (n *Node) fetchJobModel(ctx context.Context, v jobView, from []peer.ID, ahead, verify bool, dst []float32) jobView {
	if n.model.NumParams() == 0 {
		return v
	}
	if !ahead {
		if verify && !v.said {
			// Only which model the job runs: the head of a reply is
			// enough; the first that says decides.
			for i := 0; i < len(v.unsaid) && i < 3; i++ {
				err := n.mp.peek(ctx, v.unsaid[i])
				if mm := (*ModelMismatchError)(nil); errors.As(err, &mm) {
					v.fetchErr = err
					return v
				}
				if err == nil {
					break
				}
			}
		}
		return v
	}
	if dst == nil {
		dst = make([]float32, n.model.NumParams())
	}
	// A peer that turns out to run another model (a pspnode before step
	// protocol 1.1.0 did not say so in its step reply) is held out and
	// does not count among the failures. If every peer asked runs
	// another model, fetchErr says so.
	began := time.Now()
	f, mismatches, err := n.mp.fetch(ctx, from, dst)
	if err == nil {
		// Each part's giver held to other peers' copies (crosscheck.go):
		// an outvoted giver's parts come again from the others, once.
		if out := n.mp.crossCheck(ctx, from, f, dst); len(out) > 0 {
			from = slices.DeleteFunc(slices.Clone(from), func(p peer.ID) bool { return slices.Contains(out, p) })
			var more []*ModelMismatchError
			f, more, err = n.mp.fetch(ctx, from, dst)
			mismatches = append(mismatches, more...)
		}
	}
	for _, mm := range mismatches {
		v.others = append(v.others, mm)
		p, _ := peer.Decode(mm.Peer)
		n.kin.holdOut(p, &wire.StepExt{HasModel: true, ModelID: mm.PeerModel, Params: uint32(mm.PeerParams)}, true)
	}
	if err != nil {
		v.fetchErr = err
		return v
	}
	v.model, v.modelStep, v.from, v.sources = dst, f.step, f.from, f.peers
	took := time.Since(began)
	mib := float64(4*len(dst)) / (1 << 20)
	n.log.Info("fetched the job's model", "mib", fmt.Sprintf("%.1f", mib), "peers", f.peers, "first", f.from,
		"seconds", fmt.Sprintf("%.2f", took.Seconds()), "mib_per_s", fmt.Sprintf("%.1f", mib/max(took.Seconds(), 1e-9)))
	return v
}

// to64 is v as float64 (a built-in task's parameters).
func to64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// firstPeerPoll is how often a node that has not met a peer of its job
// looks again.
const firstPeerPoll = 20 * time.Millisecond

// awaitFirstPeer blocks until the overlay knows a peer, or every peer met
// was held out for running another model, or ctx ends (false). Every StartTimeout it logs that the node is still waiting, and
// why, from the join's last error; with report, it tells report instead,
// every waitingReportEvery.
func (n *Node) awaitFirstPeer(ctx context.Context, report func(reason string, waited time.Duration)) bool {
	start := time.Now()
	every := n.cfg.StartTimeout
	if report != nil {
		every = waitingReportEvery
	}
	next := start.Add(every)
	t := time.NewTicker(firstPeerPoll)
	defer t.Stop()
	for n.ov.PeerCount() == 0 && n.kin.firstMM.Load() == nil {
		if now := time.Now(); !now.Before(next) {
			if report != nil {
				report(n.notReady(), now.Sub(start))
			} else {
				n.log.Warn("not training yet: no peer of the job reached; the join keeps retrying",
					"waited", now.Sub(start).Round(time.Second), "last_error", n.ov.JoinStatus().JoinError)
			}
			next = now.Add(every)
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	n.boot.mark(msFirstPeer)
	return true
}
