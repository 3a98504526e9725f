package psp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

func checkSample(t *testing.T, got []int, n, self, k int) {
	t.Helper()
	want := max(0, min(k, n))
	if self >= 0 && self < n {
		want = max(0, min(k, n-1))
	}
	if len(got) != want {
		t.Fatalf("n=%d self=%d k=%d: got %d values %v, want %d", n, self, k, len(got), got, want)
	}
	seen := make(map[int]bool, len(got))
	for _, v := range got {
		if v < 0 || v >= n {
			t.Fatalf("n=%d self=%d k=%d: %d out of range in %v", n, self, k, v, got)
		}
		if v == self {
			t.Fatalf("n=%d self=%d k=%d: sampled self in %v", n, self, k, got)
		}
		if seen[v] {
			t.Fatalf("n=%d self=%d k=%d: %d twice in %v", n, self, k, v, got)
		}
		seen[v] = true
	}
}

func TestSampleIndicesAndOthersInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cases := []struct{ n, k int }{
		{0, 0}, {0, 5}, {1, 0}, {1, 1}, {1, 3}, {2, 1}, {2, 2}, {5, 2}, {5, 5}, {5, 9},
		{10, -3}, {50, 5}, {64, 32}, {64, 33}, {100, 40}, {100, 99}, {100, 100}, {100, 1000},
		{10000, 10}, {10000, 500},
	}
	for _, tc := range cases {
		for rep := range 50 {
			got := SampleIndices(rng, tc.n, tc.k, nil)
			checkSample(t, got, tc.n, -1, tc.k)
			if tc.n > 0 {
				for _, self := range []int{0, tc.n - 1, rng.IntN(tc.n)} {
					got := SampleOthers(rng, tc.n, self, tc.k, nil)
					checkSample(t, got, tc.n, self, tc.k)
				}
			}
			// self outside [0, n) excludes nothing.
			checkSample(t, SampleOthers(rng, tc.n, -1, tc.k, nil), tc.n, -1, tc.k)
			checkSample(t, SampleOthers(rng, tc.n, tc.n+rep, tc.k, nil), tc.n, -1, tc.k)
		}
	}
}

func TestSampleReusesDst(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	buf := make([]int, 3, 16)
	buf[0] = 999
	got := SampleOthers(rng, 100, 4, 10, buf)
	if &got[0] != &buf[0] {
		t.Error("SampleOthers did not reuse dst's backing array")
	}
	checkSample(t, got, 100, 4, 10)
	allocs := testing.AllocsPerRun(200, func() { buf = SampleOthers(rng, 10000, 17, 10, buf) })
	if allocs != 0 {
		t.Errorf("SampleOthers with k=10 and a large enough dst: %v allocs per call, want 0", allocs)
	}
}

// TestSampleDeterministic: the same seed gives the same sample (the simulator
// relies on it).
func TestSampleDeterministic(t *testing.T) {
	a := SampleOthers(rand.New(rand.NewPCG(11, 12)), 1000, 3, 40, nil)
	b := SampleOthers(rand.New(rand.NewPCG(11, 12)), 1000, 3, 40, nil)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different samples: %v vs %v", a, b)
	}
}

// chiSquareP returns Pearson's chi-square statistic of counts against a
// uniform expectation, and its p-value on len(counts)-1 degrees of freedom.
// Counts of whole draws (one subset per draw) are multinomial and need no
// correction; for element counts see elementChiSquareP.
func chiSquareP(counts []int) (stat, p float64) {
	total := 0
	for _, c := range counts {
		total += c
	}
	exp := float64(total) / float64(len(counts))
	for _, c := range counts {
		d := float64(c) - exp
		stat += d * d / exp
	}
	return stat, distuv.ChiSquared{K: float64(len(counts) - 1)}.Survival(stat)
}

// elementChiSquareP tests the element counts of draws of k distinct elements
// out of m. Each draw adds k to the total but, without replacement, the
// counts vary less than a multinomial's: their covariance matrix is the
// multinomial one scaled by (m-k)/(m-1) (every variance and covariance alike,
// by exchangeability), so Pearson's statistic scaled by (m-1)/(m-k) is again
// chi-square with m-1 degrees of freedom. Without the correction the test
// would be blind for k near m.
func elementChiSquareP(counts []int, k int) (stat, p float64) {
	m := len(counts)
	stat, _ = chiSquareP(counts)
	stat *= float64(m-1) / float64(m-k)
	return stat, distuv.ChiSquared{K: float64(m - 1)}.Survival(stat)
}

func TestChiSquarePDetectsBias(t *testing.T) {
	// The helper must be able to fail: a 7.5% bias on two of 50 cells.
	counts := make([]int, 50)
	for i := range counts {
		counts[i] = 20000
	}
	counts[0] = 21500 // +7.5%
	counts[1] = 18500
	if _, p := chiSquareP(counts); p > 1e-4 {
		t.Errorf("chi-square p=%v for a biased count vector, want < 1e-4", p)
	}
	counts[0], counts[1] = 20010, 19990
	if _, p := chiSquareP(counts); p < 0.5 {
		t.Errorf("chi-square p=%v for a near-uniform count vector, want large", p)
	}
}

