package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/psp"
)

// genesisLen is the length of a Genesis, as step protocol 1.1.0 sends it.
const genesisLen = wire.GenesisLen

// Genesis names a lineage of a job. The node that starts a job (it found
// no peer of the job when it began to train) makes one: its clock in Unix
// nanoseconds (8 bytes, big-endian), then 8 random bytes. A node that
// joins takes the genesis of the peers it joined, so every node trained
// from one start shares it. Two groups of nodes of one job that trained
// apart, such as a first node restarted without a way back to its peers,
// have different geneses; when they meet, the group with the older
// genesis (the smaller, compared as 16 big-endian bytes) is the job, and
// the nodes of the other adopt its step and model. The zero Genesis means
// none.
type Genesis [genesisLen]byte

// NewGenesis makes a genesis at now.
func NewGenesis(now time.Time) Genesis {
	var g Genesis
	binary.BigEndian.PutUint64(g[:8], uint64(now.UnixNano()))
	_, _ = rand.Read(g[8:])
	if g.IsZero() { // a clock at the epoch and 8 zero bytes: never in practice
		g[15] = 1
	}
	return g
}

// IsZero reports whether g is none.
func (g Genesis) IsZero() bool { return g == Genesis{} }

// Older reports whether g is a genesis older than h, which may be none.
func (g Genesis) Older(h Genesis) bool {
	return !g.IsZero() && (h.IsZero() || bytes.Compare(g[:], h[:]) < 0)
}

// Time is when g was made, by its maker's clock.
func (g Genesis) Time() time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(g[:8]))) }

// String is g in hex, "" for none.
func (g Genesis) String() string {
	if g.IsZero() {
		return ""
	}
	return hex.EncodeToString(g[:])
}

// Lineages and models at first contact.
//
// Every step message of protocol 1.1.0 says which genesis (lineage of the
// job) and which model its sender has (internal/wire/stepext.go). A node
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
//     its queries wake nothing, and while it is on a younger genesis its
//     updates are not applied. If its genesis is older, this node is on the
//     younger fork: Run converges (converge) as a joining node does, asking
//     the older lineage's peers for their steps, adopting psp.JoinStep of
//     them even if it is below its own, fetching the model from one, and
//     taking that genesis. Its peers of the younger fork then hear the
//     older genesis from it and follow.
//   - No genesis on either side, or the same one, or a 1.0.0 peer (nothing
//     said): the peer counts as before.
//
// A node takes its genesis at its join: the oldest among the peers that
// answered, or a new one (NewGenesis) if none had one. Config.Genesis sets
// it beforehand (testnets, whose nodes start together, give them all one).
// A node with none (Config.JoinFetch off and no Config.Genesis) judges no
// lineage. Converging is for nodes that Run: a driven node takes the
// older lineage when its trainer begins a session (Driver.Begin).

// kinship is how a step message's sender stands to this node.
type kinship int

const (
	kin        kinship = iota // counts as before
	otherFork                 // another lineage of the job: does not count
	otherModel                // another model: held out
)

const (
	// forkHold is how long a peer last heard on a younger genesis has its
	// updates dropped: it converges within a step or two, and its later
	// reports say so.
	forkHold = 30 * time.Second
	// convergeRetry is the least time between two attempts to converge.
	convergeRetry = time.Second
	// maxYounger bounds the peers remembered on a younger genesis.
	maxYounger = 8192
	// maxWarnedModels bounds the peers warned about for another model.
	maxWarnedModels = 256
	// quietConverge is the step up to which converging is logged at info
	// level, not as a warning (genesis.go's converge).
	quietConverge = 10
)

// lineage is a node's genesis and what it has heard of others. Safe for
// concurrent use.
type lineage struct {
	mu        sync.Mutex
	own       Genesis
	older     Genesis   // the oldest genesis heard that is older than own; zero: none
	olderFrom []peer.ID // peers that reported it (at most psp.JoinSample)
	younger   map[peer.ID]time.Time
	retryAt   time.Time // converge no sooner
	warned    map[peer.ID]bool
	mismatch  *ModelMismatchError // the first peer of another model met

	otherReports  prometheus.Counter
	otherUpdates  prometheus.Counter
	converged     prometheus.Counter
	modelMismatch prometheus.Counter
}

