// Package lineage is a node's lineage of its job and what it heard of its
// peers' (a Genesis each, said in every step message). The node that
// starts a job makes a Genesis; nodes that join take it; two groups that
// trained apart have two, and when they meet, Decide says which is the
// job's, from what is costly to fake rather than from claims or head
// counts: how long the node itself has trained on its lineage with its
// peers, and how long it has heard the other lineage's peers on theirs.
// Identities are cheap, so a node that has trained with a peer of its own
// lineage for a while (it is established) is moved by no number of peers
// it has only just heard on another; a node without that history (a node
// restarted alone, or one of nodes that started the job at the same
// moment) goes where most of a sample is, with a coin for a tie, so that
// such forks converge in seconds. No field a peer chooses (a genesis's
// time, a step) breaks a tie. Lineage keeps a node's own genesis and,
// bounded, the peers last heard on another one and since when (Judge,
// FromOther, Choose), and paces the node's looks at whether another
// lineage is the job's (Due, Looked). It sends nothing itself: package
// node does, and says how in its genesis.go.
package lineage

import (
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
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
// geneses; when they meet, Decide says which is the job's, and the nodes
// of the other adopt its step and model. A genesis is a claim, and its
// time proves nothing: nothing compares two geneses but for equality, so
// a peer that says its lineage began in 1970 gains nothing by it. The
// zero Genesis means none.
type Genesis [genesisLen]byte

// NewGenesis makes a genesis at now.
func NewGenesis(now time.Time) Genesis {
	var g Genesis
	binary.BigEndian.PutUint64(g[:8], uint64(now.UnixNano()))
	_, _ = crand.Read(g[8:])
	if g.IsZero() { // a clock at the epoch and 8 zero bytes: never in practice
		g[15] = 1
	}
	return g
}

// IsZero reports whether g is none.
func (g Genesis) IsZero() bool { return g == Genesis{} }

// Time is when g was made, by its maker's clock.
func (g Genesis) Time() time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(g[:8]))) }

// String is g in hex, "" for none.
func (g Genesis) String() string {
	if g.IsZero() {
		return ""
	}
	return hex.EncodeToString(g[:])
}

// Kinship is how a step message's sender stands to this node.
type Kinship int

const (
	Kin        Kinship = iota // counts as before
	OtherFork                 // another lineage of the job: does not count
	OtherModel                // another model: held out
)

const (
	// forkHold is how long a peer last heard on another lineage has its
	// updates dropped, and how long after hearing one the node looks
	// whether that lineage is the job's.
	forkHold = 30 * time.Second
	// convergeRetry is the least time between two attempts to converge.
	convergeRetry = time.Second
	// tossRetry is the wait after a look at which a coin kept a young
	// node where it was (Decide): it looks again soon, for the coin to
	// have its say.
	tossRetry = 100 * time.Millisecond
	// maxLineagesHeard bounds the peers whose lineage is remembered.
	maxLineagesHeard = 8192
	// maxWarnedModels bounds the peers warned about for another model.
	maxWarnedModels = 256
	// silenceReset is how long a peer may go unheard on another lineage
	// and still keep its history there: one heard again after longer
	// starts a new history (a peer that said a lineage once, long ago,
	// has not been on it since).
	silenceReset = 2 * forkHold
)

// heardLineage is the lineage a peer last said it was on, since when
// (without a switch or a silence of silenceReset) and when last.
type heardLineage struct {
	g     Genesis
	since time.Time
	at    time.Time
}

// Lineage is a node's genesis and what it has heard of others. Safe for
// concurrent use.
type Lineage struct {
	mu  sync.Mutex
	own Genesis
	// ownSince is when the node took own; kinSince when it first heard a
	// peer on own since then (zero: none yet).
	ownSince, kinSince time.Time
	others             map[peer.ID]heardLineage // peers last heard on another lineage
	lastOther          time.Time                // when a peer last said another lineage
	retryAt            time.Time                // look again no sooner
	backoff            time.Duration            // the wait after a look that found the node on the job's lineage
	warned             map[peer.ID]bool
	// pick draws uniformly in [0, n) for Decide's ties (rand.IntN);
	// tossed says that a draw kept the node where it was at the last
	// Choose.
	pick   func(n int) int
	tossed bool

	otherReports prometheus.Counter // counted by Judge
	// The node counts: updates dropped (FromOther), the times it took
	// the job's lineage, and the peers it held out for another model.
	OtherUpdates  prometheus.Counter
	Converged     prometheus.Counter
	ModelMismatch prometheus.Counter
}

// New is a node's lineage, g (none if zero) at first, with its counters
// registered with reg.
func New(reg prometheus.Registerer, g Genesis) *Lineage {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Name: name, Help: help})
	}
	l := &Lineage{
		own:     g,
		others:  make(map[peer.ID]heardLineage),
		backoff: convergeRetry,
		warned:  make(map[peer.ID]bool),
		pick:    rand.IntN,
		otherReports: c("step_reports_other_lineage_total",
			"Step reports and queries not counted because the peer is on another lineage (genesis) of the job: a fork that has not Converged yet, or a peer that claims another lineage."),
		OtherUpdates: c("updates_other_lineage_total",
			"Received updates and models dropped because their sender was last heard on another lineage (genesis) of the job."),
		Converged: c("forks_joined_total",
			"Times this node left its lineage of the job for the job's (lineage.Decide over a uniform sample of peers: by history once the node has trained with a peer of its own lineage, by count before), adopting that lineage's step and model."),
		ModelMismatch: c("peers_model_mismatch_total",
			"Peers held out of samples, population and routing table because they run another model (model id or parameter count)."),
	}
	if !g.IsZero() {
		l.ownSince = time.Now()
	}
	reg.MustRegister(l.otherReports, l.OtherUpdates, l.Converged, l.ModelMismatch)
	return l
}

