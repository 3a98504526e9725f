package node

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/overlay"
)

// Lineages and models at first contact.
//
// Every step message of protocol 1.1.0 says which genesis (lineage of the
// job) and which model its sender has (wire.StepExt). A node
// judges each one it receives, query or reply (admit):
//
//   - Another model (both sides' models fixed; ids or parameter counts
//     differ): the peer is held out of the overlay (samples, population,
//     routing table: overlay.HoldOut) and its reports never count. Each
//     side logs it, once per peer. A node that finds at its join that no
//     peer that answered runs its model stops: Run returns the
//     *ModelMismatchError (pspnode run exits 2 naming --model). A peer
//     held out that later shows this node's model is let back in.
//   - Another genesis: the peer's step reports do not count at the
//     barrier (they would stall one side or be quarantined by the other),
//     its queries wake nothing, and its updates are not applied while it
//     was last heard on another lineage. Having heard one, the node looks
//     whether that lineage is the job's (converge): it asks a uniform
//     sample of its peers for their steps and lineage.Decide says, from
//     the answers and what this node has seen: a node that has trained
//     beside a peer of its own lineage for lineage.YoungFor moves only to
//     a lineage it has heard for longer than it has been on its own (or
//     about as long, and more of the sample is on it); one that has not
//     (restarted alone, or one of nodes that started the job at once)
//     moves where more of the sample is, a coin deciding a tie. If that
//     is another lineage, the node adopts psp.JoinStep of its peers'
//     steps even if it is below its own, takes the model from a peer at
//     that step and takes the genesis (a reset: at most resetBurst per
//     resetEvery, realign.go). Its peers then hear the job's genesis from
//     it and follow. A driven node hands the job's step and model to its
//     trainer (Driver.TakeReset). So identities this node has just met,
//     however many and whatever genesis they claim, move no node that has
//     trained with its peers; a lone node joins the job at once.
//   - No genesis on either side, or the same one, or a 1.0.0 peer (nothing
//     said): the peer counts as before.
//
// A node takes its genesis at its join: the lineage most of the peers
// that answered are on, or a new one (NewGenesis) if none had one.
// Config.Genesis sets it beforehand (testnets, whose nodes start
// together, give them all one). A node with none (Config.JoinFetch off
// and no Config.Genesis) judges no lineage.

// quietConverge is the step up to which converging is logged at info
// level, not as a warning (realign.go).
const quietConverge = 10

// modelFixed reports whether the node's model is known: always, except for
// a driven node before its first trainer fixed it (then its NumParams is 0
// and says nothing).
func (k *kinship) modelFixed() bool { return k.fixed() }

// ownExt is what this node's 1.1.0 step messages say of it.
func (k *kinship) ownExt() wire.StepExt {
	e := wire.StepExt{Genesis: k.lin.Own()}
	if k.modelFixed() {
		e.HasModel, e.ModelID, e.Params = true, k.model.ModelID(), uint32(k.model.NumParams())
	}
	if s := k.staleness; s >= 0 { // ASP records no waiters (noteAsker)
		e.Notices, e.Staleness = true, uint32(s)
	}
	return e
}

// admit judges what peer p's step message said of it (e, nil for a 1.0.0
// message; see the top of this file). A peer that runs another model is
// held out; quiet leaves the warning to the caller.
func (k *kinship) Admit(p peer.ID, e *wire.StepExt, quiet bool) lineage.Kinship {
	if e == nil {
		return lineage.Kin
	}
	if e.HasModel && k.modelFixed() {
		if e.ModelID != k.model.ModelID() || int64(e.Params) != int64(k.model.NumParams()) {
			k.holdOut(p, e, quiet)
			return lineage.OtherModel
		}
		if k.ov.Readmit(p) {
			k.log.Info("a peer held out for another model now runs this node's model: let back in", "peer", p)
		}
	}
	return k.lin.Judge(p, e.Genesis, time.Now())
}

