package psp

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestChooseAllowance(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name                        string
		now, fast, slowLast, slowIv float64
		maxExtra                    int
		want                        int
	}{
		// The slowest completes at 12.5, 15.5, …; the fast one would finish r
		// more iterations at 10+r. w(0)=2.5, w(1)=1.5, w(2)=0.5, w(3)=15.5-13=2.5.
		{"worked example", 10, 1, 9.5, 3, 3, 2},
		{"worked example, room for 1", 10, 1, 9.5, 3, 1, 1},
		{"worked example, no room", 10, 1, 9.5, 3, 0, 0},
		// w(5) = 15.5-15 = 0.5 ties w(2): the smallest r wins.
		{"tie goes to the smaller r", 10, 1, 9.5, 3, 10, 2},
		// The slowest completes exactly now: w(0) = 0, nothing to gain.
		{"slowest completes now", 10, 1, 8, 2, 4, 0},
		// Completions at 105, 112: w(r) = 5-r up to r=5.
		{"slowest last seen long ago", 100, 1, 0, 7, 3, 3},
		{"slowest last seen long ago, room to reach it", 100, 1, 0, 7, 9, 5},
		// A slow "fast" worker: w(0)=0.5, w(1)=20.5-20=0.5: tie, r=0.
		{"fast interval longer than slow", 10, 10, 9.5, 1, 3, 0},
		{"much slower slowest", 0, 1, 0, 100, 5, 5},
		{"fast unknown", 10, 0, 9.5, 3, 3, 0},
		{"slow unknown", 10, 1, 9.5, 0, 3, 0},
		{"negative interval", 10, -1, 9.5, 3, 3, 0},
		{"NaN fast", 10, nan, 9.5, 3, 3, 0},
		{"NaN slow", 10, 1, 9.5, nan, 3, 0},
		{"Inf fast", 10, inf, 9.5, 3, 3, 0},
		{"Inf slow", 10, 1, 9.5, inf, 3, 0},
		{"NaN now", nan, 1, 9.5, 3, 3, 0},
		{"NaN slowLast", 10, 1, nan, 3, 3, 0},
		{"negative maxExtra", 10, 1, 9.5, 3, -2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ChooseAllowance(tt.now, tt.fast, tt.slowLast, tt.slowIv, tt.maxExtra)
			if got != tt.want {
				t.Errorf("ChooseAllowance(%v, %v, %v, %v, %d) = %d, want %d",
					tt.now, tt.fast, tt.slowLast, tt.slowIv, tt.maxExtra, got, tt.want)
			}
		})
	}
}

// predictedWait computes w(r) by walking the slowest worker's predicted
// completions one by one, independently of ChooseAllowance's closed form.
func predictedWait(now, fast, slowLast, slowIv float64, r int) float64 {
	tr := now + float64(r)*fast
	s := slowLast + slowIv
	for s < tr {
		s += slowIv
	}
	return s - tr
}

// TestChooseAllowanceMinimisesWait checks ChooseAllowance against a brute
// force over random inputs on a dyadic grid (so the arithmetic is exact and
// ties are real ties): it returns the smallest r in [0, maxExtra] with the
// least predicted wait.
func TestChooseAllowanceMinimisesWait(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 1))
	grid := func(lo, hi int) float64 { return float64(lo+rng.IntN(hi-lo+1)) / 4 }
	for range 20000 {
		now := grid(0, 400)
		slowLast := now - grid(0, 60)
		fast, slowIv := grid(1, 20), grid(1, 40)
		maxExtra := rng.IntN(8)
		got := ChooseAllowance(now, fast, slowLast, slowIv, maxExtra)
		best, bestW := 0, math.Inf(1)
		for r := 0; r <= maxExtra; r++ {
			if w := predictedWait(now, fast, slowLast, slowIv, r); w < bestW {
				best, bestW = r, w
			}
		}
		if got != best {
			t.Fatalf("ChooseAllowance(%v, %v, %v, %v, %d) = %d (wait %v), brute force %d (wait %v)",
				now, fast, slowLast, slowIv, maxExtra, got, predictedWait(now, fast, slowLast, slowIv, got), best, bestW)
		}
	}
}

