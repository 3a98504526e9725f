package overlay

import (
	"container/list"
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
	known     time.Time // first first-hand evidence (zero: none yet)
	// connected follows the host's connectedness events: while a
	// connection is open the peer stays drawable by Sample whatever the age
	// of its evidence, since its departure would close the connection.
	connected bool
	dead      bool
	deadAt    time.Time
	retryAt   time.Time // next revival probe while dead
	liveIdx   int       // index in Overlay.live, -1 when dead
	poolIdx   int       // index in Overlay.pool, -1 when not in the pool
	drawIdx   int       // index in Overlay.draw, -1 when not in it
	// unconf is m's place in Overlay.unconfirmed while m has no
	// first-hand evidence of life (confirmed is zero), nil after.
	unconf   *list.Element
	verified bool
	probing  bool
	// Pool announcements (pool.go): joined says the peer knows our pool
	// holds it; inDegree is how many pools hold it, as it said at degreeAt.
	joined   bool
	inDegree int
	degreeAt time.Time
	// addr is the address group the peer last connected from
	// (diversity.go), "" if none seen or exempt; exempt says its
	// connections came from exempt addresses only, when last looked.
	addr   string
	exempt bool
}

// touchLocked records a sighting of p. First-hand sightings (p itself
// answered or connected) confirm it and revive it if held dead; third-party
// sightings (another node listed it) add it unconfirmed and are ignored
// while it is held dead.
//
// Unconfirmed peers cost nothing to name, so what third-party sightings can
// add is bounded: at most MaxUnconfirmed peers are known only that way (live
// or held dead), kept in order of their last sighting, and a sighting past
// the bound forgets the one sighted least recently. They are never drawn
// (drawableLocked), do not count for the zone estimator or the address
// limits, and become ordinary members on first-hand evidence.
func (o *Overlay) touchLocked(p peer.ID, firstHand bool, now time.Time) *member {
	if p == o.h.ID() || p == "" || o.closed || o.held.has(p) {
		return nil
	}
	m, ok := o.members[p]
	if !ok {
		key := kb.ConvertPeerID(p)
		m = &member{id: p, key: key, cpl: cpl(o.selfKey, key), liveIdx: -1, poolIdx: -1, drawIdx: -1, connected: o.connected(p)}
		o.members[p] = m
		m.dead = true // becomes live below
	}
	if !firstHand && m.dead && ok && now.Sub(m.deadAt) < o.cfg.DeadHold {
		return m // held dead: other nodes' tables may be stale
	}
	was := m.counted()
	if firstHand {
		m.confirmed = now
		if m.known.IsZero() {
			m.known = now
		}
		if m.unconf != nil {
			o.unconfirmed.Remove(m.unconf)
			m.unconf = nil
		}
	}
	if m.dead {
		m.dead = false
		m.liveIdx = len(o.live)
		o.live = append(o.live, m)
		o.estCache.at = time.Time{}
		o.offerToPoolLocked(m)
	}
	o.recountLocked(m, was)
	if m.confirmed.IsZero() {
		if m.unconf != nil {
			o.unconfirmed.MoveToBack(m.unconf)
		} else {
			m.unconf = o.unconfirmed.PushBack(m)
			for o.unconfirmed.Len() > o.cfg.MaxUnconfirmed {
				o.forgetLocked(o.unconfirmed.Front().Value.(*member))
			}
			if m.unconf == nil {
				return nil // forgotten at once: MaxUnconfirmed is 0
			}
		}
	}
	if m.addr == "" && !m.exempt {
		// Looked up once; a new connection refreshes it (the
		// connectedness event), not every message the peer sends. A peer
		// that connects from an exempt address (loopback: a local
		// testnet) has none to find, and is not looked up again either.
		o.refreshAddrLocked(m)
	}
	if firstHand && m.drawIdx < 0 {
		m.drawIdx = len(o.draw)
		o.draw = append(o.draw, m)
	}
	if firstHand && m.poolIdx >= 0 && !m.verified && o.connected(p) {
		m.verified = true
	}
	return m
}

// forgetLocked removes m from every list and from the member set, as if it
// had never been sighted. For unconfirmed peers beyond MaxUnconfirmed: a
// confirmed peer is marked dead instead, and forgotten only long after.
func (o *Overlay) forgetLocked(m *member) {
	if !m.dead {
		was := m.counted()
		o.dropLiveLocked(m)
		o.recountLocked(m, was)
	}
	if m.unconf != nil {
		o.unconfirmed.Remove(m.unconf)
		m.unconf = nil
	}
	delete(o.members, m.id)
}

// counted reports whether m counts for the zone estimator: live, with
// first-hand signs of life.
func (m *member) counted() bool { return !m.dead && !m.confirmed.IsZero() }

// recountLocked updates confirmedByCPL and the address groups' counts
// (diversity.go) after a change to m, which counted for them before the
// change if was.
func (o *Overlay) recountLocked(m *member, was bool) {
	switch now := m.counted(); {
	case now && !was:
		o.confirmedByCPL[m.cpl]++
		o.countAddrLocked(m.addr, 1)
	case was && !now:
		o.confirmedByCPL[m.cpl]--
		o.countAddrLocked(m.addr, -1)
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
	m.deadAt = now
	o.dropLiveLocked(m)
	o.dht.RoutingTable().RemovePeer(m.id)
}

// dropLiveLocked takes the live member m out of the live list, the draw
// list, the pool (refilling it) and the reports, and marks it dead; the
// caller recounts (recountLocked).
func (o *Overlay) dropLiveLocked(m *member) {
	m.dead = true
	m.verified = false
	last := o.live[len(o.live)-1]
	o.live[m.liveIdx] = last
	last.liveIdx = m.liveIdx
	o.live = o.live[:len(o.live)-1]
	m.liveIdx = -1
	o.removeDrawLocked(m)
	if m.poolIdx >= 0 {
		o.removeFromPoolLocked(m)
		o.refillPoolLocked()
	}
	delete(o.reports, m.id)
	o.estCache.at = time.Time{}
}

// removeDrawLocked takes m out of the draw list (sampler.go), if it is in.
func (o *Overlay) removeDrawLocked(m *member) {
	i := m.drawIdx
	if i < 0 {
		return
	}
	last := o.draw[len(o.draw)-1]
	o.draw[i] = last
	last.drawIdx = i
	o.draw[len(o.draw)-1] = nil
	o.draw = o.draw[:len(o.draw)-1]
	m.drawIdx = -1
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
	k, conns := connAddrKey(o.h, m.id)
	m.exempt = conns && k == ""
	if k == "" && m.addr == "" {
		k = storedAddrKey(o.h, m.id)
	}
	if k != "" {
		o.setAddrLocked(m, k)
	}
}
