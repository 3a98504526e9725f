package overlay

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// The background goroutines New starts, and what they do.

// probeOp is what a probe job does.
type probeOp uint8

const (
	probeDial  probeOp = iota // dial: success is first-hand evidence of life
	probeJoin                 // pool join (pool.go): a dial that also learns the in-degree
	probeLeave                // pool leave, best effort
)

type probeJob struct {
	p   peer.ID
	op  probeOp
	seq uint64 // pool requests: the order they were decided in (pool.go)
}

// eventLoop turns host events into membership evidence: a peer that
// completes identify advertising our DHT protocol, or a known peer that
// connects, is alive; a pool or zone peer that disconnects is probed.
func (o *Overlay) eventLoop(sub event.Subscription) {
	defer sub.Close()
	for {
		select {
		case <-o.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			now := time.Now()
			switch ev := e.(type) {
			case event.EvtPeerIdentificationCompleted:
				if slices.Contains(ev.Protocols, o.proto) {
					o.mu.Lock()
					o.touchLocked(ev.Peer, true, now)
					o.mu.Unlock()
				}
			case event.EvtPeerConnectednessChanged:
				o.mu.Lock()
				if ev.Connectedness != network.Connected {
					o.dropInLocked(ev.Peer) // its pool's hold on us ends with the connection
				}
				m, known := o.members[ev.Peer]
				if known {
					m.connected = ev.Connectedness == network.Connected
					if m.connected {
						o.touchLocked(ev.Peer, true, now)
						o.refreshAddrLocked(m)
					} else if !m.dead && (m.poolIdx >= 0 || o.protected[m.id]) {
						// A pool member dropped our join with the
						// connection: the probe (a join) dials and
						// joins again.
						m.verified, m.joined = false, false
						o.enqueueProbeLocked(m)
					}
				}
				o.mu.Unlock()
			}
		}
	}
}

// probeLoop checks liveness by dialling, or for pool members by a pool
// join, and sends pool leaves. Success confirms the peer (and verifies it
// for the pool); failure marks it dead.
func (o *Overlay) probeLoop() {
	for {
		var job probeJob
		select {
		case <-o.ctx.Done():
			return
		case job = <-o.probeCh:
		}
		p := job.p
		var err error
		inDegree := 0
		switch job.op {
		case probeLeave:
			o.leave(p, job.seq)
			continue
		case probeJoin:
			inDegree, err = o.join(p, job.seq)
		default:
			ctx, cancel := context.WithTimeout(o.ctx, o.cfg.ProbeTimeout)
			err = o.h.Connect(ctx, peer.AddrInfo{ID: p})
			cancel()
		}
		if o.ctx.Err() != nil {
			return
		}
		now := time.Now()
		o.mu.Lock()
		m := o.members[p]
		if m != nil {
			m.probing = false
			o.probedLocked(m, job.op, inDegree, err, now)
		}
		o.mu.Unlock()
	}
}

// probedLocked applies a probe's outcome to m.
func (o *Overlay) probedLocked(m *member, op probeOp, inDegree int, err error, now time.Time) {
	alive := err == nil || errors.Is(err, errNoPoolProtocol)
	if !alive {
		o.markDeadLocked(m, now, "probe failed: "+err.Error())
		return
	}
	o.touchLocked(m.id, true, now)
	if op != probeJoin {
		if m.poolIdx >= 0 {
			m.verified = true
		}
		return
	}
	joined := err == nil
	if m.poolIdx < 0 {
		if joined { // it left our pool while the join was under way
			o.enqueueLeaveLocked(m.id)
		}
		return
	}
	m.verified = true
	m.joined, m.inDegree, m.degreeAt = joined, inDegree, now
}

