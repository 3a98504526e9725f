package overlay

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Sample returns beta distinct live peers other than self, drawn uniformly
// at random, without replacement, from every peer this node knows to be
// alive now (drawable): a peer it holds a connection to, or one that gave
// first-hand evidence of life within LivenessWindow. Peers that share a
// network address with more than Config.PerAddress others are drawn with
// a weight that makes them count together as PerAddress peers
// (diversity.go); every other peer has weight 1. Every call is a fresh
// draw from that whole set, independent of earlier calls. It never blocks
// on the network. It fails with ErrNotEnoughPeers when fewer than beta
// peers are drawable, and with ctx's error if ctx is done.
//
// It costs about beta random picks, whatever the number of peers known:
// peers only heard of from others are not among those it picks from, and
// each peer whose evidence has aged out is dropped from them the first
// time it is picked (it returns with its next evidence).
func (o *Overlay) Sample(ctx context.Context, beta int) ([]peer.ID, error) {
	if beta < 0 {
		return nil, fmt.Errorf("overlay: negative sample size %d", beta)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("overlay: sample: %w", err)
	}
	if beta == 0 {
		return []peer.ID{}, nil
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, ErrClosed
	}
	// A partial Fisher–Yates shuffle of the draw list: position i takes a
	// uniform pick among positions i.. (the peers not drawn yet). A pick
	// that is no longer drawable leaves the list, and the pick is made
	// again; a pick of weight w < 1 is kept with probability w, and at
	// most PerAddress of one shared address, otherwise it stays where it
	// is and the pick is made again (a miss). Each kept peer is thus
	// drawn in proportion to its weight among the drawable peers left
	// (and a shared address, whose members weigh PerAddress together, is
	// in a sample as often as PerAddress peers of their own: without the
	// cap, drawing without replacement would favour it by about
	// β/(2·drawable)). Without shared addresses there are no misses.
	// Should misses pile up, a pass over the draw list decides.
	out := make([]peer.ID, 0, beta)
	var shared []string // addresses of kept peers of weight < 1
	for misses := 0; len(out) < beta && len(o.draw) > len(out) && misses < 4*beta+16; {
		i := len(out)
		j := i + o.rng.IntN(len(o.draw)-i)
		m := o.draw[j]
		if !o.drawableLocked(m, now) {
			o.removeDrawLocked(m)
			continue
		}
		if w := o.weightLocked(m); w < 1 {
			if o.rng.Float64() >= w || countOf(shared, m.addr) >= o.cfg.PerAddress {
				misses++
				continue
			}
			shared = append(shared, m.addr)
		}
		o.swapDrawLocked(i, j)
		out = append(out, m.id)
	}
	if len(out) == beta {
		return out, nil
	}
	o.pruneDrawLocked(now)
	if len(o.draw) < beta {
		return nil, fmt.Errorf("%w: want %d, have %d drawable of %d known", ErrNotEnoughPeers, beta, len(o.draw), len(o.live))
	}
	return o.weightedLocked(beta, true), nil
}

// SampleUpTo draws as Sample does, but as many peers as it can, up to k:
// every drawable peer when there are k or fewer, except that it never
// takes more than Config.PerAddress of one shared address (where Sample,
// short of peers, fills up with them). For a caller that wants to hear
// from as much of the job as it knows (a joiner whose first answers
// disagree) without letting one host's many identities outnumber the
// rest. It never fails for want of peers.
func (o *Overlay) SampleUpTo(ctx context.Context, k int) ([]peer.ID, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("overlay: sample: %w", err)
	}
	if k <= 0 {
		return []peer.ID{}, nil
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, ErrClosed
	}
	o.pruneDrawLocked(now)
	return o.weightedLocked(k, false), nil
}

// pruneDrawLocked drops from the draw list the members no longer
// drawable at now. mu is held.
func (o *Overlay) pruneDrawLocked(now time.Time) {
	for i := 0; i < len(o.draw); {
		if m := o.draw[i]; !o.drawableLocked(m, now) {
			o.removeDrawLocked(m) // moves the last one here
			continue
		}
		i++
	}
}

