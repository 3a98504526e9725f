package psp

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPassLaggingThresholds(t *testing.T) {
	const c = Step(10)
	tests := []struct {
		name     string
		s        int
		observed []Step
		pass     bool
		lagging  int
	}{
		{"bsp step exactly c", 0, []Step{10}, true, 0},
		{"bsp step c-1", 0, []Step{9}, false, 1},
		{"bsp peers ahead", 0, []Step{11, 50}, true, 0},
		{"ssp step exactly c-s", 3, []Step{7}, true, 0},
		{"ssp step c-s-1", 3, []Step{6}, false, 1},
		{"ssp step c-1 within staleness", 3, []Step{9}, true, 0},
		{"ssp mixed counts only those below", 3, []Step{6, 7, 5, 10, 0}, false, 3},
		{"ssp all at threshold", 3, []Step{7, 7, 7}, true, 0},
		{"asp far behind", -1, []Step{0, -100, 3}, true, 0},
		{"asp any negative s", -7, []Step{0}, true, 0},
		{"empty observation bsp", 0, nil, true, 0},
		{"empty observation ssp", 4, []Step{}, true, 0},
		{"staleness larger than c", 20, []Step{-10, 0}, true, 0},
		{"staleness larger than c, below threshold", 20, []Step{-11}, false, 1},
		{"huge staleness", MaxStaleness, []Step{0, -1000}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Pass(c, tt.s, tt.observed); got != tt.pass {
				t.Errorf("Pass(%d, %d, %v) = %v, want %v", c, tt.s, tt.observed, got, tt.pass)
			}
			if got := Lagging(c, tt.s, tt.observed); got != tt.lagging {
				t.Errorf("Lagging(%d, %d, %v) = %d, want %d", c, tt.s, tt.observed, got, tt.lagging)
			}
			// The first observation behind decides a failed check at once.
			if got := slices.ContainsFunc(tt.observed, func(o Step) bool { return Behind(c, tt.s, o) }); got == tt.pass {
				t.Errorf("some Behind(%d, %d, o) over %v = %v, want %v", c, tt.s, tt.observed, got, !tt.pass)
			}
		})
	}
}

// obsOf wraps steps as anonymous observations.
func obsOf(steps []Step) []Observation {
	out := make([]Observation, len(steps))
	for i, s := range steps {
		out[i] = Observation{Peer: string(rune('a' + i%26)), Step: s}
	}
	return out
}

// randSteps returns n steps scattered around c: some ahead, some at c, some
// just inside and just outside small stalenesses, some far behind.
func randSteps(rng *rand.Rand, n int, c Step) []Step {
	out := make([]Step, n)
	for i := range out {
		switch rng.IntN(4) {
		case 0:
			out[i] = c + Step(rng.IntN(5))
		case 1:
			out[i] = c - Step(rng.IntN(8))
		case 2:
			out[i] = c - Step(rng.IntN(30))
		default:
			out[i] = Step(rng.IntN(int(c) + 10))
		}
	}
	return out
}

func TestNewDeciderStaticAgreesWithPass(t *testing.T) {
	specs := []string{"asp", "bsp", "ssp:0", "ssp:1", "ssp:4", "pbsp:0", "pbsp:3", "pssp:3:0", "pssp:10:4", "pssp:2:100"}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, str := range specs {
		sp := MustParse(str)
		d := NewDecider(sp)
		if _, dyn := d.(*PDSSPDecider); dyn {
			t.Fatalf("%s: static spec got a dynamic decider", str)
		}
		s := sp.BaseStaleness()
		for range 2000 {
			c := Step(rng.IntN(40))
			steps := randSteps(rng, rng.IntN(12), c)
			got := d.Decide(c, rng.Float64()*100, obsOf(steps))
			want := Decision{Pass: Pass(c, s, steps), Staleness: s, Lagging: Lagging(c, s, steps)}
			if got != want {
				t.Fatalf("%s: Decide(%d, %v) = %+v, want %+v", str, c, steps, got, want)
			}
		}
	}
}

func TestNewDeciderDynamicKinds(t *testing.T) {
	for _, str := range []string{"dssp:1:4", "pdssp:5:1:4"} {
		d := NewDecider(MustParse(str))
		p, ok := d.(*PDSSPDecider)
		if !ok {
			t.Fatalf("%s: NewDecider = %T, want *PDSSPDecider", str, d)
		}
		if p.sl != 1 || p.su != 4 {
			t.Errorf("%s: range [%d, %d], want [1, 4]", str, p.sl, p.su)
		}
		if d2 := NewDecider(MustParse(str)); d2 == d {
			t.Errorf("%s: NewDecider must return a fresh decider per call", str)
		}
	}
}

