package promhist_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/pspnode/pspnode/internal/promhist"
)

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	le := []float64{0, 1, 2, 4, inf}
	cum := []float64{2, 6, 8, 10, 10}
	tests := []struct {
		name    string
		le, cum []float64
		q, want float64
	}{
		{"in the zero bucket", le, cum, 0.1, 0},
		{"linear in (0, 1]", le, cum, 0.4, 0.5},
		{"at a bucket's top", le, cum, 0.6, 1},
		{"linear in (2, 4]", le, cum, 0.9, 3},
		{"the top", le, cum, 1, 4},
		{"in +Inf: the largest finite bound", []float64{1, 2, inf}, []float64{1, 2, 10}, 0.9, 2},
		{"the first bucket from 0", []float64{10, inf}, []float64{4, 4}, 0.5, 5},
		{"empty", le, []float64{0, 0, 0, 0, 0}, 0.5, math.NaN()},
		{"no buckets", nil, nil, 0.5, math.NaN()},
		{"lengths differ", le, cum[:2], 0.5, math.NaN()},
		{"only +Inf", []float64{inf}, []float64{3}, 0.5, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := promhist.Quantile(tt.le, tt.cum, tt.q)
			if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && math.Abs(got-tt.want) > 1e-12) {
				t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func ExampleQuantile() {
	// Ten updates: 2 applied 0 steps stale, 4 more within 1 step, 2 more
	// within 2, 2 more within 4.
	le := []float64{0, 1, 2, 4, math.Inf(1)}
	cum := []float64{2, 6, 8, 10, 10}
	fmt.Println(promhist.Quantile(le, cum, 0.5), promhist.Quantile(le, cum, 0.9))
	// Output: 0.75 3
}