// weightedLocked draws up to k of the draw list (every member drawable),
// weighted, without replacement (Efraimidis and Spirakis): the k smallest
// of Exp(1)/weight, at most PerAddress of one shared address while others
// are left. fill: when the others run out, members past the cap make up
// the k. mu is held.
func (o *Overlay) weightedLocked(k int, fill bool) []peer.ID {
	type keyed struct {
		m *member
		k float64
	}
	keys := make([]keyed, len(o.draw))
	for i, m := range o.draw {
		keys[i] = keyed{m, o.rng.ExpFloat64() / o.weightLocked(m)}
	}
	slices.SortFunc(keys, func(a, b keyed) int { return cmp.Compare(a.k, b.k) })
	var shared []string
	var over []*member // past the cap: taken last, if peers run short
	out := make([]peer.ID, 0, min(k, len(keys)))
	for _, km := range keys {
		m := km.m
		if len(out) == k {
			break
		}
		if o.weightLocked(m) < 1 {
			if countOf(shared, m.addr) >= o.cfg.PerAddress {
				over = append(over, m)
				continue
			}
			shared = append(shared, m.addr)
		}
		out = append(out, m.id)
	}
	if fill {
		for _, m := range over[:min(len(over), k-len(out))] {
			out = append(out, m.id)
		}
	}
	return out
}

// swapDrawLocked swaps positions i and j of the draw list.
func (o *Overlay) swapDrawLocked(i, j int) {
	o.draw[i], o.draw[j] = o.draw[j], o.draw[i]
	o.draw[i].drawIdx, o.draw[j].drawIdx = i, j
}

// countOf counts the elements of xs equal to x.
func countOf(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// drawableLocked reports whether Sample may draw the live member m at now:
// m has shown first-hand signs of life, and either a connection to it is
// open (its departure would close it) or the evidence is younger than
// LivenessWindow. A departed peer thus stops being drawn at most
// LivenessWindow after it last answered, wherever it was known from.
func (o *Overlay) drawableLocked(m *member, now time.Time) bool {
	return !m.confirmed.IsZero() && (m.connected || now.Sub(m.confirmed) < o.cfg.LivenessWindow)
}

// Peers returns every known peer not known to be dead that has shown first-
// hand signs of life at least once (answered us, connected to us, or was
// reported alive with MarkAlive): the population as this node knows it,
// for "BSP = sample everyone I know".
func (o *Overlay) Peers() []peer.ID {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]peer.ID, 0, len(o.live))
	for _, m := range o.live {
		if !m.confirmed.IsZero() {
			out = append(out, m.id)
		}
	}
	return out
}

// PeerCount is len(Peers()) without building the list: the number of
// known peers not known to be dead that have shown first-hand signs of
// life.
func (o *Overlay) PeerCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.confirmedByCPL {
		n += c
	}
	return n
}

// Knows reports whether p is a live member heard from first-hand: it
// answered, connected speaking the overlay's protocol, or asked this node
// something of its job. A peer that only opened streams, or that others
// named, is not known.
func (o *Overlay) Knows(p peer.ID) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	m, ok := o.members[p]
	return ok && !m.dead && !m.confirmed.IsZero()
}

// MarkDead records that p did not answer (e.g. a step query timed out). p
// leaves the sampler pool and the routing table at once; it returns only on
// first-hand evidence of life (it connects or answers again, or MarkAlive).
func (o *Overlay) MarkDead(p peer.ID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m, ok := o.members[p]; ok {
		o.markDeadLocked(m, time.Now(), "marked dead")
	}
}

// MarkAlive records first-hand evidence that p is alive (e.g. it answered
// a step query). A peer held as dead is revived.
func (o *Overlay) MarkAlive(p peer.ID) {
	if p == o.h.ID() || p == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.touchLocked(p, true, time.Now())
}

// Estimate is a population estimate a peer reported (see ObserveEstimate).
type Estimate struct {
	Peer peer.ID
	N    float64
}