// decideSampled runs a barrier check the way a node does: draw
// sp.SampleSize(P-1) other nodes with SampleOthers and decide on their steps.
func decideSampled(rng *rand.Rand, sp Spec, steps []Step, self int) (Decision, []int) {
	idx := SampleOthers(rng, len(steps), self, sp.SampleSize(len(steps)-1), nil)
	obs := make([]Observation, len(idx))
	for i, j := range idx {
		obs[i] = Observation{Peer: string(rune('A' + j%26)), Step: steps[j]}
	}
	return NewDecider(sp).Decide(steps[self], 0, obs), idx
}

func others(steps []Step, self int) []Step {
	return slices.Concat(steps[:self], steps[self+1:])
}

// TestIdentities checks the barriers' identities as properties over random
// populations: pBSP(0) and pSSP(0,s) are ASP; pBSP(β) with β ≥ P−1 is BSP
// and pSSP(β,s) with β ≥ P−1 is SSP(s); SSP(0) is BSP.
func TestIdentities(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rounds = 3000
	for range rounds {
		P := 1 + rng.IntN(40)
		c := Step(rng.IntN(60))
		steps := randSteps(rng, P, c)
		self := rng.IntN(P)
		c = steps[self]
		rest := others(steps, self)
		s := rng.IntN(6)

		// β = 0 is ASP.
		for _, sp := range []Spec{{Kind: PBSP}, {Kind: PSSP, Staleness: s}} {
			if d, idx := decideSampled(rng, sp, steps, self); !d.Pass || len(idx) != 0 || d.Lagging != 0 {
				t.Fatalf("%v over %v (self %d): %+v with sample %v, want a pass on an empty sample", sp, steps, self, d, idx)
			}
		}

		// β ≥ P-1 samples everyone: pBSP is BSP and pSSP is SSP.
		for _, beta := range []int{P - 1, P, 2*P + 3} {
			if beta < 0 {
				continue
			}
			for _, pair := range [][2]Spec{
				{{Kind: PBSP, Beta: beta}, {Kind: BSP}},
				{{Kind: PSSP, Beta: beta, Staleness: s}, {Kind: SSP, Staleness: s}},
			} {
				prob, global := pair[0], pair[1]
				d, idx := decideSampled(rng, prob, steps, self)
				sorted := slices.Sorted(slices.Values(idx))
				var want []int
				for j := range P {
					if j != self {
						want = append(want, j)
					}
				}
				if !slices.Equal(sorted, want) {
					t.Fatalf("%v, P=%d: sample %v, want every other node %v", prob, P, sorted, want)
				}
				g := NewDecider(global).Decide(c, 0, obsOf(rest))
				if d != g {
					t.Fatalf("%v over %v (self %d) = %+v, %v = %+v", prob, steps, self, d, global, g)
				}
				if g.Pass != Pass(c, global.BaseStaleness(), rest) {
					t.Fatalf("%v disagrees with Pass", global)
				}
			}
		}

		// s = ∞ is ASP.
		for _, sp := range []Spec{
			{Kind: SSP, Staleness: MaxStaleness},
			{Kind: PSSP, Beta: 1 + rng.IntN(P+2), Staleness: MaxStaleness},
		} {
			if d, _ := decideSampled(rng, sp, steps, self); !d.Pass {
				t.Fatalf("%v over %v: %+v, want pass", sp, steps, d)
			}
		}

		// pSSP(β, 0) decides exactly as pBSP(β) on the same sample.
		beta := rng.IntN(P + 2)
		seed := rng.Uint64()
		dp, ip := decideSampled(rand.New(rand.NewPCG(seed, 0)), Spec{Kind: PSSP, Beta: beta}, steps, self)
		db, ib := decideSampled(rand.New(rand.NewPCG(seed, 0)), Spec{Kind: PBSP, Beta: beta}, steps, self)
		if !slices.Equal(ip, ib) || dp != db {
			t.Fatalf("pssp:%d:0 = %+v on %v, pbsp:%d = %+v on %v", beta, dp, ip, beta, db, ib)
		}
	}
}

// TestSampledBarrierRejectsOnlyViaSample checks pSSP's semantics directly: the
// decision is Pass over exactly the sampled steps, so a pass is possible with
// laggards outside the sample and impossible with one inside.
func TestSampledBarrierRejectsOnlyViaSample(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	steps := make([]Step, 20)
	for i := range steps {
		steps[i] = 10
	}
	steps[7] = 0 // the one laggard
	sp := MustParse("pssp:3:2")
	var passed, failed int
	for range 4000 {
		d, idx := decideSampled(rng, sp, steps, 0)
		if d.Pass == slices.Contains(idx, 7) {
			t.Fatalf("sample %v: pass=%v, but the laggard's presence must decide", idx, d.Pass)
		}
		if d.Pass {
			passed++
		} else {
			failed++
		}
	}
	// P(laggard sampled) = 3/19 ≈ 0.158: 632 of 4000 expected.
	if failed < 480 || failed > 790 {
		t.Errorf("laggard sampled %d of 4000 times, want about 632", failed)
	}
	_ = passed
}
