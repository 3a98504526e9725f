package overlay

import (
	"bytes"
	"context"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
)

// maxLookupRounds bounds the rounds of one lookup. Starting from the
// closest peers the member set knows, a lookup converges in one to three.
const maxLookupRounds = 10

// lookupState is what one lookup learnt.
type lookupState struct {
	target     kb.ID
	responders map[peer.ID]bool           // answered FIND_NODE
	failed     map[peer.ID]bool           // were asked and did not answer
	named      map[peer.ID][]ma.Multiaddr // named by a responder, with the addresses given
	namedBy    map[peer.ID]int            // how many responders named each of them
	dist       map[peer.ID][]byte         // XOR distance to target of every peer above
}

func (s *lookupState) distance(p peer.ID) []byte {
	d, ok := s.dist[p]
	if !ok {
		d = kb.Xor(kb.ConvertPeerID(p), s.target)
		s.dist[p] = d
	}
	return d
}

// closest returns the peers among those that answered or were named by a
// peer that answered, without failed ones, sorted by distance to the target.
func (s *lookupState) closest() []peer.ID {
	out := make([]peer.ID, 0, len(s.responders)+len(s.named))
	for p := range s.responders {
		out = append(out, p)
	}
	for p := range s.named {
		if !s.responders[p] && !s.failed[p] {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(s.distance(out[i]), s.distance(out[j])) < 0 })
	return out
}

// lookup finds the peers closest to key (whose DHT key is its SHA-256, as
// for any DHT key) with FIND_NODE requests of the DHT protocol.
//
// It is Kademlia's iterative lookup with two changes that make it cost a
// few requests instead of about 25. It starts from the closest peers of the
// whole member set, not only the routing table: a node knows most of the
// population, so the first peers it asks are usually already among the
// closest. And it stops by Kademlia's own rule (the Resiliency closest
// peers heard of have all answered) without go-libp2p-kad-dht's follow-up,
// which then asks every one of the k closest as well. Each round asks the
// Concurrency closest peers not yet asked, in parallel.
func (o *Overlay) lookup(ctx context.Context, key string) *lookupState {
	st := &lookupState{
		target:     kb.ConvertKey(key),
		responders: make(map[peer.ID]bool),
		failed:     make(map[peer.ID]bool),
		named:      make(map[peer.ID][]ma.Multiaddr),
		namedBy:    make(map[peer.ID]int),
		dist:       make(map[peer.ID][]byte),
	}
	self := o.h.ID()
	// Seeds: the k closest live members (and routing-table peers, which
	// are members too once synced). One pass with no allocation per
	// member: at 1000 nodes each node knows about 1000.
	rtPeers := o.dht.RoutingTable().ListPeers()
	type seed struct {
		id peer.ID
		d  []byte
	}
	o.mu.Lock()
	seeds := make([]seed, 0, len(o.live)+len(rtPeers))
	buf := make([]byte, 0, len(st.target)*(len(o.live)+len(rtPeers)))
	xor := func(key []byte) []byte {
		n := len(buf)
		for i := range st.target {
			buf = append(buf, key[i]^st.target[i])
		}
		return buf[n:len(buf):len(buf)]
	}
	for _, m := range o.live {
		seeds = append(seeds, seed{m.id, xor(m.key)})
	}
	for _, p := range rtPeers {
		if _, known := o.members[p]; !known { // live members are in already; dead ones stay out
			seeds = append(seeds, seed{p, xor(kb.ConvertPeerID(p))})
		}
	}
	o.mu.Unlock()
	slices.SortFunc(seeds, func(a, b seed) int { return bytes.Compare(a.d, b.d) })
	candidates := make([]peer.ID, 0, o.cfg.BucketSize)
	for _, sd := range seeds[:min(len(seeds), o.cfg.BucketSize)] {
		candidates = append(candidates, sd.id)
		st.dist[sd.id] = sd.d
	}
	byDist := func(ps []peer.ID) {
		sort.Slice(ps, func(i, j int) bool { return bytes.Compare(st.distance(ps[i]), st.distance(ps[j])) < 0 })
	}
	asked := make(map[peer.ID]bool)

	for round := 0; round < maxLookupRounds && ctx.Err() == nil; round++ {
		if o.resilient(st, candidates, asked) {
			break
		}
		var next []peer.ID
		for _, p := range candidates {
			if !st.failed[p] && !asked[p] {
				if next = append(next, p); len(next) == o.cfg.Concurrency {
					break
				}
			}
		}
		if len(next) == 0 {
			break
		}
		type reply struct {
			p     peer.ID
			peers []*peer.AddrInfo
			err   error
		}
		replies := make([]reply, len(next))
		var wg sync.WaitGroup
		for i, p := range next {
			asked[p] = true
			wg.Go(func() {
				qctx, cancel := context.WithTimeout(ctx, o.cfg.QueryTimeout)
				defer cancel()
				ps, err := o.pm.GetClosestPeers(qctx, p, peer.ID(key))
				replies[i] = reply{p: p, peers: ps, err: err}
			})
		}
		wg.Wait()
		for _, r := range replies {
			if r.err != nil {
				st.failed[r.p] = true
				continue
			}
			st.responders[r.p] = true
			// Honest peers name at most k; more is an attempt to bloat
			// our state (kad-dht caps at 2k too).
			seen := make(map[peer.ID]bool, min(len(r.peers), 2*o.cfg.BucketSize))
			for _, ai := range r.peers[:min(len(r.peers), 2*o.cfg.BucketSize)] {
				if ai == nil || ai.ID == self || ai.ID == "" || seen[ai.ID] {
					continue
				}
				seen[ai.ID] = true
				st.named[ai.ID] = append(st.named[ai.ID], ai.Addrs...)
				st.namedBy[ai.ID]++
			}
		}
		// The next candidates: every peer heard of so far, closest first.
		pool := append([]peer.ID(nil), candidates...)
		for p := range st.named {
			if !slices.Contains(pool, p) {
				pool = append(pool, p)
			}
		}
		byDist(pool)
		candidates = pool[:min(len(pool), o.cfg.BucketSize)]
	}
	return st
}