// walkLoop finishes the join (first refresh) and then runs random-key
// lookups every WalkInterval (faster during warm-up) and a routing-table
// refresh every RefreshInterval.
func (o *Overlay) walkLoop() {
	o.finishJoin()
	// Refreshes are jittered ±50 % too: nodes started together would
	// otherwise all refresh in the same second, a CPU burst that shows as
	// slow barrier checks in a testnet of hundreds of nodes.
	jitter := func(d time.Duration) time.Duration {
		o.mu.Lock()
		defer o.mu.Unlock()
		return time.Duration(float64(d) * (0.5 + o.jitterRNG.Float64()))
	}
	nextRefresh := time.Now().Add(jitter(o.cfg.RefreshInterval))
	for {
		interval := o.cfg.WalkInterval
		o.mu.Lock()
		if time.Since(o.joinedAt) < o.cfg.WarmupPeriod {
			interval = o.cfg.WarmupWalkInterval
		}
		o.mu.Unlock()
		// Jitter ±50 % so that nodes do not walk in lock-step.
		wait := jitter(interval)
		t := time.NewTimer(wait)
		select {
		case <-o.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if o.dht.RoutingTable().Size() == 0 && len(o.bootstrap) > 0 {
			if err := o.connectBootstrap(o.ctx); err != nil {
				o.log.Warn("rejoin failed", "err", err)
			}
		}
		if time.Now().After(nextRefresh) {
			o.refresh(false)
			nextRefresh = time.Now().Add(jitter(o.cfg.RefreshInterval))
		}
		o.walk()
	}
}

// finishJoin waits for the routing table to receive a bootstrap peer, then
// runs a full refresh (self-lookup and every bucket) and marks the overlay
// ready.
func (o *Overlay) finishJoin() {
	o.mu.Lock()
	ready := o.ready
	o.mu.Unlock()
	if !ready {
		deadline := time.Now().Add(o.cfg.JoinTimeout)
		for o.dht.RoutingTable().Size() == 0 && time.Now().Before(deadline) {
			select {
			case <-o.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		o.refresh(true)
		o.walk()
	}
	o.mu.Lock()
	o.ready = true
	o.joinedAt = time.Now()
	o.mu.Unlock()
}

// syncRoutingTable adds routing-table peers to the member set and drops
// peers we hold dead from the routing table.
func (o *Overlay) syncRoutingTable() {
	rt := o.dht.RoutingTable()
	peers := rt.ListPeers()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range peers {
		if m := o.touchLocked(p, false, now); m != nil && m.dead {
			rt.RemovePeer(p)
		}
	}
}

// maintainLoop rotates the pool every RotateInterval and does housekeeping
// every MaintainInterval.
func (o *Overlay) maintainLoop() {
	rot := time.NewTicker(o.cfg.RotateInterval)
	defer rot.Stop()
	mt := time.NewTicker(o.cfg.MaintainInterval)
	defer mt.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-rot.C:
			o.mu.Lock()
			o.rotateLocked()
			o.mu.Unlock()
		case <-mt.C:
			o.syncRoutingTable()
			o.estimates() // refreshes the zone depth
			o.maintain()
		}
	}
}

// maintain re-probes unverified pool members, watches the estimator's
// zone (keeps connections to it, so departures there show at once),
// updates connection protection, dials a few dead peers that were once
// alive again (RetryDead) and forgets long-dead peers.
func (o *Overlay) maintain() {
	rtPeers := o.dht.RoutingTable().ListPeers()
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	want := make(map[peer.ID]bool, len(o.pool)+32)
	for _, m := range o.pool {
		want[m.id] = true
		if m.verified && !o.connected(m.id) {
			m.verified = false
		}
		// Unverified members are probed; the others join again every
		// DegreeRefresh, which keeps our place in their count (a hold not
		// renewed for 3 × DegreeRefresh lapses, pool.go).
		if !m.verified || m.degreeAt.IsZero() || now.Sub(m.degreeAt) > o.cfg.DegreeRefresh {
			o.enqueueProbeLocked(m)
		}
	}
	for p, in := range o.inPool {
		if now.Sub(in.at) > 3*o.cfg.DegreeRefresh { // a lost leave, or an old one
			o.dropInLocked(p)
		}
	}
	// The zone: every live member at or below the zone depth is watched
	// (connected, protected, probed when not connected), so the zone
	// estimator counts it as confirmed and its departure shows at once.
	// Third-party sightings are included: our lookups ask only a few of
	// the peers near us and name the rest, and leaving those out read the
	// zone 13 % low at 1000 nodes. A zone of more than 2k members means
	// the depth is still shallow (the routing table is filling up after
	// the join: with no full bucket the zone is everyone we know of), and
	// then only its routing-table peers are watched: dialling every member
	// heard of at the join filled a 200-node TCP testnet's open files.
	var zone []*member
	for _, m := range o.live {
		if m.cpl >= o.zoneDepth {
			zone = append(zone, m)
		}
	}
	if len(zone) > 2*o.cfg.BucketSize {
		zone = zone[:0]
		for _, p := range rtPeers {
			if m, ok := o.members[p]; ok && !m.dead && m.cpl >= o.zoneDepth {
				zone = append(zone, m)
			}
		}
	}
	for _, m := range zone {
		want[m.id] = true
		if !o.connected(m.id) {
			o.enqueueProbeLocked(m)
		}
	}
	cm := o.h.ConnManager()
	for p := range o.protected {
		if !want[p] {
			cm.Unprotect(p, protectTag)
			delete(o.protected, p)
		}
	}
	for p := range want {
		if !o.protected[p] {
			cm.Protect(p, protectTag)
			o.protected[p] = true
		}
	}
	// Dial a few dead peers again now and then, RevivalProbes at most,
	// chosen at random among those due: a success revives a peer,
	// first-hand.
	// Peers never heard from first-hand are not dialled again: a real one
	// is named again by the nodes that know it.
	var due []*member
	for _, m := range o.members {
		switch {
		case !m.dead:
		case now.Sub(m.deadAt) > 2*o.cfg.DeadHold:
			o.forgetLocked(m)
		case o.cfg.RetryDead > 0 && !m.confirmed.IsZero() && !now.Before(m.retryAt) && now.Sub(m.deadAt) >= o.cfg.RetryDead:
			due = append(due, m)
		}
	}
	// Map order is random but not seeded: sort, then draw from the pool
	// stream.
	slices.SortFunc(due, func(a, b *member) int { return cmp.Compare(a.id, b.id) })
	for i := range min(o.cfg.RevivalProbes, len(due)) {
		j := i + o.rng.IntN(len(due)-i)
		due[i], due[j] = due[j], due[i]
		due[i].retryAt = now.Add(o.cfg.RetryDead)
		o.enqueueProbeLocked(due[i])
	}
	o.refillPoolLocked()
}
