package main

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
)

const waitBody = `# TYPE psp_barrier_wait_seconds histogram
psp_barrier_wait_seconds_bucket{le="0.1"} 3
psp_barrier_wait_seconds_bucket{le="+Inf"} 4
psp_barrier_wait_seconds_sum %g
psp_barrier_wait_seconds_count 4
`

func TestMetricSum(t *testing.T) {
	tests := []struct {
		name, body string
		sum        float64
		ok         bool
	}{
		{"a histogram", fmt.Sprintf(waitBody, 1.5), 1.5, true},
		{"no such family", metricsBody, 0, false},
		{"nothing", "", 0, false},
		{"a counter of that name", "# TYPE psp_barrier_wait_seconds counter\npsp_barrier_wait_seconds 3\n", 0, false},
	}
	for _, tt := range tests {
		sum, ok, err := metricSum(tt.body, waitMetric)
		if err != nil || ok != tt.ok || sum != tt.sum {
			t.Errorf("%s: %g, %v, %v; want %g, %v", tt.name, sum, ok, err, tt.sum, tt.ok)
		}
	}
	if _, _, err := metricSum("psp_barrier_wait_seconds_sum{", waitMetric); err == nil {
		t.Error("a malformed body: no error")
	}
}

// The fast workers' share of their training time at the barrier, apart
// from the slow ones', from the files kept beside a run's record.
func TestWaitShares(t *testing.T) {
	c, err := parseFlags([]string{"--out", t.TempDir(), "--workers", "4", "--slow-workers", "2"})
	if err != nil {
		t.Fatal(err)
	}
	r := run{Tier: "lan", Model: "mlp", Slow: slowSleep, System: "default", Seed: 1, SlowWorker: 1, SlowWorkers: []int{1, 2}}
	cl := cell{Tier: mustTier("lan"), Model: c.model("mlp"), Slow: slowSleep}
	base := strings.TrimSuffix(c.savedPath(cl, r.System, r.Seed), ".json")
	if err := os.MkdirAll(base[:strings.LastIndex(base, "/")], 0o755); err != nil {
		t.Fatal(err)
	}
	// Worker i waited i+1 s of 10 s; worker 3 kept no metrics.
	for i := range 4 {
		if i < 3 {
			if err := os.WriteFile(fmt.Sprintf("%s.d%d.metrics", base, i), fmt.Appendf(nil, waitBody, float64(i+1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(fmt.Sprintf("%s.w%d.json", base, i), []byte(`{"steps": 50, "elapsed_s": 10}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fast, slow := c.waitShares(r)
	if math.Abs(fast-0.1) > 1e-9 || math.Abs(slow-0.25) > 1e-9 {
		t.Errorf("fast %g, slow %g; want 0.1 (worker 0 alone) and 0.25 (workers 1 and 2)", fast, slow)
	}
	r.System = "ddp"
	if fast, slow := c.waitShares(r); !math.IsNaN(fast) || !math.IsNaN(slow) {
		t.Errorf("DDP: %g, %g; want NaN", fast, slow)
	}
}
