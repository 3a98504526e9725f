package overlay

import (
	"testing"
	"time"
)

func TestForSharedMachine(t *testing.T) {
	base := DefaultConfig()
	for _, tc := range []struct {
		nodes int
		want  float64 // stretch of the background periods
	}{
		{1, 1}, {50, 1}, {200, 1}, {500, 1}, {1000, 2}, {2000, 4},
	} {
		c := base.ForSharedMachine(tc.nodes)
		for name, got := range map[string][2]time.Duration{
			"WalkInterval":    {c.WalkInterval, base.WalkInterval},
			"RotateInterval":  {c.RotateInterval, base.RotateInterval},
			"RefreshInterval": {c.RefreshInterval, base.RefreshInterval},
			"DegreeRefresh":   {c.DegreeRefresh, base.DegreeRefresh},
		} {
			if want := time.Duration(tc.want * float64(got[1])); got[0] != want {
				t.Errorf("%d nodes: %s = %v, want %v", tc.nodes, name, got[0], want)
			}
		}
		// The estimate window follows changes of N, so it is not stretched
		// with the walks: it holds MinLookups+1 of them, and never shrinks
		// below the default.
		if want := max(base.EstimateWindow, time.Duration(base.MinLookups+1)*c.WalkInterval); c.EstimateWindow != want {
			t.Errorf("%d nodes: EstimateWindow = %v, want %v", tc.nodes, c.EstimateWindow, want)
		}
		if c.EstimateWindow > base.EstimateWindow && c.EstimateWindow >= time.Duration(tc.want*float64(base.EstimateWindow)) {
			t.Errorf("%d nodes: EstimateWindow %v stretched with the walks", tc.nodes, c.EstimateWindow)
		}
		// What bounds a single operation is not stretched.
		if c.QueryTimeout != base.QueryTimeout || c.ProbeTimeout != base.ProbeTimeout || c.PoolSize != base.PoolSize {
			t.Errorf("%d nodes: timeouts or pool size changed", tc.nodes)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%d nodes: %v", tc.nodes, err)
		}
	}
}