// resilient reports whether the lookup may stop: the Resiliency closest
// candidates that have not failed have all answered.
func (o *Overlay) resilient(st *lookupState, candidates []peer.ID, asked map[peer.ID]bool) bool {
	n := 0
	for _, p := range candidates {
		if st.failed[p] {
			continue
		}
		if !asked[p] {
			return false
		}
		if n++; n >= o.cfg.Resiliency {
			return true
		}
	}
	return true
}

// walk runs one lookup for a uniformly random key (recordLookup says what
// it feeds).
func (o *Overlay) walk() {
	o.mu.Lock()
	key := randomKey(o.walkRNG)
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(o.ctx, 2*o.cfg.QueryTimeout)
	defer cancel()
	o.recordLookup(ctx, key, true)
	o.mu.Lock()
	o.walks++
	o.mu.Unlock()
}

// refresh refreshes the routing table with our own lookups, as the library's
// refresh does with its own (which cost about 25 requests each): one for
// our own key (the peers closest to us, the zone), one for a random key in
// every bucket that no lookup has touched for RefreshInterval (every bucket
// when force is set), then one FIND_NODE to each routing-table peer neither
// connected nor heard from for staleAfter, dropping those that do not
// answer. It takes at most 4 × QueryTimeout.
func (o *Overlay) refresh(force bool) {
	ctx, cancel := context.WithTimeout(o.ctx, 4*o.cfg.QueryTimeout)
	defer cancel()
	rt := o.dht.RoutingTable()
	o.recordLookup(ctx, string(o.h.ID()), false)
	for cpl, at := range rt.GetTrackedCplsForRefresh() {
		if ctx.Err() != nil {
			break
		}
		if !force && time.Since(at) < o.cfg.RefreshInterval {
			continue
		}
		o.mu.Lock()
		p, err := bucketKey(o.selfKey, uint(cpl), o.bucketRNG)
		o.mu.Unlock()
		if err == nil {
			o.recordLookup(ctx, string(p), false)
		}
	}
	o.evictStale(ctx)
	if o.ctx.Err() != nil {
		return
	}
	o.syncRoutingTable()
	o.mu.Lock()
	o.lastRefresh = time.Now()
	o.refreshes++
	o.mu.Unlock()
}

// staleAfter is how long a routing-table peer may go without answering a
// query of ours before a refresh asks it whether it is still there:
// go-libp2p-kad-dht's threshold, the time after which a peer would have
// been queried by a refresh with high probability, log(1/k)/log(1−α/k)
// refresh periods (18 for k = 20, α = 3). Our lookups ask fewer peers than
// the library's, so most routing-table peers go unasked for a while; a
// threshold of two periods had each refresh dial dozens of them.
func (o *Overlay) staleAfter() time.Duration {
	k, a := float64(o.cfg.BucketSize), float64(o.cfg.Concurrency)
	if a >= k {
		return o.cfg.RefreshInterval
	}
	return time.Duration(math.Log(1/k) / math.Log(1-a/k) * float64(o.cfg.RefreshInterval))
}