func newLineage(reg prometheus.Registerer, g Genesis) *lineage {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Name: name, Help: help})
	}
	l := &lineage{
		own:     g,
		younger: make(map[peer.ID]time.Time),
		warned:  make(map[peer.ID]bool),
		otherReports: c("step_reports_other_lineage_total",
			"Step reports and queries not counted because the peer is on another lineage (genesis) of the job: a fork that has not converged yet."),
		otherUpdates: c("updates_other_lineage_total",
			"Received updates dropped because their sender was last heard on a younger lineage (genesis) of the job."),
		converged: c("forks_joined_total",
			"Times this node left its lineage of the job for an older one it met, adopting that lineage's step and model."),
		modelMismatch: c("peers_model_mismatch_total",
			"Peers held out of samples, population and routing table because they run another model (model id or parameter count)."),
	}
	reg.MustRegister(l.otherReports, l.otherUpdates, l.converged, l.modelMismatch)
	return l
}

// genesis is the node's own genesis (zero: none).
func (l *lineage) genesis() Genesis {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.own
}

// set makes g the node's genesis; an older genesis heard before that is
// not older than g is forgotten.
func (l *lineage) set(g Genesis) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.own = g
	if !l.older.Older(g) {
		l.older, l.olderFrom = Genesis{}, nil
	}
}

// judge records that p reported genesis g and says whether p counts.
func (l *lineage) judge(p peer.ID, g Genesis, now time.Time) kinship {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.IsZero() || l.own.IsZero() || g == l.own {
		delete(l.younger, p)
		return kin
	}
	if g.Older(l.own) {
		delete(l.younger, p)
		if g.Older(l.older) {
			l.older, l.olderFrom = g, nil
		}
		if g == l.older && len(l.olderFrom) < psp.JoinSample && !slices.Contains(l.olderFrom, p) {
			l.olderFrom = append(l.olderFrom, p)
		}
	} else {
		if len(l.younger) >= maxYounger {
			clear(l.younger)
		}
		l.younger[p] = now
	}
	l.otherReports.Inc()
	return otherFork
}

// fromYounger reports whether p was heard on a younger genesis lately.
func (l *lineage) fromYounger(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.younger[p]
	return ok && now.Sub(at) < forkHold
}

// due reports whether an older genesis is known and an attempt to converge
// may start at now.
func (l *lineage) due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.older.IsZero() && !now.Before(l.retryAt)
}

// target returns the older genesis and the peers that reported it, and
// holds off the next attempt for convergeRetry.
func (l *lineage) target(now time.Time) (Genesis, []peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.retryAt = now.Add(convergeRetry)
	return l.older, slices.Clone(l.olderFrom)
}

// noteMismatch records a peer of another model; firstMismatch returns the
// first recorded (nil for none).
func (l *lineage) noteMismatch(mm *ModelMismatchError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mismatch == nil {
		l.mismatch = mm
	}
}

func (l *lineage) firstMismatch() *ModelMismatchError {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mismatch
}

// warnFirst reports whether p has not been warned about yet, and notes it.
func (l *lineage) warnFirst(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.warned[p] || len(l.warned) >= maxWarnedModels {
		return false
	}
	l.warned[p] = true
	return true
}

// modelFixed reports whether the node's model is known: always, except for
// a driven node before its first trainer fixed it (then its NumParams is 0
// and says nothing).
func (n *Node) modelFixed() bool { return n.driver == nil || n.modelUp.Load() }

// ownExt is what this node's 1.1.0 step messages say of it.
func (n *Node) ownExt() wire.StepExt {
	e := wire.StepExt{Genesis: n.lin.genesis()}
	if n.modelFixed() {
		e.HasModel, e.ModelID, e.Params = true, n.task.ModelID(), uint32(n.task.NumParams())
	}
	if s := n.cfg.Barrier.BaseStaleness(); s >= 0 { // ASP records no waiters (noteAsker)
		e.Notices, e.Staleness = true, uint32(s)
	}
	return e
}

// admit judges what peer p's step message said of it (e, nil for a 1.0.0
// message; see the top of this file). A peer that runs another model is
// held out; quiet leaves the warning to the caller.
func (n *Node) admit(p peer.ID, e *wire.StepExt, quiet bool) kinship {
	if e == nil {
		return kin
	}
	if e.HasModel && n.modelFixed() {
		if e.ModelID != n.task.ModelID() || int64(e.Params) != int64(n.task.NumParams()) {
			n.holdOut(p, e, quiet)
			return otherModel
		}
		if n.ov.Readmit(p) {
			n.log.Info("a peer held out for another model now runs this node's model: let back in", "peer", p)
		}
	}
	return n.lin.judge(p, e.Genesis, time.Now())
}

