package report

import (
	"math"
	"testing"
)

func TestCost(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		nodes                int
		durationS, timeScale float64
		cpuS                 float64
		rss                  int64
		wantRate, wantRSS    float64
	}{
		// 200 nodes for 100 paper seconds on 324 CPU-seconds: the figure
		// the cost work starts from.
		{"paper time", 200, 100, 1, 324, 2 << 30, 200 * 100 / 324.0, float64(2<<30) / 200},
		// At time scale 0.05, 10 s of training are 200 paper seconds.
		{"scaled", 100, 10, 0.05, 50, 1 << 30, 100 * 200 / 50.0, float64(1<<30) / 100},
		// The real clock with no time scale has no paper seconds.
		{"no scale", 10, 10, 0, 5, 1 << 20, 0, float64(1<<20) / 10},
		{"no cpu", 10, 10, 1, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Result{Nodes: tc.nodes, DurationS: tc.durationS, TimeScale: tc.timeScale, CPUS: tc.cpuS, PeakRSSBytes: tc.rss}
			r.Connections.HeldMean, r.Connections.OpenedPerNodeMin = 12.5, 3
			r.FillCost()
			c := r.Cost
			if math.Abs(c.PaperNodeSPerCPUS-tc.wantRate) > 1e-9 || math.Abs(c.RSSBytesPerNode-tc.wantRSS) > 1e-9 {
				t.Errorf("rate %v (want %v), rss per node %v (want %v)", c.PaperNodeSPerCPUS, tc.wantRate, c.RSSBytesPerNode, tc.wantRSS)
			}
			if c.CPUS != tc.cpuS || c.ConnectionsHeldPerNode != 12.5 || c.ConnectionsOpenedPerNode != 3 {
				t.Errorf("cost %+v", *c)
			}
		})
	}
}