// dsspSim drives a DSSPController through a discrete-event run: each worker
// has its own time per iteration (with jitter); a worker that completes an
// iteration pushes; a worker told to wait is retried after every push; at
// random a worker leaves. check sees every decision with the controller's
// view before and after.
type dsspSim struct {
	c       *DSSPController
	rng     *rand.Rand
	base    []float64 // mean seconds per iteration
	next    []float64 // next completion time; +Inf while waiting or gone
	waiting []bool
	gone    []bool
}

func newDSSPSim(seed uint64, n, sl, su int) *dsspSim {
	s := &dsspSim{c: NewDSSPController(n, sl, su), rng: rand.New(rand.NewPCG(seed, 7))}
	for i := range n {
		b := 1 + s.rng.Float64()
		if i%4 == 0 {
			b *= 4 // stragglers
		}
		s.base = append(s.base, b)
		s.next = append(s.next, 1+b*s.rng.Float64())
		s.waiting = append(s.waiting, false)
		s.gone = append(s.gone, false)
	}
	return s
}

func (s *dsspSim) live() []int {
	var out []int
	for i, g := range s.gone {
		if !g {
			out = append(out, i)
		}
	}
	return out
}

// liveOthers returns the steps of the live workers other than w.
func (s *dsspSim) liveOthers(w int) []Step {
	var out []Step
	for _, i := range s.live() {
		if i != w {
			out = append(out, s.c.Step(i))
		}
	}
	return out
}

func (s *dsspSim) gap(w int) int {
	low := s.c.Step(w)
	for _, st := range s.liveOthers(w) {
		low = min(low, st)
	}
	return int(s.c.Step(w) - low)
}

func (s *dsspSim) fastest(w int) bool {
	for _, st := range s.liveOthers(w) {
		if st > s.c.Step(w) {
			return false
		}
	}
	return true
}

// run simulates events pushes; onPush and onRetry see each decision.
func (s *dsspSim) run(events int, leaveProb float64,
	onPush func(w int, now float64, d Decision), onRetry func(w int, d Decision)) {
	for range events {
		w := -1
		for i, t := range s.next {
			if !s.gone[i] && !s.waiting[i] && (w < 0 || t < s.next[w]) {
				w = i
			}
		}
		if w < 0 {
			panic("every live worker waits: deadlock")
		}
		now := s.next[w]
		if live := s.live(); len(live) > 2 && s.rng.Float64() < leaveProb {
			v := live[s.rng.IntN(len(live))]
			s.c.Leave(v)
			s.gone[v] = true
			s.waiting[v] = false
		} else {
			d := s.c.Push(w, now)
			onPush(w, now, d)
			if d.Pass {
				s.next[w] = now + s.base[w]*(0.5+s.rng.Float64())
			} else {
				s.waiting[w] = true
			}
		}
		for i := range s.waiting {
			if s.waiting[i] && !s.gone[i] {
				d := s.c.Retry(i)
				onRetry(i, d)
				if d.Pass {
					s.waiting[i] = false
					s.next[i] = now + s.base[i]*(0.5+s.rng.Float64())
				}
			}
		}
	}
}

