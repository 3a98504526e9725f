package psp

import (
	"errors"
	"math"
	"testing"
)

func approx(got, want, rel float64) bool {
	return math.Abs(got-want) <= rel*math.Max(1, math.Abs(want))
}

func TestBoundHandComputed(t *testing.T) {
	tests := []struct {
		name              string
		F                 float64
		beta, r, T        int
		a, s, mean, varnc float64
	}{
		// a = 0.5; a^(T-r+1) = 0.5^9997 ≈ 0.
		// S = 0.5 / (0.5·0.5 + 0.5) = 2/3.
		// mean = 2/3 · (4·5/2 + 0.5·6/0.25) = 2/3 · (10 + 12) = 44/3.
		// var  = 2/3 · (4·5·9/6 + 0.5·20/0.125) = 2/3 · (30 + 80) = 220/3.
		{"chapter r=4", 0.5, 1, 4, 10000, 0.5, 2.0 / 3, 44.0 / 3, 220.0 / 3},
		// r = 0: only the a-terms remain. a = 0.5, a^101 ≈ 0, S = 2/3.
		// mean = 2/3 · 0.5·2/0.25 = 2/3 · 4 = 8/3.
		// var  = 2/3 · 0.5·4/0.125 = 2/3 · 16 = 32/3.
		{"r=0", 0.5, 1, 0, 100, 0.5, 2.0 / 3, 8.0 / 3, 32.0 / 3},
		// Small T, so a^(T-r+1) matters: F = 0.8, β = 2, r = 1, T = 3.
		// a = 0.64, a^3 = 0.262144, F(1-a) = 0.8·0.36 = 0.288.
		// S = 0.36 / (0.288 + 0.64 - 0.262144) = 0.36/0.665856 = 0.5406574394…
		// mean = S · (1 + 0.64·3/0.36²)   = S · (1 + 1.92/0.1296)     = S · 15.8148148… = 8.5503972…
		// var  = S · (1 + 0.64·5/0.36³)   = S · (1 + 3.2/0.046656)    = S · 69.5871056… = 37.6227863…
		{"small T", 0.8, 2, 1, 3, 0.64, 0.36 / 0.665856, 0.36 / 0.665856 * (1 + 1.92/0.1296), 0.36 / 0.665856 * (1 + 3.2/0.046656)},
		// Smallest T = r+1: a^(T-r+1) = a² = 0.25 cancels F(1-a) = 0.25,
		// so S = 0.5/0.5 = 1: mean = 10 + 12 = 22, var = 30 + 80 = 110.
		{"T=r+1", 0.5, 1, 4, 5, 0.5, 1, 22, 110},
		// β large: a = 0.5^2000 underflows to 0, S = 1/F = 2,
		// mean = 2 · 10 = 20, var = 2 · 30 = 60.
		{"a underflows", 0.5, 2000, 4, 10000, 0, 2, 20, 60},
		// F = 0.9, β = 3, r = 2, T = 50: a = 0.729, a^49 ≈ 1.8e-7 (kept).
		// S = 0.271 / (0.9·0.271 + 0.729 - 0.729^49).
		{"F=0.9 β=3 r=2", 0.9, 3, 2, 50, 0.729,
			0.271 / (0.2439 + 0.729 - math.Pow(0.729, 49)),
			0.271 / (0.2439 + 0.729 - math.Pow(0.729, 49)) * (3 + 0.729*4/(0.271*0.271)),
			0.271 / (0.2439 + 0.729 - math.Pow(0.729, 49)) * (5 + 0.729*8/(0.271*0.271*0.271))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Bound(tt.F, tt.beta, tt.r, tt.T)
			if err != nil {
				t.Fatal(err)
			}
			if !approx(got.A, tt.a, 1e-12) || !approx(got.S, tt.s, 1e-12) ||
				!approx(got.Mean, tt.mean, 1e-12) || !approx(got.Variance, tt.varnc, 1e-12) {
				t.Errorf("Bound(%v, %d, %d, %d) = %+v, want A=%v S=%v Mean=%v Variance=%v",
					tt.F, tt.beta, tt.r, tt.T, got, tt.a, tt.s, tt.mean, tt.varnc)
			}
		})
	}
	// The decimal values quoted above, as a guard against a typo in the
	// expressions.
	got, _ := Bound(0.5, 1, 4, 10000)
	if math.Round(got.Mean*1e4) != 146667 || math.Round(got.Variance*1e4) != 733333 {
		t.Errorf("chapter case: mean %.4f var %.4f, want 14.6667 and 73.3333", got.Mean, got.Variance)
	}
	got, _ = Bound(0.8, 2, 1, 3)
	if math.Round(got.Mean*1e4) != 85504 || math.Round(got.Variance*1e4) != 376228 {
		t.Errorf("small T case: mean %.4f var %.4f, want 8.5504 and 37.6228", got.Mean, got.Variance)
	}
}

