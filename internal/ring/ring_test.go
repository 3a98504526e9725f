package ring

import (
	"slices"
	"testing"
)

// A ring keeps the last n values, oldest first, and holds no more than it
// has been given.
func TestRing(t *testing.T) {
	for _, tc := range []struct {
		max, adds int
		want      []float64
	}{
		{4, 0, []float64{}},
		{4, 3, []float64{0, 1, 2}},
		{4, 4, []float64{0, 1, 2, 3}},
		{4, 6, []float64{2, 3, 4, 5}},
		{4, 9, []float64{5, 6, 7, 8}},
	} {
		r := New(tc.max)
		for i := range tc.adds {
			r.Add(float64(i))
		}
		if got := r.Values(); !slices.Equal(got, tc.want) {
			t.Errorf("max %d, %d adds: values %v, want %v", tc.max, tc.adds, got, tc.want)
		}
		if len(r.buf) > tc.adds {
			t.Errorf("max %d, %d adds: holds %d", tc.max, tc.adds, len(r.buf))
		}
	}
}
