package psp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func obs(peer string, step Step, iv float64) Observation {
	return Observation{Peer: peer, Step: step, Interval: iv}
}

func TestPDSSPRange(t *testing.T) {
	tests := []struct {
		name     string
		self     Step
		observed []Observation
		pass     bool
	}{
		{"empty sample", 9, nil, true},
		{"level", 5, []Observation{obs("a", 5, 0)}, true},
		{"peers ahead", 5, []Observation{obs("a", 9, 0), obs("b", 7, 0)}, true},
		{"gap exactly S_L", 5, []Observation{obs("a", 3, 0), obs("b", 9, 0)}, true},
		{"gap S_L+1, no timing", 5, []Observation{obs("a", 2, 0)}, false},
		{"gap S_U, no timing", 5, []Observation{obs("a", 0, 0)}, false},
		{"gap beyond S_U", 50, []Observation{obs("a", 0, 1), obs("b", 50, 0)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewPDSSP(2, 5).Decide(tt.self, 10, tt.observed)
			if d.Pass != tt.pass || d.Granted != 0 {
				t.Errorf("Decide(%d, %v) = %+v, want pass=%v and no grant", tt.self, tt.observed, d, tt.pass)
			}
			if !d.Pass && (d.Lagging < 1 || d.Staleness != 2) {
				t.Errorf("a wait reports %+v, want Lagging >= 1 and Staleness S_L=2", d)
			}
		})
	}
}

// TestPDSSPWorkedGrant: the node learns its own compute time (1 s) from
// successive checks, a sampled peer reports 5 s per step and last completed
// at 100 (when it was first seen). S_L=1, S_U=4.
func TestPDSSPWorkedGrant(t *testing.T) {
	d := NewPDSSP(1, 4)
	slow := func(step Step) []Observation { return []Observation{obs("slow", step, 5), obs("peer", 0, 0)} }
	steps := []struct {
		self Step
		now  float64
		obs  []Observation
		want Decision
	}{
		{0, 100, slow(0), Decision{Pass: true, Staleness: 1}},
		{1, 101, slow(0), Decision{Pass: true, Staleness: 1}}, // compute 1 s learnt
		// gap 2 > S_L. Slowest due at 105; r more steps end at 102+r: waits
		// 3, 2, 1, 0, so r = 3 = S_U-S_L.
		{2, 102, slow(0), Decision{Pass: true, Staleness: 2, Granted: 3}},
		{3, 103, slow(0), Decision{Pass: true, Staleness: 3}},
		{4, 104, slow(0), Decision{Pass: true, Staleness: 4}},
		// gap 5 > S_U: never passes, credit or not.
		{5, 105, slow(0), Decision{Pass: false, Staleness: 1, Lagging: 2}},
		{5, 106, slow(1), Decision{Pass: false, Staleness: 1, Lagging: 2}}, // gap 5 still (peer at 0)
		// Both peers catch up to within S_L.
		{5, 120, []Observation{obs("slow", 4, 5), obs("peer", 4, 0)}, Decision{Pass: true, Staleness: 1}},
	}
	for i, st := range steps {
		if got := d.Decide(st.self, st.now, st.obs); got != st.want {
			t.Fatalf("check %d (self %d at %v): %+v, want %+v", i, st.self, st.now, got, st.want)
		}
	}
	if math.Abs(d.compute-1) > 1e-12 {
		t.Errorf("learnt compute time %v, want 1", d.compute)
	}
}

// TestPDSSPLearnsPeerRate: without a reported interval the node learns the
// peer's time per step from the steps it sees change (EWMA, weight 0.3 on the
// newest), learns its own compute time the same way, and grants what they
// predict.
func TestPDSSPLearnsPeerRate(t *testing.T) {
	d := NewPDSSP(0, 3)
	for i, now := range []float64{50, 60, 70, 71, 72} {
		// The peer keeps level with the node, so each check passes at gap 0.
		if got := d.Decide(Step(i), now, []Observation{obs("p", Step(i), 0)}); !got.Pass {
			t.Fatalf("check at %v: %+v", now, got)
		}
		if now == 70 {
			if r := d.peers["p"]; math.Abs(r.interval-10) > 1e-9 || r.since != 70 || math.Abs(d.compute-10) > 1e-9 {
				t.Fatalf("at 70: peer %+v, compute %v; want interval 10 since 70, compute 10", *r, d.compute)
			}
		}
	}
	// Intervals 10, 10, 1, 1: EWMA 10 → 10 → 0.3+7 = 7.3 → 0.3+5.11 = 5.41,
	// the same for the peer's steps and for the node's own iterations.
	if r := d.peers["p"]; math.Abs(r.interval-5.41) > 1e-9 || r.since != 72 || math.Abs(d.compute-5.41) > 1e-9 {
		t.Fatalf("at 72: peer %+v, compute %v; want 5.41 since 72, compute 5.41", *r, d.compute)
	}
	// Step 5 at 73, the peer still at 4: gap 1 > S_L = 0. Own compute
	// becomes 0.3·1 + 0.7·5.41 = 4.087. The peer is due at 72 + 5.41 = 77.41;
	// r more steps end at 73 + 4.087r: waits 4.41, 0.323, 82.82-81.174 =
	// 1.646, 88.23-85.261 = 2.969. Best r = 1.
	got := d.Decide(5, 73, []Observation{obs("p", 4, 0)})
	if want := (Decision{Pass: true, Staleness: 1, Granted: 1}); got != want {
		t.Errorf("Decide = %+v, want %+v (compute %v)", got, want, d.compute)
	}
}