// evictStale asks every routing-table peer that is neither connected nor
// heard from for staleAfter for its closest peers (ProbeConcurrency at a
// time) and drops from the routing table those that do not answer.
func (o *Overlay) evictStale(ctx context.Context) {
	rt := o.dht.RoutingTable()
	sem := make(chan struct{}, o.cfg.ProbeConcurrency)
	var wg sync.WaitGroup
	stale := o.staleAfter()
	for _, pi := range rt.GetPeerInfos() {
		if o.connected(pi.Id) || time.Since(pi.LastSuccessfulOutboundQueryAt) < stale {
			continue
		}
		select {
		case <-ctx.Done():
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			qctx, cancel := context.WithTimeout(ctx, o.cfg.QueryTimeout)
			defer cancel()
			_, err := o.pm.GetClosestPeers(qctx, pi.Id, pi.Id)
			switch {
			case err == nil:
				rt.UpdateLastSuccessfulOutboundQueryAt(pi.Id, time.Now())
				o.MarkAlive(pi.Id)
			case ctx.Err() == nil:
				rt.RemovePeer(pi.Id)
			}
		})
	}
	wg.Wait()
}

// recordLookup runs one lookup for key and records what it learnt. Peers
// that answered are confirmed alive and offered to the routing table (as
// kad-dht does for peers that answer its queries); peers that failed while
// ctx was live leave it (as in kad-dht), and those never heard from
// first-hand are held dead; peers they named are added to the member set
// unconfirmed; the lookup's bucket is marked refreshed; and the k closest
// found feed the order-statistics estimator: for any key chosen
// independently of the other nodes' IDs, the distance to the k-th closest
// of them is Gamma(k, N−1). A peer counts among the closest only if it
// answered, was heard from first-hand before, or was named by at least two
// of the peers that answered: a peer that names made-up IDs would
// otherwise crowd the closest and inflate the estimate.
func (o *Overlay) recordLookup(ctx context.Context, key string, estimate bool) {
	st := o.lookup(ctx, key)
	if o.ctx.Err() != nil {
		return
	}
	// In ID order, not map order: the order of discoveries decides which
	// peers enter the pool and a full bucket, and with a seeded overlay
	// (Config.Seed) the same lookup must make the same choices.
	responders := slices.Sorted(maps.Keys(st.responders))
	named := slices.Sorted(maps.Keys(st.named))
	now := time.Now()
	rt := o.dht.RoutingTable()
	for _, p := range responders {
		if o.held.has(p) {
			continue
		}
		_, _ = rt.TryAddPeer(p, true, true)
		rt.UpdateLastSuccessfulOutboundQueryAt(p, now)
	}
	if ctx.Err() == nil {
		for p := range st.failed {
			rt.RemovePeer(p)
		}
	}
	rt.ResetCplRefreshedAtForID(st.target, now)
	ps := o.h.Peerstore()
	for p, addrs := range st.named {
		if len(addrs) > 0 && o.h.Network().Connectedness(p) != network.Connected {
			ps.AddAddrs(p, addrs, peerstore.TempAddrTTL)
		}
	}
	closest := st.closest()

	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	for _, p := range responders {
		o.touchLocked(p, true, now)
	}
	for _, p := range named {
		if !st.responders[p] {
			o.touchLocked(p, false, now)
		}
	}
	if ctx.Err() == nil {
		for _, p := range slices.Sorted(maps.Keys(st.failed)) { // in ID order, as above
			if m, ok := o.members[p]; ok && m.confirmed.IsZero() {
				o.markDeadLocked(m, now, "did not answer a lookup")
			}
		}
	}
	if len(st.responders) == 0 {
		o.log.Debug("lookup: no peer answered", "asked", len(st.failed))
		return
	}
	if !estimate {
		return
	}
	var ds []float64
	for _, p := range closest {
		if len(ds) == o.cfg.BucketSize {
			break
		}
		m, ok := o.members[p]
		if ok && m.dead || o.held.has(p) {
			continue
		}
		if !st.responders[p] && st.namedBy[p] < 2 && (!ok || m.confirmed.IsZero()) {
			continue // one peer's word only
		}
		ds = append(ds, normXOR(st.distance(p)))
	}
	if len(ds) == 0 {
		return
	}
	o.lookups = append(o.lookups, lookupSample{At: now, K: len(ds), DK: ds[len(ds)-1]})
	o.estCache.at = time.Time{}
}