// Own is the node's own genesis (zero: none).
func (l *Lineage) Own() Genesis {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.own
}

// Set makes g the node's genesis; peers heard on g are no longer others.
// The node's history on g starts now, and it has trained with a peer of g
// from now if one was heard on g lately.
func (l *Lineage) Set(g Genesis) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if g == l.own {
		return
	}
	l.own, l.ownSince, l.kinSince = g, now, time.Time{}
	for p, h := range l.others {
		if h.g == g {
			delete(l.others, p)
			if now.Sub(h.at) < forkHold {
				l.kinSince = now
			}
		}
	}
}

// Judge records that p reported genesis g and says whether p counts.
func (l *Lineage) Judge(p peer.ID, g Genesis, now time.Time) Kinship {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.IsZero() || l.own.IsZero() || g == l.own {
		if !g.IsZero() && g == l.own && l.kinSince.IsZero() {
			l.kinSince = now
		}
		delete(l.others, p)
		return Kin
	}
	h, ok := l.others[p]
	if !ok && len(l.others) >= maxLineagesHeard {
		l.pruneLocked(now)
	}
	if !ok || h.g != g || now.Sub(h.at) >= silenceReset {
		h = heardLineage{g: g, since: now}
	}
	h.at = now
	l.others[p] = h
	l.lastOther = now
	l.otherReports.Inc()
	return OtherFork
}

// pruneLocked forgets what peers said longer than forkHold ago; if that
// frees nothing, it forgets everything. l.mu is held.
func (l *Lineage) pruneLocked(now time.Time) {
	for p, h := range l.others {
		if now.Sub(h.at) >= forkHold {
			delete(l.others, p)
		}
	}
	if len(l.others) >= maxLineagesHeard {
		clear(l.others)
	}
}

// Forget drops what p said of its lineage (it left, or is dead).
func (l *Lineage) Forget(p peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.others, p)
}

// FromOther reports whether p was last heard, lately, on another lineage
// than this node's.
func (l *Lineage) FromOther(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.others[p]
	return ok && now.Sub(h.at) < forkHold
}

// Due reports whether a peer said another lineage lately and the node
// may look now whether that lineage is the job's (converge).
func (l *Lineage) Due(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.own.IsZero() && !l.lastOther.IsZero() && now.Sub(l.lastOther) < forkHold && !now.Before(l.retryAt)
}

// Looked records a look at now (converge): the next comes convergeRetry
// later if the node moved or could not tell (stayed false), tossRetry
// later if a coin kept it where it was, and after a doubling wait, up to
// forkHold, while the looks find the node on the job's lineage: a peer
// that keeps claiming another lineage costs a node one sample's queries
// per wait.
func (l *Lineage) Looked(now time.Time, stayed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if stayed && l.tossed {
		l.retryAt = now.Add(tossRetry)
		return
	}
	if !stayed {
		l.backoff = convergeRetry
		l.retryAt = now.Add(convergeRetry)
		return
	}
	l.retryAt = now.Add(l.backoff)
	l.backoff = min(2*l.backoff, forkHold)
}

// Choose is the job's lineage by the answers of a uniform sample of peers
// (gs[i] is what peers[i] said, each judged already), as Decide rules:
// the node's own lineage counts the node and its history; another, its
// peers in the sample and the longest this node has heard one of them on
// it. Zero when no one, the node included, has a genesis.
func (l *Lineage) Choose(peers []peer.ID, gs []Genesis, now time.Time) Genesis {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ts []Tally
	at := func(g Genesis) *Tally {
		for i := range ts {
			if ts[i].Genesis == g {
				return &ts[i]
			}
		}
		ts = append(ts, Tally{Genesis: g})
		return &ts[len(ts)-1]
	}
	young := true
	if !l.own.IsZero() {
		t := at(l.own)
		t.Peers, t.History = 1, capHistory(now.Sub(l.ownSince))
		young = l.kinSince.IsZero() || now.Sub(l.kinSince) < YoungFor
	}
	for i, g := range gs {
		if g.IsZero() {
			continue
		}
		t := at(g)
		t.Peers++
		if h, ok := l.others[peers[i]]; ok && h.g == g && g != l.own {
			t.History = max(t.History, capHistory(now.Sub(h.since)))
		}
	}
	tossed := false
	g := Decide(l.own, young, ts, func(n int) int {
		tossed = true
		return l.pick(n)
	})
	l.tossed = young && tossed && g == l.own // (an established node never waits on a coin)
	return g
}

// capHistory is d within [0, HistoryCap].
func capHistory(d time.Duration) time.Duration { return min(max(d, 0), HistoryCap) }

// WarnFirst reports whether p has not been warned about yet, and notes it.
func (l *Lineage) WarnFirst(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.warned[p] || len(l.warned) >= maxWarnedModels {
		return false
	}
	l.warned[p] = true
	return true
}

// clockSlack is how far in the future a genesis this node takes may lie
// before it says that a clock is off.
const clockSlack = time.Minute

// ClockOff reports how far ahead of now g was made, by its maker's clock,
// when that is more than clockSlack: the maker's clock or this node's is
// off.
func ClockOff(g Genesis, now time.Time) (time.Duration, bool) {
	if g.IsZero() {
		return 0, false
	}
	ahead := g.Time().Sub(now)
	return ahead, ahead > clockSlack
}
