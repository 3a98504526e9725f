// Package lineage is a node's lineage of its job and what it heard of its
// peers' (a Genesis each, said in every step message). The node that
// starts a job makes a Genesis; nodes that join take it; two groups that
// trained apart have two, and when they meet, the lineage more of the
// peers a node hears from are on is the job's (Pick). Lineage keeps a
// node's own genesis and, bounded, the peers last heard on another one
// (Judge, FromOther), and paces the node's looks at whether another
// lineage is the job's (Due, Looked). It sends and decides nothing
// itself: package node does, and says how in its genesis.go.
package lineage

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
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

// Kinship is how a step message's sender stands to this node.
type Kinship int

const (
	Kin        Kinship = iota // counts as before
	OtherFork                 // another lineage of the job: does not count
	OtherModel                // another model: held out
)

const (
	// forkHold is how long a peer last heard on another lineage has its
	// updates dropped, and how long what a peer said of its lineage counts
	// towards the job's lineage.
	forkHold = 30 * time.Second
	// convergeRetry is the least time between two attempts to converge.
	convergeRetry = time.Second
	// maxLineagesHeard bounds the peers whose lineage is remembered.
	maxLineagesHeard = 8192
	// maxWarnedModels bounds the peers warned about for another model.
	maxWarnedModels = 256
)

// heardLineage is the lineage a peer last said it was on, and when.
type heardLineage struct {
	g  Genesis
	at time.Time
}

// Lineage is a node's genesis and what it has heard of others. Safe for
// concurrent use.
type Lineage struct {
	mu        sync.Mutex
	own       Genesis
	others    map[peer.ID]heardLineage // peers last heard on another lineage
	lastOther time.Time                // when a peer last said another lineage
	retryAt   time.Time                // look again no sooner
	backoff   time.Duration            // the wait after a look that found the node on the job's lineage
	warned    map[peer.ID]bool

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
		otherReports: c("step_reports_other_lineage_total",
			"Step reports and queries not counted because the peer is on another lineage (genesis) of the job: a fork that has not Converged yet, or a peer that claims another lineage."),
		OtherUpdates: c("updates_other_lineage_total",
			"Received updates and models dropped because their sender was last heard on another lineage (genesis) of the job."),
		Converged: c("forks_joined_total",
			"Times this node left its lineage of the job for the job's (the lineage most of a uniform sample of peers is on), adopting that lineage's step and model."),
		ModelMismatch: c("peers_model_mismatch_total",
			"Peers held out of samples, population and routing table because they run another model (model id or parameter count)."),
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
func (l *Lineage) Set(g Genesis) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.own = g
	for p, h := range l.others {
		if h.g == g {
			delete(l.others, p)
		}
	}
}

// Judge records that p reported genesis g and says whether p counts.
func (l *Lineage) Judge(p peer.ID, g Genesis, now time.Time) Kinship {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g.IsZero() || l.own.IsZero() || g == l.own {
		delete(l.others, p)
		return Kin
	}
	if _, ok := l.others[p]; !ok && len(l.others) >= maxLineagesHeard {
		l.pruneLocked(now)
	}
	l.others[p] = heardLineage{g, now}
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
// later if the node moved (moved) or could not tell, and after a doubling
// wait, up to forkHold, while the looks find the node on the job's
// lineage (stayed): a peer that keeps claiming another lineage costs a
// node one sample's queries per wait.
func (l *Lineage) Looked(now time.Time, stayed bool) {
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

// Pick is the lineage of counts (peers per genesis) with the most
// peers; among those with as many, the oldest genesis. Zero for none.
func Pick(counts map[Genesis]int) Genesis {
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