// TestSampleElementUniformity: every element is drawn equally often, for the
// linear-scan path (k <= 32) and the map path (k > 32), with and without self.
func TestSampleElementUniformity(t *testing.T) {
	cases := []struct {
		name         string
		n, self, k   int
		draws        int
		seed1, seed2 uint64
	}{
		{"indices n=50 k=5", 50, -1, 5, 200000, 1, 1},
		{"others n=50 self=17 k=5", 50, 17, 5, 200000, 1, 2},
		{"indices map path n=100 k=40", 100, -1, 40, 20000, 1, 3},
		{"others map path n=120 self=0 k=60", 120, 0, 60, 15000, 1, 4},
		{"others n=11 self=10 k=9", 11, 10, 9, 50000, 1, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.seed1, tc.seed2))
			counts := make([]int, tc.n)
			var buf []int
			for range tc.draws {
				buf = SampleOthers(rng, tc.n, tc.self, tc.k, buf)
				for _, v := range buf {
					counts[v]++
				}
			}
			if tc.self >= 0 {
				if counts[tc.self] != 0 {
					t.Fatalf("self drawn %d times", counts[tc.self])
				}
				counts = slices.Delete(counts, tc.self, tc.self+1)
			}
			stat, p := elementChiSquareP(counts, tc.k)
			t.Logf("chi2=%.1f df=%d p=%.4f", stat, len(counts)-1, p)
			if p < 1e-4 {
				t.Errorf("element frequencies not uniform: chi2=%.1f df=%d p=%g; counts %v", stat, len(counts)-1, p, counts)
			}
		})
	}
}

// subsetChiSquareP draws subsets with sample and returns how many distinct
// subsets it saw and the chi-square p-value of their frequencies.
func subsetChiSquareP(draws int, sample func(buf []int) []int) (distinct int, stat, p float64) {
	freq := map[uint64]int{}
	var buf []int
	for range draws {
		buf = sample(buf)
		var mask uint64
		for _, v := range buf {
			mask |= 1 << v
		}
		freq[mask]++
	}
	counts := make([]int, 0, len(freq))
	for _, c := range freq {
		counts = append(counts, c)
	}
	stat, p = chiSquareP(counts)
	return len(freq), stat, p
}

// TestSampleSubsetUniformity: every k-subset is equally likely, not just
// every element (a sampler can have uniform marginals and still favour some
// pairs). n=35, k=33 exercises the map path: its 595 subsets are the
// complements of the 2-subsets.
func TestSampleSubsetUniformity(t *testing.T) {
	cases := []struct {
		name     string
		n, self  int
		k        int
		subsets  int
		draws    int
		rngSeeds [2]uint64
	}{
		{"n=5 k=2", 5, -1, 2, 10, 100000, [2]uint64{21, 1}},
		{"n=6 k=3", 6, -1, 3, 20, 100000, [2]uint64{21, 2}},
		{"others n=6 self=2 k=2", 6, 2, 2, 10, 100000, [2]uint64{21, 3}},
		{"map path n=35 k=33", 35, -1, 33, 595, 119000, [2]uint64{21, 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.rngSeeds[0], tc.rngSeeds[1]))
			distinct, stat, p := subsetChiSquareP(tc.draws, func(buf []int) []int {
				return SampleOthers(rng, tc.n, tc.self, tc.k, buf)
			})
			if distinct != tc.subsets {
				t.Fatalf("%d distinct subsets drawn, want all %d", distinct, tc.subsets)
			}
			t.Logf("chi2=%.1f df=%d p=%.4f", stat, distinct-1, p)
			if p < 1e-4 {
				t.Errorf("subset frequencies not uniform: chi2=%.1f df=%d p=%g", stat, distinct-1, p)
			}
		})
	}
}

// TestSubsetCheckRejectsBiasedSampler shows the subset test has teeth: linear
// probing (on a collision take the next free index) gives every element the
// same frequency, by rotational symmetry, but favours adjacent pairs.
func TestSubsetCheckRejectsBiasedSampler(t *testing.T) {
	const n, k = 5, 2
	rng := rand.New(rand.NewPCG(22, 1))
	probe := func(buf []int) []int {
		buf = buf[:0]
		for range k {
			v := rng.IntN(n)
			for slices.Contains(buf, v) {
				v = (v + 1) % n
			}
			buf = append(buf, v)
		}
		return buf
	}
	counts := make([]int, n)
	for range 100000 {
		for _, v := range probe(nil) {
			counts[v]++
		}
	}
	if _, p := elementChiSquareP(counts, k); p < 1e-4 {
		t.Fatalf("linear probing should look uniform per element, p=%g", p)
	}
	if _, stat, p := subsetChiSquareP(100000, probe); p > 1e-4 {
		t.Errorf("linear probing passed the subset test: chi2=%.1f p=%g", stat, p)
	}
}

func BenchmarkSampleOthers(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]int, 0, 10)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf = SampleOthers(rng, 10000, i%10000, 10, buf)
	}
}

func BenchmarkSampleOthersMapPath(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]int, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf = SampleOthers(rng, 10000, i%10000, 64, buf)
	}
}
