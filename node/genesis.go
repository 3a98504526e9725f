package node

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/wire"
)

// genesisLen is the length of a Genesis, as step protocol 1.1.0 sends it.
const genesisLen = wire.GenesisLen

// Genesis names a lineage of a job. The node that starts a job (it found
// no peer of the job when it began to train) makes one: its clock in Unix
// nanoseconds (8 bytes, big-endian), then 8 random bytes. A node that
// joins takes the genesis of the peers it joined, so every node trained
// from one start shares it. Two groups of nodes of one job that trained
// apart, such as a first node restarted without a way back to its peers,
// or nodes that started the job at the same moment, have different
// geneses; when they meet, the lineage that more of the peers a node
// hears from are on is the job (the older genesis breaks a tie), and the
// nodes of the other adopt its step and model. A genesis is a claim, and
// its age proves nothing: a peer that says its lineage began in 1970
// moves no node on its own. The zero Genesis means none.
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
//     sample of its peers for their steps; when more of them are on
//     another lineage than on its own (counting itself), or as many and
//     that lineage's genesis is the older, that lineage is the job, and
//     the node adopts psp.JoinStep of its peers' steps even if it is below
//     its own, takes the model from a peer at that step and takes the
//     genesis. Its peers then hear the job's genesis from it and
//     follow. A driven node hands the job's step and model to its trainer
//     (Driver.TakeReset). So one peer, whatever genesis it claims, moves
//     no node whose lineage another peer shares; two nodes alone settle on
//     the older genesis.
//   - No genesis on either side, or the same one, or a 1.0.0 peer (nothing
//     said): the peer counts as before.
//
// A node takes its genesis at its join: the lineage most of the peers
// that answered are on, or a new one (NewGenesis) if none had one.
// Config.Genesis sets it beforehand (testnets, whose nodes start
// together, give them all one). A node with none (Config.JoinFetch off
// and no Config.Genesis) judges no lineage.

// kinship is how a step message's sender stands to this node.
type kinship int

const (
	kin        kinship = iota // counts as before
	otherFork                 // another lineage of the job: does not count
	otherModel                // another model: held out
)

const (
	// forkHold is how long a peer last heard on another lineage has its
	// updates dropped, and how long what a peer said of its lineage counts
	// towards the job's lineage (lineage.choice).
	forkHold = 30 * time.Second
	// convergeRetry is the least time between two attempts to converge.
	convergeRetry = time.Second
	// maxLineagesHeard bounds the peers whose lineage is remembered.
	maxLineagesHeard = 8192
	// maxWarnedModels bounds the peers warned about for another model.
	maxWarnedModels = 256
	// quietConverge is the step up to which converging is logged at info
	// level, not as a warning (genesis.go's converge).
	quietConverge = 10
)

// heardLineage is the lineage a peer last said it was on, and when.
type heardLineage struct {
	g  Genesis
	at time.Time
}

// lineage is a node's genesis and what it has heard of others. Safe for
// concurrent use.
type lineage struct {
	mu        sync.Mutex
	own       Genesis
	others    map[peer.ID]heardLineage // peers last heard on another lineage
	lastOther time.Time                // when a peer last said another lineage
	retryAt   time.Time                // look again no sooner
	backoff   time.Duration            // the wait after a look that found the node on the job's lineage
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
		others:  make(map[peer.ID]heardLineage),
		backoff: convergeRetry,
		warned:  make(map[peer.ID]bool),
		otherReports: c("step_reports_other_lineage_total",
			"Step reports and queries not counted because the peer is on another lineage (genesis) of the job: a fork that has not converged yet, or a peer that claims another lineage."),
		otherUpdates: c("updates_other_lineage_total",
			"Received updates and models dropped because their sender was last heard on another lineage (genesis) of the job."),
		converged: c("forks_joined_total",
			"Times this node left its lineage of the job for the job's (the lineage most of a uniform sample of peers is on), adopting that lineage's step and model."),
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

// set makes g the node's genesis; peers heard on g are no longer others.
func (l *lineage) set(g Genesis) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.own = g
	for p, h := range l.others {
		if h.g == g {
			delete(l.others, p)
		}
	}
}

