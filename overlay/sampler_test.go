package overlay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/test"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/pspnode/pspnode/internal/memnet"
)

// bareOverlay returns an Overlay whose background goroutines are not
// running, over a mocknet host, for driving the membership logic directly.
func bareOverlay(t testing.TB, cfg Config) *Overlay {
	t.Helper()
	ln := memnet.New(0)
	h, err := ln.NewHost(100, 200)
	if err != nil {
		t.Fatal(err)
	}
	d, err := dht.New(h, dht.Mode(dht.ModeServer), dht.ProtocolPrefix("/psp/test"), dht.DisableProviders(), dht.DisableValues(), dht.DisableAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	o := newOverlay(h, d, cfg, nil)
	t.Cleanup(func() {
		o.cancel()
		_ = d.Close()
		_ = h.Close()
		_ = ln.Close()
	})
	return o
}

// verifyPool marks every pool member verified, as successful probes would.
func verifyPool(o *Overlay) {
	for _, m := range o.pool {
		m.verified = true
		m.probing = false
	}
	for len(o.probeCh) > 0 {
		<-o.probeCh
	}
	for _, m := range o.members {
		m.probing = false
	}
}

// synthPeers returns the IDs of n Ed25519 keys drawn from a stream seeded
// with seed: the same peers for the same seed, so that statistical tests
// see the same population every run.
func synthPeers(t *testing.T, seed uint64, n int) []peer.ID {
	t.Helper()
	ps := make([]peer.ID, n)
	for i, k := range seededKeys(t, seed, n) {
		id, err := peer.IDFromPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = id
	}
	return ps
}

// seededKeys returns n Ed25519 keys drawn from a ChaCha8 stream seeded with
// seed.
func seededKeys(t testing.TB, seed uint64, n int) []crypto.PrivKey {
	t.Helper()
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	r := rand.NewChaCha8(s)
	keys := make([]crypto.PrivKey, n)
	for i := range keys {
		k, _, err := crypto.GenerateEd25519Key(r)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	return keys
}

// TestPoolReservoirUniform streams a population's discoveries into fresh
// overlays (early discoveries are what biased samplers over-pick: the
// bootstrap peer and routing-table neighbours) and checks, by chi-square,
// that pool membership does not depend on discovery order.
func TestPoolReservoirUniform(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PoolSize = 16
	cfg.Seed = 1
	o := bareOverlay(t, cfg)
	const pop, trials = 100, 1500
	peers := synthPeers(t, 1, pop)
	counts := make([]int, pop) // by discovery position
	now := time.Now()
	for range trials {
		o.members = make(map[peer.ID]*member)
		o.live, o.pool = nil, nil
		for _, p := range peers {
			o.touchLocked(p, true, now)
			verifyPool(o)
		}
		if len(o.pool) != cfg.PoolSize {
			t.Fatalf("pool size %d, want %d", len(o.pool), cfg.PoolSize)
		}
		for _, m := range o.pool {
			for i, p := range peers {
				if p == m.id {
					counts[i]++
				}
			}
		}
	}
	maxm, minm, chi2, p := uniformity(counts)
	t.Logf("reservoir: max/mean %.2f min/mean %.2f chi2 %.1f (df %d) p=%.3f", maxm, minm, chi2, pop-1, p)
	if p < 0.001 {
		t.Errorf("pool membership depends on discovery order: chi2 %.1f p=%.2g", chi2, p)
	}
}

// TestSampleUniform draws β=10 from a population of 200 drawable peers,
// many more than the pool, and checks that every call is a draw without
// replacement and that selection frequencies over 100·N picks are uniform
// over the whole population, not over the pool.
func TestSampleUniform(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PoolSize = 32
	cfg.Seed = 2
	o := bareOverlay(t, cfg)
	const pop = 200
	peers := synthPeers(t, 2, pop)
	idx := make(map[peer.ID]int, pop)
	now := time.Now()
	for i, p := range peers {
		idx[p] = i
		o.touchLocked(p, true, now)
	}
	verifyPool(o)
	counts := make([]int, pop)
	pooled := 0
	ctx := context.Background()
	for draws := 0; draws < 100*pop; draws += 10 {
		s, err := o.Sample(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		seen := make(map[peer.ID]bool)
		for _, p := range s {
			if seen[p] {
				t.Fatalf("duplicate %s in sample", p)
			}
			if p == o.h.ID() {
				t.Fatal("self in sample")
			}
			seen[p] = true
			counts[idx[p]]++
			if o.members[p].poolIdx >= 0 {
				pooled++
			}
		}
	}
	maxm, minm, chi2, p := uniformity(counts)
	t.Logf("sample: max/mean %.2f min/mean %.2f chi2 %.1f p=%.3f; %.3f of picks in the pool", maxm, minm, chi2, p, float64(pooled)/float64(100*pop))
	if maxm > 1.5 || minm < 0.5 || p < 0.001 {
		t.Errorf("sampling not uniform: max/mean %.2f min/mean %.2f p=%.2g", maxm, minm, p)
	}
	if share := float64(pooled) / float64(100*pop); math.Abs(share-float64(cfg.PoolSize)/pop) > 0.02 {
		t.Errorf("%.3f of picks in the pool, want its share of the population, %.3f", share, float64(cfg.PoolSize)/pop)
	}
}

// TestSampleDrawable checks which known peers Sample draws: those with
// first-hand evidence of life younger than LivenessWindow, and those with
// an open connection whatever the age of their evidence; never peers only
// heard of from others, nor peers whose evidence has aged out and that we
// hold no connection to (a departed peer drops out that way).
func TestSampleDrawable(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PoolSize = 4
	cfg.Seed = 6
	o := bareOverlay(t, cfg)
	peers := synthPeers(t, 6, 40)
	now := time.Now()
	old := now.Add(-2 * cfg.LivenessWindow)
	want := map[peer.ID]bool{}
	o.mu.Lock()
	for i, p := range peers {
		switch i % 4 {
		case 0: // fresh first-hand evidence
			o.touchLocked(p, true, now)
			want[p] = true
		case 1: // old evidence, connected
			o.touchLocked(p, true, old).connected = true
			want[p] = true
		case 2: // old evidence, not connected: aged out
			o.touchLocked(p, true, old)
		case 3: // only heard of from others
			o.touchLocked(p, false, now)
		}
	}
	for _, m := range o.pool { // the pool does not make a peer drawable by itself
		m.verified = true
	}
	o.mu.Unlock()
	got := map[peer.ID]bool{}
	for range 500 {
		s, err := o.Sample(context.Background(), 5)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range s {
			if !want[p] {
				t.Fatalf("drew %s, which is not drawable", p.ShortString())
			}
			got[p] = true
		}
	}
	if len(got) != len(want) {
		t.Errorf("drew %d distinct peers, want all %d drawable", len(got), len(want))
	}
	if _, err := o.Sample(context.Background(), len(want)+1); !errors.Is(err, ErrNotEnoughPeers) {
		t.Errorf("beta above the drawable count: err = %v, want ErrNotEnoughPeers", err)
	}
	// A connected peer whose connection closes is drawable no more once
	// its evidence is old; an aged-out one that answers again is drawable.
	o.mu.Lock()
	o.members[peers[1]].connected = false
	o.touchLocked(peers[2], true, time.Now())
	o.mu.Unlock()
	for range 300 {
		s, _ := o.Sample(context.Background(), 5)
		for _, p := range s {
			if p == peers[1] {
				t.Fatal("drew a disconnected peer with old evidence")
			}
			got[p] = true
		}
	}
	if !got[peers[2]] {
		t.Error("a peer that answered again was not drawn")
	}
}

// TestDeadAndRevive checks that a dead peer leaves the pool and samples at
// once, that third-party sightings do not revive it, and that first-hand
// evidence does.
func TestDeadAndRevive(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PoolSize = 8
	cfg.Seed = 3
	o := bareOverlay(t, cfg)
	peers := synthPeers(t, 3, 20)
	now := time.Now()
	for _, p := range peers {
		o.touchLocked(p, true, now)
	}
	verifyPool(o)
	victim := o.pool[0].id
	o.MarkDead(victim)
	verifyPool(o)
	if len(o.pool) != cfg.PoolSize {
		t.Fatalf("pool not refilled: %d", len(o.pool))
	}
	for range 200 {
		s, err := o.Sample(context.Background(), 8)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range s {
			if p == victim {
				t.Fatal("dead peer sampled")
			}
		}
	}
	o.touchLocked(victim, false, time.Now()) // another node's stale table
	if !o.members[victim].dead {
		t.Fatal("third-party sighting revived a dead peer")
	}
	for _, p := range o.Peers() {
		if p == victim {
			t.Fatal("dead peer in Peers()")
		}
	}
	o.MarkAlive(victim)
	if o.members[victim].dead {
		t.Fatal("MarkAlive did not revive")
	}
	found := false
	for _, p := range o.Peers() {
		found = found || p == victim
	}
	if !found {
		t.Fatal("revived peer missing from Peers()")
	}

	if _, err := o.Sample(context.Background(), len(peers)+1); !errors.Is(err, ErrNotEnoughPeers) {
		t.Fatalf("beta above the live peers: err = %v, want ErrNotEnoughPeers", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := o.Sample(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: err = %v", err)
	}
	if s, err := o.Sample(context.Background(), 0); err != nil || len(s) != 0 {
		t.Fatalf("beta 0: %v, %v", s, err)
	}
}

func TestObserveEstimateIgnoresNonsense(t *testing.T) {
	o := bareOverlay(t, DefaultConfig())
	p := test.RandPeerIDFatal(t)
	for _, v := range []float64{-1, 0, 0.5, 1e12} {
		o.ObserveEstimate(p, v)
	}
	o.ObserveEstimate(o.h.ID(), 50)
	if len(o.reports) != 0 {
		t.Fatalf("nonsense reports kept: %v", o.reports)
	}
	o.ObserveEstimate(p, 42)
	if len(o.reports) != 1 {
		t.Fatal("valid report dropped")
	}
}

func TestConfigValidate(t *testing.T) {
	good := DefaultConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"empty job":            func(c *Config) { c.Job = "" },
		"slash job":            func(c *Config) { c.Job = "a/b" },
		"zero pool":            func(c *Config) { c.PoolSize = 0 },
		"zero walk":            func(c *Config) { c.WalkInterval = 0 },
		"bad address":          func(c *Config) { c.BootstrapAddrs = []string{"/ip4/nope"} },
		"max lookups":          func(c *Config) { c.MaxLookups = c.MinLookups - 1 },
		"zero degree":          func(c *Config) { c.DegreeRefresh = 0 },
		"join retries crossed": func(c *Config) { c.KeepJoining, c.Join.RetryMin, c.Join.RetryMax = true, time.Minute, time.Second },
	} {
		c := DefaultConfig()
		mut(&c)
		err := c.Validate()
		if err == nil {
			_, err = c.Bootstrap()
		}
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestConfirmedCountsIncremental drives random first- and third-hand
// sightings and deaths and checks that the zone estimator's counts, kept up
// to date as members change, always equal a recount over the live members,
// and that the member lists agree with each other (checkLists).
func TestConfirmedCountsIncremental(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxUnconfirmed = 12 // below the 60 peers: sightings forget some
	o := bareOverlay(t, cfg)
	peers := synthPeers(t, 4, 60)
	for i, p := range peers[:40] { // 5 address groups of 8 peers; 20 with none
		o.h.Peerstore().AddAddrs(p, []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/7.2.%d.1/tcp/4001", i%5))}, peerstore.PermanentAddrTTL)
	}
	r := rand.New(rand.NewPCG(7, 11))
	now := time.Now()
	for i := range 3000 {
		p := peers[r.IntN(len(peers))]
		now = now.Add(time.Duration(r.IntN(5000)) * time.Millisecond)
		switch r.IntN(4) {
		case 0:
			o.touchLocked(p, false, now)
		case 1, 2:
			o.touchLocked(p, true, now)
		case 3:
			if m, ok := o.members[p]; ok {
				o.markDeadLocked(m, now, "test")
			}
		}
		var want [keyBits + 1]int
		for _, m := range o.live {
			if !m.confirmed.IsZero() {
				want[m.cpl]++
			}
		}
		if want != o.confirmedByCPL {
			t.Fatalf("after %d operations: incremental counts differ from a recount", i+1)
		}
		if got, peers := o.PeerCount(), len(o.Peers()); got != peers {
			t.Fatalf("after %d operations: PeerCount %d, Peers lists %d", i+1, got, peers)
		}
		checkLists(t, o, now)
	}
}

// checkLists checks that the overlay's member lists agree: the live list
// holds the live members; the unconfirmed list exactly the members with
// no first-hand evidence, at most MaxUnconfirmed of them; the draw list
// every drawable member, each index right; the address counts a recount
// of the live members with first-hand evidence.
func checkLists(t *testing.T, o *Overlay, now time.Time) {
	t.Helper()
	addrs := map[string]int{}
	for p, m := range o.members {
		if m.id != p {
			t.Fatalf("member %s filed under %s", m.id, p)
		}
		if (m.unconf != nil) != m.confirmed.IsZero() {
			t.Fatalf("%s: in the unconfirmed list %v, confirmed at %v", p.ShortString(), m.unconf != nil, m.confirmed)
		}
		if m.dead != (m.liveIdx < 0) || (m.liveIdx >= 0 && o.live[m.liveIdx] != m) {
			t.Fatalf("%s: dead %v, live index %d", p.ShortString(), m.dead, m.liveIdx)
		}
		if m.drawIdx >= 0 && o.draw[m.drawIdx] != m {
			t.Fatalf("%s: draw index %d is another member's", p.ShortString(), m.drawIdx)
		}
		if !m.dead && o.drawableLocked(m, now) && m.drawIdx < 0 {
			t.Fatalf("%s is drawable but not in the draw list", p.ShortString())
		}
		if m.dead && m.drawIdx >= 0 {
			t.Fatalf("%s is dead but in the draw list", p.ShortString())
		}
		if m.counted() && m.addr != "" {
			addrs[m.addr]++
		}
	}
	if len(o.live)+countDead(o) != len(o.members) {
		t.Fatalf("%d live + %d dead != %d members", len(o.live), countDead(o), len(o.members))
	}
	if n := o.unconfirmed.Len(); n > o.cfg.MaxUnconfirmed {
		t.Fatalf("%d unconfirmed members, bound %d", n, o.cfg.MaxUnconfirmed)
	}
	for e := o.unconfirmed.Front(); e != nil; e = e.Next() {
		if m := e.Value.(*member); o.members[m.id] != m {
			t.Fatalf("%s is in the unconfirmed list but not a member", m.id.ShortString())
		}
	}
	if len(addrs) != len(o.addrCount) {
		t.Fatalf("address counts %v, recount %v", o.addrCount, addrs)
	}
	for k, n := range addrs {
		if o.addrCount[k] != n {
			t.Fatalf("address counts %v, recount %v", o.addrCount, addrs)
		}
	}
}

func countDead(o *Overlay) int {
	n := 0
	for _, m := range o.members {
		if m.dead {
			n++
		}
	}
	return n
}

// Note is MarkDead, MarkAlive and ObserveEstimate for a check's peers in
// one call.
func TestNote(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PoolSize = 8
	o := bareOverlay(t, cfg)
	peers := synthPeers(t, 3, 6)
	now := time.Now()
	for _, p := range peers {
		o.touchLocked(p, true, now)
	}
	dead, revived := peers[0], peers[1]
	o.MarkDead(revived)
	o.Note([]peer.ID{dead}, []peer.ID{revived, peers[2]},
		[]Estimate{{Peer: peers[2], N: 42}, {Peer: peers[3], N: 0.5}, {Peer: o.h.ID(), N: 50}})
	verifyPool(o)
	if !o.members[dead].dead {
		t.Error("a peer noted dead is not dead")
	}
	if o.members[revived].dead {
		t.Error("a peer noted alive was not revived")
	}
	if len(o.reports) != 1 || o.reports[peers[2]].n != 42 {
		t.Errorf("reports %v, want only %v's 42", o.reports, peers[2])
	}
	o.Note(nil, nil, nil) // nothing to note
}