// TestBoundMonotoneInBeta: with F(r) close to 1 (the regime the chapter's
// plot shows, where the bound is loose at β = 1) sampling more peers gives
// tighter bounds at every β from 1 to 100.
//
// This is not true for every F: as β → ∞, a → 0 and S → 1/F, so the mean
// bound tends to r(r+1)/(2F), which for F = 0.5, r = 4 is 20, above its
// value 14.67 at β = 1. TestBoundLargeBetaLimit checks the limit for all F.
func TestBoundMonotoneInBeta(t *testing.T) {
	cases := []struct {
		F    float64
		r, T int
	}{
		{0.99, 4, 10000},
		{0.999, 1, 10000},
		{0.999, 4, 10000},
		{0.999, 8, 10000},
		{0.97, 1, 10000},
	}
	for _, c := range cases {
		prev, err := Bound(c.F, 1, c.r, c.T)
		if err != nil {
			t.Fatal(err)
		}
		for beta := 2; beta <= 100; beta++ {
			b, err := Bound(c.F, beta, c.r, c.T)
			if err != nil {
				t.Fatal(err)
			}
			if !(b.Mean < prev.Mean) || !(b.Variance < prev.Variance) {
				t.Errorf("F=%v r=%d: β=%d mean %v var %v, not below β=%d's %v %v",
					c.F, c.r, beta, b.Mean, b.Variance, beta-1, prev.Mean, prev.Variance)
			}
			if !(b.A < prev.A) {
				t.Errorf("F=%v: a not decreasing in β", c.F)
			}
			prev = b
		}
	}
	// The chapter's sweep, β = 1, 2, 4, …, 64, 100 at F = 0.99, r = 4.
	prev := math.Inf(1)
	for _, beta := range []int{1, 2, 4, 8, 16, 32, 64, 100} {
		b, _ := Bound(0.99, beta, 4, 10000)
		if !(b.Mean < prev) {
			t.Errorf("β=%d: mean %v not below %v", beta, b.Mean, prev)
		}
		prev = b.Mean
	}
}

func TestBoundLargeBetaLimit(t *testing.T) {
	for _, F := range []float64{0.1, 0.5, 0.9, 0.99} {
		for _, r := range []int{0, 1, 4, 10} {
			b, err := Bound(F, 100000, r, 10000)
			if err != nil {
				t.Fatal(err)
			}
			rf := float64(r)
			if !approx(b.S, 1/F, 1e-9) ||
				!approx(b.Mean, rf*(rf+1)/(2*F), 1e-9) ||
				!approx(b.Variance, rf*(rf+1)*(2*rf+1)/(6*F), 1e-9) {
				t.Errorf("F=%v r=%d β=1e5: %+v, want S=1/F, mean=r(r+1)/(2F), var=r(r+1)(2r+1)/(6F)", F, r, b)
			}
		}
	}
	// Approaching the limit: for F=0.99, r=4 the gap to r(r+1)/(2F) shrinks
	// from β=100 to β=1000 to β=5000.
	limit := 10 / 0.99
	prevGap := math.Inf(1)
	for _, beta := range []int{100, 1000, 5000} {
		b, _ := Bound(0.99, beta, 4, 10000)
		gap := math.Abs(b.Mean - limit)
		if !(gap < prevGap) {
			t.Errorf("β=%d: |mean-limit| = %v, not below %v", beta, gap, prevGap)
		}
		prevGap = gap
	}
	if prevGap > 1e-9 {
		t.Errorf("β=5000: mean %v differs from the limit %v by %v", limit+prevGap, limit, prevGap)
	}
}

func TestBoundInvalid(t *testing.T) {
	tests := []struct {
		F          float64
		beta, r, T int
	}{
		{0, 1, 4, 10000},
		{1, 1, 4, 10000},
		{-0.5, 1, 4, 10000},
		{1.5, 1, 4, 10000},
		{math.NaN(), 1, 4, 10000},
		{math.Inf(1), 1, 4, 10000},
		{math.Inf(-1), 1, 4, 10000},
		{0.5, 0, 4, 10000},
		{0.5, -3, 4, 10000},
		{0.5, 1, -1, 10000},
		{0.5, 1, 4, 4},
		{0.5, 1, 4, 3},
		{0.5, 1, 0, 0},
	}
	for _, tt := range tests {
		b, err := Bound(tt.F, tt.beta, tt.r, tt.T)
		if !errors.Is(err, ErrBound) {
			t.Errorf("Bound(%v, %d, %d, %d) = %+v, %v; want an ErrBound error", tt.F, tt.beta, tt.r, tt.T, b, err)
		}
		if b != (BoundResult{}) {
			t.Errorf("Bound(%v, %d, %d, %d) returned %+v with its error", tt.F, tt.beta, tt.r, tt.T, b)
		}
	}
}

// TestBoundFinite: over the valid domain the bound is finite and positive
// and the mean bound is at least S·r(r+1)/2.
func TestBoundFinite(t *testing.T) {
	for _, F := range []float64{1e-9, 0.01, 0.3, 0.5, 0.9, 0.999999} {
		for _, beta := range []int{1, 2, 10, 100, MaxBeta} {
			for _, rt := range [][2]int{{0, 1}, {0, 10000}, {4, 5}, {4, 10000}, {50, 51}, {50, 1 << 30}} {
				r, T := rt[0], rt[1]
				b, err := Bound(F, beta, r, T)
				if err != nil {
					t.Fatalf("Bound(%v, %d, %d, %d): %v", F, beta, r, T, err)
				}
				rf := float64(r)
				for _, v := range []float64{b.A, b.S, b.Mean, b.Variance} {
					if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
						t.Fatalf("Bound(%v, %d, %d, %d) = %+v: not finite and non-negative", F, beta, r, T, b)
					}
				}
				if b.S <= 0 || b.Mean < b.S*rf*(rf+1)/2*(1-1e-12) {
					t.Fatalf("Bound(%v, %d, %d, %d) = %+v: mean below S·r(r+1)/2", F, beta, r, T, b)
				}
			}
		}
	}
}