// TestDSSPControllerEqualRangeIsSSP: with S_L = S_U there is no room for
// extra iterations and every decision is SSP(S_L)'s over the live workers.
func TestDSSPControllerEqualRangeIsSSP(t *testing.T) {
	for _, s := range []int{0, 1, 3} {
		for seed := range uint64(3) {
			sim := newDSSPSim(seed, 12, s, s)
			check := func(kind string, w int, d Decision) {
				others := sim.liveOthers(w)
				c := sim.c.Step(w)
				if d.Pass != Pass(c, s, others) || d.Granted != 0 || d.Staleness != s ||
					(d.Pass && d.Lagging != 0) || (!d.Pass && d.Lagging < 1) {
					t.Fatalf("s=%d seed=%d %s worker %d at step %d, others %v: %+v, want SSP(%d) pass=%v",
						s, seed, kind, w, c, others, d, s, Pass(c, s, others))
				}
			}
			sim.run(3000, 0.002,
				func(w int, _ float64, d Decision) { check("push", w, d) },
				func(w int, d Decision) { check("retry", w, d) })
		}
	}
}

// TestDSSPControllerInvariants: over random runs with S_L < S_U, a pass never
// leaves a worker more than S_U ahead of the slowest live worker, a worker
// within S_L always passes, allowances stay within [0, S_U-S_L] and go only
// to the fastest, and the run never deadlocks. It also checks the run
// exercised grants and credits.
func TestDSSPControllerInvariants(t *testing.T) {
	var grants, credits int
	for _, rg := range [][2]int{{0, 2}, {1, 4}, {2, 8}} {
		sl, su := rg[0], rg[1]
		for seed := range uint64(3) {
			sim := newDSSPSim(100+seed, 10, sl, su)
			sim.run(3000, 0.001,
				func(w int, _ float64, d Decision) {
					g := sim.gap(w)
					switch {
					case d.Pass && g > su:
						t.Fatalf("[%d,%d] push by %d passed at gap %d: %+v", sl, su, w, g, d)
					case !d.Pass && g <= sl:
						t.Fatalf("[%d,%d] push by %d waits at gap %d <= S_L: %+v", sl, su, w, g, d)
					case d.Granted < 0 || d.Granted > su-sl:
						t.Fatalf("[%d,%d] granted %d", sl, su, d.Granted)
					case d.Granted > 0 && !sim.fastest(w):
						t.Fatalf("[%d,%d] granted %d to %d, not the fastest", sl, su, d.Granted, w)
					case d.Pass && g > sl && d.Staleness != g:
						t.Fatalf("[%d,%d] pass beyond S_L at gap %d reports staleness %d", sl, su, g, d.Staleness)
					}
					if d.Granted > 0 {
						grants++
					} else if d.Pass && g > sl {
						credits++
					}
				},
				func(w int, d Decision) {
					if g := sim.gap(w); d.Pass != (g <= sl) {
						t.Fatalf("[%d,%d] retry of %d at gap %d: %+v", sl, su, w, g, d)
					}
				})
		}
	}
	if grants == 0 || credits == 0 {
		t.Errorf("runs exercised %d grants and %d credit passes, want both > 0", grants, credits)
	}
}

// TestDSSPControllerCredits walks the worked case by hand: S_L=1, S_U=4. The
// slowest pushes every 10 s, the fast worker every 1 s.
func TestDSSPControllerCredits(t *testing.T) {
	c := NewDSSPController(0, 1, 4)
	slow := c.Join(0, 90)
	if d := c.Push(slow, 100); !d.Pass { // step 1; interval 10 learnt
		t.Fatalf("lone worker waits: %+v", d)
	}
	fast := c.Join(1, 100)
	steps := []struct {
		now  float64
		want Decision
	}{
		{101, Decision{Pass: true, Staleness: 1}}, // step 2, gap 1 <= S_L; interval 1 learnt
		// step 3, gap 2 > S_L. The slowest's next push is due at 110; the
		// fast worker would finish r more at 102+r: waits 8, 7, 6, 5, so r = 3.
		{102, Decision{Pass: true, Staleness: 2, Granted: 3}},
		{103, Decision{Pass: true, Staleness: 3}}, // step 4: credit
		{104, Decision{Pass: true, Staleness: 4}}, // step 5: last credit, gap = S_U
		{105, Decision{Pass: false, Staleness: 1, Lagging: 1}},
	}
	for i, st := range steps {
		if got := c.Push(fast, st.now); got != st.want {
			t.Fatalf("push %d at %v (step %d, slowest %d): %+v, want %+v", i, st.now, c.Step(fast), c.Step(slow), got, st.want)
		}
	}
	// Step 6, gap 5. It waits until the slowest is within S_L again.
	for now, slowStep := 110.0, Step(2); slowStep <= 5; now, slowStep = now+10, slowStep+1 {
		if d := c.Push(slow, now); !d.Pass || c.Step(slow) != slowStep {
			t.Fatalf("slowest push at %v: %+v, step %d", now, d, c.Step(slow))
		}
		want := slowStep >= 5 // gap 6-5 = 1
		if d := c.Retry(fast); d.Pass != want {
			t.Fatalf("retry with slowest at %d: %+v, want pass=%v", slowStep, d, want)
		}
	}
}

