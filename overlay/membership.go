package overlay

import (
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Membership bookkeeping. Every *Locked method needs o.mu.

// member is one known peer.
type member struct {
	id        peer.ID
	key       []byte    // SHA-256 of the peer ID: its DHT key
	cpl       int       // common-prefix length with self
	confirmed time.Time // last first-hand evidence of life (zero: none yet)
	// connected follows the host's connectedness events: while a
	// connection is open the peer stays drawable by Sample whatever the age
	// of its evidence, since its departure would close the connection.
	connected bool
	dead      bool
	deadAt    time.Time
	retryAt   time.Time // next revival probe while dead
	liveIdx   int       // index in Overlay.live, -1 when dead
	poolIdx   int       // index in Overlay.pool, -1 when not in the pool
	verified  bool
	probing   bool
	// Pool announcements (pool.go): joined says the peer knows our pool
	// holds it; inDegree is how many pools hold it, as it said at degreeAt.
	joined   bool
	inDegree int
	degreeAt time.Time
	// addr is the address group the peer last connected from
	// (diversity.go), "" if none seen or exempt.
	addr string
}

// touchLocked records a sighting of p. First-hand sightings (p itself
// answered or connected) confirm it and revive it if held dead; third-party
// sightings (another node listed it) add it unverified and are ignored
// while it is held dead.
func (o *Overlay) touchLocked(p peer.ID, firstHand bool, now time.Time) *member {
	if p == o.h.ID() || p == "" || o.closed || o.held.has(p) {
		return nil
	}
	m, ok := o.members[p]
	if !ok {
		key := kb.ConvertPeerID(p)
		m = &member{id: p, key: key, cpl: cpl(o.selfKey, key), liveIdx: -1, poolIdx: -1, connected: o.connected(p)}
		o.members[p] = m
		m.dead = true // becomes live below
	}
	defer o.recountLocked(m, m.counted())
	if firstHand {
		m.confirmed = now
	}
	if m.dead {
		if ok && !firstHand && now.Sub(m.deadAt) < o.cfg.DeadHold {
			return m
		}
		m.dead = false
		m.liveIdx = len(o.live)
		o.live = append(o.live, m)
		o.countAddrLocked(m.addr, 1)
		o.estCache.at = time.Time{}
		o.offerToPoolLocked(m)
	}
	if m.addr == "" {
		// Looked up once; a new connection refreshes it (the
		// connectedness event), not every message the peer sends.
		o.refreshAddrLocked(m)
	}
	if firstHand && m.poolIdx >= 0 && !m.verified && o.connected(p) {
		m.verified = true
	}
	return m
}

// counted reports whether m counts for the zone estimator: live, with
// first-hand signs of life.
func (m *member) counted() bool { return !m.dead && !m.confirmed.IsZero() }

// recountLocked updates confirmedByCPL after a change to m, which counted
// for it before the change if was.
func (o *Overlay) recountLocked(m *member, was bool) {
	switch now := m.counted(); {
	case now && !was:
		o.confirmedByCPL[m.cpl]++
	case was && !now:
		o.confirmedByCPL[m.cpl]--
	}
}

func (o *Overlay) connected(p peer.ID) bool {
	return o.h.Network().Connectedness(p) == network.Connected
}

func (o *Overlay) markDeadLocked(m *member, now time.Time, why string) {
	if m.dead {
		return
	}
	o.log.Debug("peer dead", "peer", m.id.ShortString(), "why", why)
	defer o.recountLocked(m, m.counted())
	m.dead = true
	m.deadAt = now
	m.verified = false
	last := o.live[len(o.live)-1]
	o.live[m.liveIdx] = last
	last.liveIdx = m.liveIdx
	o.live = o.live[:len(o.live)-1]
	m.liveIdx = -1
	o.countAddrLocked(m.addr, -1)
	if m.poolIdx >= 0 {
		o.removeFromPoolLocked(m)
		o.refillPoolLocked()
	}
	delete(o.reports, m.id)
	o.estCache.at = time.Time{}
	o.dht.RoutingTable().RemovePeer(m.id)
}

// enqueueProbeLocked queues a liveness probe of m: a pool join for a pool
// member (which also learns its in-degree), a dial for anyone else.
func (o *Overlay) enqueueProbeLocked(m *member) {
	if m.probing || o.closed {
		return
	}
	job := probeJob{p: m.id, op: probeDial}
	if m.poolIdx >= 0 {
		o.poolSeq++
		job.op, job.seq = probeJoin, o.poolSeq
	}
	select {
	case o.probeCh <- job:
		m.probing = true
	default: // queue full: maintenance retries later
	}
}

// enqueueLeaveLocked queues a pool leave for p (best effort: if the queue
// is full, p drops us when our connection closes or the join goes stale).
func (o *Overlay) enqueueLeaveLocked(p peer.ID) {
	if o.closed {
		return
	}
	o.poolSeq++
	select {
	case o.probeCh <- probeJob{p: p, op: probeLeave, seq: o.poolSeq}:
	default:
	}
}

// refreshAddrLocked sets m's address group from its connection's remote
// address, or while it has none from the peerstore (with PerAddress on).
func (o *Overlay) refreshAddrLocked(m *member) {
	if o.cfg.PerAddress <= 0 {
		return
	}
	k := connAddrKey(o.h, m.id)
	if k == "" && m.addr == "" {
		k = storedAddrKey(o.h, m.id)
	}
	if k != "" {
		o.setAddrLocked(m, k)
	}
}
