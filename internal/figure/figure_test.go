package figure

import (
	"math"
	"testing"
)

func TestDistribution(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		// maxPoints bounds the outline; share is the height of the bin of
		// the first value.
		maxPoints int
		share     float64
	}{
		{"unit bins", []float64{3, 4, 4, 6}, 6, 0.25},
		{"one far value", []float64{100, 101, 102, float64(1 << 62)}, 2*maxDistBins + 4, 0.75},
		{"one value", []float64{7}, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Distribution("d", tc.values)
			if len(s.X) != len(s.Y) || len(s.X) > tc.maxPoints {
				t.Fatalf("%d x, %d y points, want equal and at most %d", len(s.X), len(s.Y), tc.maxPoints)
			}
			if s.Y[1] != tc.share || s.X[1] != tc.values[0] {
				t.Errorf("first bin at %v of share %v, want %v of %v", s.X[1], s.Y[1], tc.values[0], tc.share)
			}
			total := 0.0
			for _, y := range s.Y {
				total += y
			}
			if math.Abs(total-1) > 1e-9 {
				t.Errorf("shares sum to %v", total)
			}
		})
	}
}