// mismatchOf is the error that says p runs another model than this node.
func (k *kinship) mismatchOf(p peer.ID, e *wire.StepExt) *ModelMismatchError {
	return &ModelMismatchError{Peer: p.String(), PeerModel: e.ModelID, PeerParams: int64(e.Params),
		OwnModel: k.model.ModelID(), OwnParams: int64(k.model.NumParams())}
}

// holdOut keeps a peer that runs another model out of this node's view of
// the job, and says so once.
func (k *kinship) holdOut(p peer.ID, e *wire.StepExt, quiet bool) {
	if k.ov.HeldOut(p) {
		return
	}
	k.ov.HoldOut(p)
	k.forget(p)
	k.lin.ModelMismatch.Inc()
	mm := k.mismatchOf(p, e)
	k.firstMM.CompareAndSwap(nil, mm) // the first peer of another model met
	if !quiet {
		k.warnModels([]*ModelMismatchError{mm})
	}
}

// warnModels says, once per peer, that peers run another model.
func (k *kinship) warnModels(ms []*ModelMismatchError) {
	for _, mm := range ms {
		if p, err := peer.Decode(mm.Peer); err == nil && k.lin.WarnFirst(p) {
			k.log.Warn("a peer runs another model: held out of this node's samples and population; every node of a job must run the same --model (and --data)",
				"err", mm.Error())
		}
	}
}

// takeGenesis sets the node's genesis after its join, if it has none: the
// lineage of the peers it joined (g), or a new one.
func (k *kinship) takeGenesis(g lineage.Genesis) {
	if !k.lin.Own().IsZero() {
		return
	}
	made := g.IsZero()
	if made {
		g = lineage.NewGenesis(time.Now())
	}
	k.lin.Set(g)
	k.log.Debug("genesis", "genesis", g.String(), "new", made)
	k.checkClock(g)
}

// checkClock warns when the genesis this node takes was made in its
// future: a clock is off. Lineages do not depend on clocks (genesis.go:
// the job's lineage is the one most peers are on), so the job goes on;
// but the logs' times and a lineage's "started" disagree.
func (k *kinship) checkClock(g lineage.Genesis) {
	if ahead, off := lineage.ClockOff(g, time.Now()); off {
		k.log.Warn("this node's clock is behind the clock of the node that started the job's lineage (or that one is ahead): the job goes on, lineages do not depend on clocks, but check the machines' time (NTP)",
			"lineage", g.String(), "started", g.Time().UTC().Format(time.RFC3339), "ahead_of_this_clock", ahead.Round(time.Second))
	}
}

// errModelMismatch returns the *ModelMismatchError in err, if any.
// kinship judges which peers are of the node's job: the same model (its
// ID and size) and the same lineage (genesis). It holds the node's lineage
// and the first peer of another model it met, and it holds peers of
// another model out of the overlay.
type kinship struct {
	lin       *lineage.Lineage
	model     Model
	fixed     func() bool // the model is known: not a driven node before its trainer's model
	staleness int         // the barrier's base staleness (a negative one: ASP)
	ov        *overlay.Overlay
	forget    func(peer.ID) // drop a held-out peer's known step and idle stream
	log       *slog.Logger
	// firstMM is the first peer of another model the node met (nil: none).
	firstMM atomic.Pointer[ModelMismatchError]
}

func errModelMismatch(err error) *ModelMismatchError {
	var mm *ModelMismatchError
	if errors.As(err, &mm) {
		return mm
	}
	return nil
}

// mismatchExit wraps a model mismatch found at the join for Run's caller.
func mismatchExit(mm *ModelMismatchError) error {
	return fmt.Errorf("node: the job runs another model than this node: %w", mm)
}

// ForgetLineage forgets what p showed of its lineage: it left or failed
// (barrier.Kin).
func (k *kinship) ForgetLineage(p peer.ID) { k.lin.Forget(p) }