// TestPDSSPNoGrant: no allowance without timing data, when not the fastest in
// the sample, or when waiting is predicted not to shrink.
func TestPDSSPNoGrant(t *testing.T) {
	t.Run("own compute time unknown", func(t *testing.T) {
		d := NewPDSSP(1, 6)
		if got := d.Decide(3, 10, []Observation{obs("a", 0, 2)}); got.Pass {
			t.Errorf("%+v, want wait (SSP(S_L) without timing)", got)
		}
	})
	learn := func(d *PDSSPDecider, peer Observation) {
		d.Decide(0, 100, []Observation{{Peer: peer.Peer, Step: 0, Interval: peer.Interval}})
		d.Decide(1, 101, []Observation{{Peer: peer.Peer, Step: 0, Interval: peer.Interval}})
	}
	t.Run("peer interval unknown", func(t *testing.T) {
		d := NewPDSSP(1, 6)
		learn(d, obs("a", 0, 0))
		if got := d.Decide(2, 102, []Observation{obs("a", 0, 0)}); got.Pass {
			t.Errorf("%+v, want wait", got)
		}
	})
	t.Run("not the fastest in the sample", func(t *testing.T) {
		d := NewPDSSP(1, 6)
		learn(d, obs("a", 0, 5))
		if got := d.Decide(2, 102, []Observation{obs("a", 0, 5), obs("b", 3, 1)}); got.Pass {
			t.Errorf("%+v, want wait", got)
		}
	})
	t.Run("slowest completes now", func(t *testing.T) {
		d := NewPDSSP(1, 6)
		learn(d, obs("a", 0, 2)) // a first seen at 100, every 2 s: due at 102
		if got := d.Decide(2, 102, []Observation{obs("a", 0, 2)}); got.Pass {
			t.Errorf("%+v, want wait (w(0) = 0)", got)
		}
	})
	t.Run("control: same but the slowest is due later", func(t *testing.T) {
		d := NewPDSSP(1, 6)
		learn(d, obs("a", 0, 4))
		if got := d.Decide(2, 102, []Observation{obs("a", 0, 4)}); !got.Pass || got.Granted != 2 {
			t.Errorf("%+v, want a grant of 2 (due at 104)", got)
		}
	})
}

// randomObs builds a sample of k peers out of a pool of 30 named peers with
// steps around self and, sometimes, a reported interval.
func randomObs(rng *rand.Rand, self Step, k int) []Observation {
	out := make([]Observation, 0, k)
	for _, p := range SampleIndices(rng, 30, k, nil) {
		o := Observation{Peer: fmt.Sprint("peer", p), Step: max(0, self-Step(rng.IntN(9))+Step(rng.IntN(3)))}
		if rng.IntN(2) == 0 {
			o.Interval = 0.5 + 3*rng.Float64()
		}
		out = append(out, o)
	}
	return out
}

// TestPDSSPEqualRangeIsSSP: pdssp with S_L = S_U decides exactly as SSP(S_L)
// on the same sample, whatever it has learnt.
func TestPDSSPEqualRangeIsSSP(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 1))
	for _, s := range []int{0, 2, 5} {
		d := NewDecider(MustParse(fmt.Sprintf("pdssp:6:%d:%d", s, s)))
		ssp := NewDecider(MustParse(fmt.Sprintf("ssp:%d", s)))
		self, now := Step(10), 1.0
		for range 5000 {
			o := randomObs(rng, self, rng.IntN(7))
			got, want := d.Decide(self, now, o), ssp.Decide(self, now, o)
			if got != want {
				t.Fatalf("s=%d self=%d obs=%v: pdssp %+v, ssp %+v", s, self, o, got, want)
			}
			now += 0.1 + rng.Float64()
			if got.Pass {
				self++
			}
		}
	}
}