// Note records what one barrier check learnt of its peers, under one
// acquisition of the overlay's lock: the peers that did not answer, or
// said they leave (as MarkDead), those that answered (as MarkAlive), and
// the population estimates they reported (as ObserveEstimate). A check
// asks each peer once, so no peer is in both dead and alive.
func (o *Overlay) Note(dead, alive []peer.ID, estimates []Estimate) {
	if len(dead)+len(alive)+len(estimates) == 0 {
		return
	}
	self := o.h.ID()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range dead {
		if m, ok := o.members[p]; ok {
			o.markDeadLocked(m, now, "marked dead")
		}
	}
	for _, p := range alive {
		if p != self && p != "" {
			o.touchLocked(p, true, now)
		}
	}
	for _, e := range estimates {
		if e.Peer != self && !math.IsNaN(e.N) && !math.IsInf(e.N, 0) && e.N >= 1 && e.N <= 1e9 && !o.held.has(e.Peer) {
			o.observeLocked(e.Peer, e.N, now)
		}
	}
}

// offerToPoolLocked is reservoir sampling over the stream of live peers:
// while the pool has room every peer enters; after that a new peer enters
// with probability PoolSize/|live|, replacing a uniform pool member. The
// pool thus stays a uniform random subset of all known live peers.
func (o *Overlay) offerToPoolLocked(m *member) {
	if m.poolIdx >= 0 || m.dead {
		return
	}
	if len(o.pool) < o.cfg.PoolSize {
		o.addToPoolLocked(m)
		return
	}
	if o.rng.IntN(len(o.live)) < o.cfg.PoolSize {
		o.removeFromPoolLocked(o.pool[o.rng.IntN(len(o.pool))])
		o.addToPoolLocked(m)
	}
}

// addToPoolLocked adds m to the pool and queues its join (pool.go). A peer
// connected and heard from within MaintainInterval counts as verified at
// once; any other once the join succeeds. (Whether Sample draws it depends
// on its evidence of life, not on the pool: see drawableLocked.)
func (o *Overlay) addToPoolLocked(m *member) {
	m.poolIdx = len(o.pool)
	o.pool = append(o.pool, m)
	m.verified = o.connected(m.id) && time.Since(m.confirmed) < o.cfg.MaintainInterval
	m.joined, m.inDegree, m.degreeAt = false, 0, time.Time{}
	o.enqueueProbeLocked(m)
}

func (o *Overlay) removeFromPoolLocked(m *member) {
	last := o.pool[len(o.pool)-1]
	o.pool[m.poolIdx] = last
	last.poolIdx = m.poolIdx
	o.pool = o.pool[:len(o.pool)-1]
	m.poolIdx = -1
	m.verified = false
	if m.joined && !m.dead {
		o.enqueueLeaveLocked(m.id)
	}
	m.joined, m.inDegree, m.degreeAt = false, 0, time.Time{}
}

// randomNonPoolLocked picks a uniform live peer outside the pool, or nil.
func (o *Overlay) randomNonPoolLocked() *member {
	outside := len(o.live) - len(o.pool)
	if outside <= 0 {
		return nil
	}
	if outside*4 >= len(o.live) {
		for range 64 {
			if m := o.live[o.rng.IntN(len(o.live))]; m.poolIdx < 0 {
				return m
			}
		}
	}
	var cand []*member
	for _, m := range o.live {
		if m.poolIdx < 0 {
			cand = append(cand, m)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	return cand[o.rng.IntN(len(cand))]
}

func (o *Overlay) refillPoolLocked() {
	for len(o.pool) < o.cfg.PoolSize {
		m := o.randomNonPoolLocked()
		if m == nil {
			return
		}
		o.addToPoolLocked(m)
	}
}

// rotateLocked swaps a uniform pool member for a uniform live peer outside
// the pool, so that over time every peer passes through the pool.
func (o *Overlay) rotateLocked() {
	if len(o.pool) == 0 {
		return
	}
	m := o.randomNonPoolLocked()
	if m == nil {
		return
	}
	o.removeFromPoolLocked(o.pool[o.rng.IntN(len(o.pool))])
	o.addToPoolLocked(m)
}