// TestDSSPControllerNotFastestWaits: a worker beyond S_L that is not the
// fastest gets no allowance, although the same timing grants one when it is.
func TestDSSPControllerNotFastestWaits(t *testing.T) {
	for _, withFast := range []bool{false, true} {
		c := NewDSSPController(0, 0, 5)
		slow, mid := c.Join(0, 1), c.Join(1, 1)
		if withFast {
			c.Join(3, 1)
		}
		c.Push(slow, 3) // step 1, 2 s per step, due again at 5
		// mid: step 2 at 3.5 (2.5 s per step), gap 1 > S_L = 0. Its r more
		// steps end at 3.5+2.5r; the slowest completes at 5, 7, 9, 11: waits
		// 1.5, 1, 0.5, 0, so r = 3 if it is the fastest.
		d := c.Push(mid, 3.5)
		want := Decision{Pass: true, Staleness: 1, Granted: 3}
		if withFast {
			want = Decision{Pass: false, Staleness: 0, Lagging: 1}
		}
		if d != want {
			t.Errorf("fastest present=%v: %+v, want %+v", withFast, d, want)
		}
	}
}

func TestDSSPControllerLeave(t *testing.T) {
	c := NewDSSPController(3, 0, 0) // BSP among three
	if d := c.Push(0, 1); d.Pass {
		t.Fatalf("worker 0 passed ahead of the others: %+v", d)
	}
	if d := c.Push(1, 1.5); d.Pass {
		t.Fatalf("worker 1 passed ahead of worker 2: %+v", d)
	}
	// Worker 2 is gone without saying so: it holds the others, as in SSP.
	for range 3 {
		if c.Retry(0).Pass || c.Retry(1).Pass {
			t.Fatal("a silent crash must hold the others back")
		}
	}
	c.Leave(2)
	if !c.Retry(0).Pass || !c.Retry(1).Pass {
		t.Fatal("after worker 2 left, workers 0 and 1 are level and must pass")
	}
	if d := c.Push(0, 2); d.Pass {
		t.Errorf("worker 0 one step ahead of worker 1: %+v, want wait", d)
	}
	if d := c.Push(1, 2.5); !d.Pass {
		t.Errorf("worker 1 catching up: %+v, want pass", d)
	}
	// A joiner at the current step (2) takes part at once.
	j := c.Join(c.Step(0), 3)
	if d := c.Push(0, 3.5); d.Pass {
		t.Errorf("worker 0 ahead of the joiner: %+v, want wait", d)
	}
	if d := c.Push(1, 3.7); d.Pass {
		t.Errorf("worker 1 ahead of the joiner: %+v, want wait", d)
	}
	if d := c.Push(j, 4); !d.Pass {
		t.Errorf("joiner catching up: %+v, want pass", d)
	}
	if !c.Retry(0).Pass || !c.Retry(1).Pass {
		t.Error("all three at step 3: retries must pass")
	}
}