// TestPDSSPInvariants: over random runs, a pass never comes with the sample's
// slowest more than S_U behind, a check within S_L always passes, and grants
// stay in [1, S_U-S_L] and go only to the fastest in the sample.
func TestPDSSPInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 1))
	var grants, beyond int
	for _, rg := range [][2]int{{0, 3}, {1, 4}, {2, 9}} {
		sl, su := rg[0], rg[1]
		d := NewPDSSP(sl, su)
		self, now := Step(20), 100.0
		for range 20000 {
			o := randomObs(rng, self, 1+rng.IntN(5))
			got := d.Decide(self, now, o)
			gap, fastest := 0, true
			for _, x := range o {
				gap = max(gap, int(self-x.Step))
				fastest = fastest && x.Step <= self
			}
			switch {
			case got.Pass && gap > su:
				t.Fatalf("[%d,%d] pass at gap %d: %+v", sl, su, gap, got)
			case !got.Pass && gap <= sl:
				t.Fatalf("[%d,%d] wait at gap %d: %+v", sl, su, gap, got)
			case got.Granted < 0 || got.Granted > su-sl:
				t.Fatalf("[%d,%d] granted %d", sl, su, got.Granted)
			case got.Granted > 0 && (!fastest || !got.Pass):
				t.Fatalf("[%d,%d] granted %d, fastest=%v: %+v", sl, su, got.Granted, fastest, got)
			case !got.Pass && (got.Lagging != Lagging(self, sl, steps(o)) || got.Staleness != sl):
				t.Fatalf("[%d,%d] wait reports %+v", sl, su, got)
			}
			if got.Granted > 0 {
				grants++
			}
			if got.Pass && gap > sl {
				beyond++
			}
			now += 0.2 + rng.Float64()
			if got.Pass {
				self++
			}
		}
	}
	if grants == 0 || beyond == 0 {
		t.Errorf("random runs made %d grants and %d passes beyond S_L, want both > 0", grants, beyond)
	}
}

// TestPDSSPPeersBounded: the decider forgets the least recently seen peers
// beyond maxTracked, across many checks and within one huge one.
func TestPDSSPPeersBounded(t *testing.T) {
	d := NewPDSSP(1, 4)
	now := 1.0
	for i := range maxTracked + 2000 {
		d.Decide(5, now, []Observation{obs(fmt.Sprint("p", i), 5, 0)})
		now++
	}
	if len(d.peers) != maxTracked {
		t.Fatalf("%d peers tracked, want %d", len(d.peers), maxTracked)
	}
	for _, old := range []string{"p0", "p1999"} {
		if _, ok := d.peers[old]; ok {
			t.Errorf("least recently seen peer %s kept", old)
		}
	}
	for _, recent := range []string{"p2000", fmt.Sprint("p", maxTracked+1999)} {
		if _, ok := d.peers[recent]; !ok {
			t.Errorf("recent peer %s forgotten", recent)
		}
	}
	// A peer seen again is refreshed and survives the next evictions.
	d.Decide(5, now, []Observation{obs("p2000", 5, 0)})
	now++
	for i := range 10 {
		d.Decide(5, now, []Observation{obs(fmt.Sprint("q", i), 5, 0)})
		now++
	}
	if _, ok := d.peers["p2000"]; !ok {
		t.Error("refreshed peer evicted")
	}
	if _, ok := d.peers["p2001"]; ok {
		t.Error("p2001 should have been evicted before the refreshed p2000")
	}
}

// TestPDSSPHugeSample: one check over more peers than maxTracked (DSSP over
// every known peer in a large network) must not lose track of the slowest
// peer it is deciding on. Which peer an eviction within one check drops
// depends on map order; with 3·maxTracked peers the slowest is evicted in a
// trial with probability about 1-e⁻² ≈ 0.86, so three trials catch a
// regression (a nil dereference) all but 0.25% of the time.
func TestPDSSPHugeSample(t *testing.T) {
	for trial := range 3 {
		d := NewPDSSP(1, 4)
		d.Decide(0, 100, []Observation{obs("slow", 0, 5)})
		d.Decide(1, 101, []Observation{obs("slow", 0, 5)}) // compute 1 s
		big := []Observation{obs("slow", 0, 5)}
		for i := range 3 * maxTracked {
			big = append(big, obs(fmt.Sprint("p", i), 1, 0))
		}
		got := d.Decide(2, 102, big)
		if !got.Pass || got.Granted != 3 {
			t.Errorf("trial %d: %+v, want the worked grant of 3", trial, got)
		}
		if len(d.peers) > maxTracked {
			t.Errorf("trial %d: %d peers tracked", trial, len(d.peers))
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1000
	stepsAll := make([]Step, n)
	for i := range stepsAll {
		stepsAll[i] = Step(95 + rng.IntN(10))
	}
	d := NewDecider(MustParse("pssp:10:4"))
	idx := make([]int, 0, 10)
	o := make([]Observation, 0, 10)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		self := i % n
		idx = SampleOthers(rng, n, self, 10, idx)
		o = o[:0]
		for _, j := range idx {
			o = append(o, Observation{Step: stepsAll[j]})
		}
		d.Decide(stepsAll[self], 0, o)
	}
}

func BenchmarkDecidePDSSP(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := make([]string, 100)
	for i := range names {
		names[i] = fmt.Sprint("peer", i)
	}
	d := NewPDSSP(2, 6)
	o := make([]Observation, 0, 10)
	idx := make([]int, 0, 10)
	self, now := Step(100), 1.0
	b.ReportAllocs()
	for b.Loop() {
		idx = SampleIndices(rng, len(names), 10, idx)
		o = o[:0]
		for _, j := range idx {
			o = append(o, Observation{Peer: names[j], Step: self - Step(rng.IntN(5)), Interval: 1})
		}
		if d.Decide(self, now, o).Pass {
			self++
		}
		now += 0.5
	}
}