// mismatchOf is the error that says p runs another model than this node.
func (n *Node) mismatchOf(p peer.ID, e *wire.StepExt) *ModelMismatchError {
	return &ModelMismatchError{Peer: p.String(), PeerModel: e.ModelID, PeerParams: int64(e.Params),
		OwnModel: n.task.ModelID(), OwnParams: int64(n.task.NumParams())}
}

// holdOut keeps a peer that runs another model out of this node's view of
// the job, and says so once.
func (n *Node) holdOut(p peer.ID, e *wire.StepExt, quiet bool) {
	if n.ov.HeldOut(p) {
		return
	}
	n.ov.HoldOut(p)
	n.progress.forget(p)
	n.steps.drop(p)
	n.lin.modelMismatch.Inc()
	mm := n.mismatchOf(p, e)
	n.lin.noteMismatch(mm)
	if !quiet {
		n.warnModels([]*ModelMismatchError{mm})
	}
}

// warnModels says, once per peer, that peers run another model.
func (n *Node) warnModels(ms []*ModelMismatchError) {
	for _, mm := range ms {
		if p, err := peer.Decode(mm.Peer); err == nil && n.lin.warnFirst(p) {
			n.log.Warn("a peer runs another model: held out of this node's samples and population; every node of a job must run the same --model (and --data)",
				"err", mm.Error())
		}
	}
}

// takeGenesis sets the node's genesis after its join, if it has none: the
// lineage of the peers it joined (g), or a new one.
func (n *Node) takeGenesis(g Genesis) {
	if !n.lin.genesis().IsZero() {
		return
	}
	made := g.IsZero()
	if made {
		g = NewGenesis(time.Now())
	}
	n.lin.set(g)
	n.log.Debug("genesis", "genesis", g.String(), "new", made)
}

// convergeDue reports whether Run should try to converge now (only a node
// that Runs converges; a driven node does at its trainer's next Begin).
func (n *Node) convergeDue() bool { return n.driver == nil && n.lin.due(time.Now()) }

// converge moves the node onto the older lineage it heard of: it asks the
// peers that reported it, and a fresh sample, for their steps; adopts
// psp.JoinStep of the steps of the oldest lineage among the answers (even
// below its own: the older lineage is the job) and fetches the model from
// one of its peers; then takes that genesis and forgets what it judged
// of peers' reports under its old one. On failure it tries again later.
func (n *Node) converge(ctx context.Context) {
	target, from := n.lin.target(time.Now())
	if target.IsZero() {
		return
	}
	peers := from
	for _, p := range n.sample(ctx, psp.JoinSample) {
		if !slices.Contains(peers, p) {
			peers = append(peers, p)
		}
	}
	own := n.lin.genesis()
	js := n.jobStateOf(ctx, peers, n.step.Load(), false)
	if ctx.Err() != nil {
		return
	}
	n.warnModels(js.others)
	if js.genesis.IsZero() || !js.genesis.Older(own) {
		n.log.Debug("no peer of the older lineage answered; trying again later", "lineage", target.String())
		return
	}
	if n.task.NumParams() > 0 {
		if js.model == nil {
			n.log.Warn("met an older lineage of the job but could not fetch its model: trying again", "err", js.fetchErr)
			return
		}
		if err := n.task.SetParams(js.model.Params); err != nil {
			n.log.Warn("met an older lineage of the job but could not take its model: trying again", "peer", js.from, "err", err)
			return
		}
	}
	was := n.step.Load()
	n.lin.set(js.genesis)
	n.adoptStep(js.adopt)
	n.screen = screenFor(n.cfg.Screen) // reports judged under the old lineage
	n.progress.reset()
	n.lin.converged.Inc()
	// Nodes that start a job together may each start a lineage and meet
	// in their first steps: that is no news. Later it is a fork worth a
	// warning (a node restarted apart from its peers).
	level := slog.LevelWarn
	if was <= quietConverge {
		level = slog.LevelInfo
	}
	n.log.Log(ctx, level, "met an older lineage of this job (a fork, or nodes that started it at once): took its step and model",
		"lineage", js.genesis.String(), "started", js.genesis.Time().UTC().Format(time.RFC3339), "step", js.adopt, "was", was, "model_from", js.from, "observed", js.observed)
}

// errModelMismatch returns the *ModelMismatchError in err, if any.
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