// judge records that p reported genesis g and says whether p counts.
func (l *lineage) judge(p peer.ID, g Genesis, now time.Time) kinship {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.IsZero() || l.own.IsZero() || g == l.own {
		delete(l.others, p)
		return kin
	}
	if _, ok := l.others[p]; !ok && len(l.others) >= maxLineagesHeard {
		l.pruneLocked(now)
	}
	l.others[p] = heardLineage{g, now}
	l.lastOther = now
	l.otherReports.Inc()
	return otherFork
}

// pruneLocked forgets what peers said longer than forkHold ago; if that
// frees nothing, it forgets everything. l.mu is held.
func (l *lineage) pruneLocked(now time.Time) {
	for p, h := range l.others {
		if now.Sub(h.at) >= forkHold {
			delete(l.others, p)
		}
	}
	if len(l.others) >= maxLineagesHeard {
		clear(l.others)
	}
}

// forget drops what p said of its lineage (it left, or is dead).
func (l *lineage) forget(p peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.others, p)
}

// fromOther reports whether p was last heard, lately, on another lineage
// than this node's.
func (l *lineage) fromOther(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.others[p]
	return ok && now.Sub(h.at) < forkHold
}

// due reports whether a peer said another lineage lately and the node
// may look now whether that lineage is the job's (converge).
func (l *lineage) due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.own.IsZero() && !l.lastOther.IsZero() && now.Sub(l.lastOther) < forkHold && !now.Before(l.retryAt)
}

// looked records a look at now (converge): the next comes convergeRetry
// later if the node moved (moved) or could not tell, and after a doubling
// wait, up to forkHold, while the looks find the node on the job's
// lineage (stayed): a peer that keeps claiming another lineage costs a
// node one sample's queries per wait.
func (l *lineage) looked(now time.Time, stayed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !stayed {
		l.backoff = convergeRetry
		l.retryAt = now.Add(convergeRetry)
		return
	}
	l.retryAt = now.Add(l.backoff)
	l.backoff = min(2*l.backoff, forkHold)
}

// pickLineage is the lineage of counts (peers per genesis) with the most
// peers; among those with as many, the oldest genesis. Zero for none.
func pickLineage(counts map[Genesis]int) Genesis {
	var best Genesis
	most := 0
	for g, c := range counts {
		if g.IsZero() {
			continue
		}
		if c > most || c == most && g.Older(best) {
			best, most = g, c
		}
	}
	return best
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
	n.asker.Drop(p)
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
	n.checkClock(g)
}

// clockSlack is how far in the future a genesis this node takes may lie
// before it says that a clock is off.
const clockSlack = time.Minute

// clockOff reports how far ahead of now g was made, by its maker's clock,
// when that is more than clockSlack: the maker's clock or this node's is
// off.
func clockOff(g Genesis, now time.Time) (time.Duration, bool) {
	if g.IsZero() {
		return 0, false
	}
	ahead := g.Time().Sub(now)
	return ahead, ahead > clockSlack
}

// checkClock warns when the genesis this node takes was made in its
// future: a clock is off. Lineages do not depend on clocks (genesis.go:
// the job's lineage is the one most peers are on), so the job goes on;
// but the logs' times and a lineage's "started" disagree.
func (n *Node) checkClock(g Genesis) {
	if ahead, off := clockOff(g, time.Now()); off {
		n.log.Warn("this node's clock is behind the clock of the node that started the job's lineage (or that one is ahead): the job goes on, lineages do not depend on clocks, but check the machines' time (NTP)",
			"lineage", g.String(), "started", g.Time().UTC().Format(time.RFC3339), "ahead_of_this_clock", ahead.Round(time.Second))
	}
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
