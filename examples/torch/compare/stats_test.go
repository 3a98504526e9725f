package main

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pspnode/pspnode/examples/torch/evals"
)

func TestMedianCurve(t *testing.T) {
	ev := func(pts ...float64) []evals.Eval { // time, accuracy pairs
		var out []evals.Eval
		for i := 0; i+1 < len(pts); i += 2 {
			out = append(out, evals.Eval{Time: pts[i], Accuracy: pts[i+1]})
		}
		return out
	}
	tests := []struct {
		name   string
		curves [][]evals.Eval
		want   float64 // time the median reaches 0.9
		points int
	}{
		{"one worker", [][]evals.Eval{ev(0, 0.1, 1, 0.5, 2, 0.91)}, 2, 7},
		// Four workers: the median is the upper middle one, so two must be
		// at 0.9: at 2 s one is, at 3 s two are.
		{"four workers", [][]evals.Eval{ev(0, 0.1, 2, 0.95), ev(0, 0.1, 3, 0.9), ev(0, 0.1, 4, 0.92), ev(0, 0.1)}, 3, 7},
		{"not reached", [][]evals.Eval{ev(0, 0.1, 1, 0.89)}, math.NaN(), 7},
		// Before every worker has an evaluation there is no point.
		{"late worker", [][]evals.Eval{ev(0, 0.95), ev(1.5, 0.95)}, 1.5, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			curve, got := medianCurve(tt.curves, 0.9, 3)
			if !(got == tt.want || math.IsNaN(got) && math.IsNaN(tt.want)) || len(curve) != tt.points {
				t.Errorf("reached at %v with %d points, want %v with %d", got, len(curve), tt.want, tt.points)
			}
		})
	}
}

// metricsBody is a /metrics body with the staleness histogram in two
// series (by exchange), as a daemon might serve it.
const metricsBody = `# HELP psp_update_staleness_steps Receiver's step minus sender's.
# TYPE psp_update_staleness_steps histogram
psp_update_staleness_steps_bucket{kind="a",le="0"} 2
psp_update_staleness_steps_bucket{kind="a",le="1"} 6
psp_update_staleness_steps_bucket{kind="a",le="2"} 8
psp_update_staleness_steps_bucket{kind="a",le="4"} 10
psp_update_staleness_steps_bucket{kind="a",le="+Inf"} 10
psp_update_staleness_steps_sum{kind="a"} 12
psp_update_staleness_steps_count{kind="a"} 10
psp_update_staleness_steps_bucket{kind="b",le="0"} 0
psp_update_staleness_steps_bucket{kind="b",le="1"} 0
psp_update_staleness_steps_bucket{kind="b",le="2"} 0
psp_update_staleness_steps_bucket{kind="b",le="4"} 0
psp_update_staleness_steps_bucket{kind="b",le="+Inf"} 10
psp_update_staleness_steps_sum{kind="b"} 80
psp_update_staleness_steps_count{kind="b"} 10
# HELP psp_steps_total Steps.
# TYPE psp_steps_total counter
psp_steps_total 42
`

func TestStalenessOf(t *testing.T) {
	h, ok, err := stalenessOf(metricsBody)
	if err != nil || !ok {
		t.Fatalf("stalenessOf: ok %v, %v", ok, err)
	}
	if h.count != 20 || h.sum != 92 {
		t.Errorf("count %g sum %g, want 20 and 92 (the two series added)", h.count, h.sum)
	}
	s := summarise([]hist{h, h})
	if s == nil || s.Updates != 40 || s.Mean == nil || *s.Mean != 4.6 {
		t.Fatalf("summary %+v, want 40 updates of mean 4.6", s)
	}
	// The 90th percentile falls in the +Inf bucket: the largest finite
	// bound answers, as histogram_quantile does.
	if s.P90 == nil || *s.P90 != 4 {
		t.Errorf("p90 %v, want 4", s.P90)
	}
	for _, body := range []string{"", "# TYPE psp_steps_total counter\npsp_steps_total 1\n"} {
		if _, ok, err := stalenessOf(body); ok || err != nil {
			t.Errorf("a body without the metric: ok %v, err %v; want neither", ok, err)
		}
	}
	if _, _, err := stalenessOf("psp_update_staleness_steps_bucket{le=\"1\" 3\n"); err == nil {
		t.Error("a broken body: no error")
	}
	if summarise(nil) != nil || summarise(nil).String() != "n/a" {
		t.Error("no daemon with the metric: want nil, shown n/a")
	}
}

func TestQuantile(t *testing.T) {
	h := hist{le: []float64{0, 1, 2, 4, math.Inf(1)}, cum: []float64{2, 6, 8, 10, 10}, count: 10}
	tests := []struct{ q, want float64 }{
		{0.1, 0},   // within the first bucket, whose bound is 0
		{0.4, 0.5}, // 4th of 10: halfway through (0, 1]
		{0.7, 1.5}, // 7th: halfway through (1, 2]
		{0.9, 3},   // 9th: halfway through (2, 4]
		{1, 4},
	}
	for _, tt := range tests {
		got := h.quantile(tt.q)
		if math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("quantile(%g) = %g, want %g", tt.q, got, tt.want)
		}
	}
	if !math.IsNaN((hist{}).quantile(0.5)) {
		t.Error("an empty histogram has no quantile")
	}
}

func TestSpreads(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name     string
		times    []float64
		med, max float64
		reached  int
	}{
		{"all reached", []float64{30, 10, 20}, 20, 30, 3},
		{"one not", []float64{30, nan, 20}, 30, nan, 2},
		{"most not", []float64{nan, nan, 20}, nan, nan, 1},
		{"even", []float64{10, 20}, 15, 20, 2},
	}
	same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
	for _, tt := range tests {
		s := timeSpread(tt.times)
		if !same(s.Median, tt.med) || !same(s.Max, tt.max) || s.N != tt.reached || s.Of != len(tt.times) {
			t.Errorf("%s: %+v, want median %v, max %v, %d reached", tt.name, s, tt.med, tt.max, tt.reached)
		}
	}
	s := spreadOf([]float64{3, nan, 1, 2})
	if s.Median != 2 || s.Min != 1 || s.Max != 3 || s.N != 3 {
		t.Errorf("spreadOf: %+v", s)
	}
	if got := s.format(func(v float64) string { return fmt.Sprint(v) }); got != "2 (1–3)" {
		t.Errorf("format: %q", got)
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.tiers) != 2 || len(c.models) != 1 || len(c.slows) != 2 || len(c.seeds) != 3 || len(c.systems) != 2 {
		t.Errorf("defaults: %d tiers, %d models, %d slow modes, %d seeds, %d systems; want 2, 1, 2, 3, 2",
			len(c.tiers), len(c.models), len(c.slows), len(c.seeds), len(c.systems))
	}
	if c.slowCores <= 0 {
		t.Errorf("slow cores %g, want the machine's share", c.slowCores)
	}
	c, err = parseFlags([]string{"--all", "--tiers", "lan"})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.cells()); got != len(tiers)*2*3 {
		t.Errorf("--all: %d cells, want %d (every tier, both models, three slow modes)", got, len(tiers)*2*3)
	}
	for _, bad := range [][]string{{"--tiers", "moon"}, {"--models", "gpt"}, {"--slow", "often"}, {"--seeds", "x"},
		{"--systems", ""}, {"--systems", "/gossip"}, {"--workers", "1"}, {"--target", "1"}, {"extra"},
		{"--slow-workers", "0"}, {"--slow-workers", "4"}, {"--workers", "8", "--slow-workers", "8"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for sys, want := range map[string][2]string{"ddp": {}, "default": {}, "pssp:2:4": {"pssp:2:4", ""}, "asp/gossip": {"asp", "gossip"}} {
		b, e, err := systemFlags(sys)
		if err != nil || b != want[0] || e != want[1] {
			t.Errorf("systemFlags(%q) = %q, %q, %v; want %q, %q", sys, b, e, err, want[0], want[1])
		}
	}
}

func TestLineages(t *testing.T) {
	if l := lineageOf(`{"peer_id":"x","lineage":"ab12"}`); l != "ab12" {
		t.Errorf("lineage %q", l)
	}
	if l := lineageOf(""); l != "" {
		t.Errorf("lineage of nothing %q", l)
	}
	if n := distinct([]string{"a", "", "a", "b"}); n != 2 {
		t.Errorf("distinct = %d, want 2", n)
	}
}

func TestSettingsOf(t *testing.T) {
	for body, want := range map[string]string{
		`{"barrier":"pssp:auto:4","exchange":{"exchange":"epidemic:4","models_sent":3}}`: "pssp:auto:4, epidemic:4",
		`{"barrier":"asp"}`: "asp",
		``:                  "",
	} {
		if got := settingsOf(body); got != want {
			t.Errorf("settingsOf(%q) = %q, want %q", body, got, want)
		}
	}
}

func TestCPUAt(t *testing.T) {
	curve := [][2]float64{{0.2, 0}, {1.2, 2}, {2.2, 3}}
	tests := []struct {
		at, want float64
	}{
		{0.1, 0},        // before the first sample: its value
		{0.7, 1},        // halfway between the first two
		{1.2, 2},        // on a sample
		{2.2, 3},        // the last sample
		{3, math.NaN()}, // beyond the curve: unknown
		{math.NaN(), math.NaN()},
	}
	for _, tt := range tests {
		got := cpuAt(curve, tt.at)
		if !(math.Abs(got-tt.want) < 1e-9 || math.IsNaN(got) && math.IsNaN(tt.want)) {
			t.Errorf("cpuAt(%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
	if got := cpuAt(nil, 1); !math.IsNaN(got) {
		t.Errorf("cpuAt(nil) = %v, want NaN", got)
	}
}

// The figures from the launch: the last worker's first step, and the
// target's time after the go signal plus the go signal's after the launch.
func TestFromLaunch(t *testing.T) {
	launched := time.Unix(1000, 0)
	start := launched.Add(7 * time.Second)
	tests := []struct {
		name          string
		firstSteps    []float64 // Unix
		toTarget      float64   // after the go signal
		first, target float64
	}{
		{"every worker stepped", []float64{1007.1, 1007.3, 1007.2}, 12, 7.3, 19},
		{"one never stepped", []float64{1007.1, 0}, 12, math.NaN(), 19},
		{"the target not reached", []float64{1007.1}, math.NaN(), 7.1, math.NaN()},
	}
	for _, tt := range tests {
		var ws []*worker
		for _, f := range tt.firstSteps {
			ws = append(ws, &worker{firstStep: f})
		}
		first, target := fromLaunch(launched, start, ws, tt.toTarget)
		same := func(a, b float64) bool { return (math.IsNaN(a) && math.IsNaN(b)) || math.Abs(a-b) < 1e-6 }
		if !same(first, tt.first) || !same(target, tt.target) {
			t.Errorf("%s: first step %v, target %v; want %v, %v", tt.name, first, target, tt.first, tt.target)
		}
	}
}

// Which workers a slow mode slows: worker 0 (the evaluator) never; one
// slow worker of seeds 1–3 at 4 workers is worker (seed mod 4), as it was
// before --slow-workers.
func TestSlowSet(t *testing.T) {
	tests := []struct {
		workers, slowN int
		mode           string
		seed           int
		want           []int
	}{
		{4, 1, slowNone, 1, nil},
		{4, 1, slowSleep, 1, []int{1}},
		{4, 1, slowSleep, 2, []int{2}},
		{4, 1, slowCPU, 3, []int{3}},
		{4, 1, slowSleep, 4, []int{1}}, // seed mod 4 would be worker 0
		{4, 1, slowSleep, 0, []int{3}},
		{8, 2, slowSleep, 1, []int{1, 2}},
		{8, 2, slowSleep, 3, []int{3, 4}},
		{8, 2, slowSleep, 7, []int{7, 1}}, // wraps round past worker 0
		{4, 3, slowCPU, 2, []int{2, 3, 1}},
	}
	for _, tt := range tests {
		c := &config{workers: tt.workers, slowN: tt.slowN}
		if got := c.slowSet(tt.mode, tt.seed); !slices.Equal(got, tt.want) {
			t.Errorf("%d workers, %d slow, %s, seed %d: %v, want %v", tt.workers, tt.slowN, tt.mode, tt.seed, got, tt.want)
		}
	}
}

// --resume reuses a saved run only if it slowed the workers this
// invocation would: a run saved with one slow worker is not reused for
// two, nor one that slowed another worker.
func TestSavedSlowWorkers(t *testing.T) {
	lan, _ := tierNamed("lan")
	cl := cell{Tier: lan, Model: modelSpec{Name: "mlp", LR: 0.2}, Slow: slowSleep}
	c, err := parseFlags([]string{"--out", t.TempDir(), "--workers", "8", "--resume"})
	if err != nil {
		t.Fatal(err)
	}
	c.slowN = 2
	save := func(slow []int) {
		r := run{Tier: "lan", Model: "mlp", Slow: slowSleep, System: "ddp", Seed: 1, SlowWorker: slow[0],
			TimeToTarget: 12, SlowStepsPerS: math.NaN(), CPUToTarget: math.NaN()}
		if len(slow) > 1 {
			r.SlowWorkers = slow
		}
		c.save(r)
	}
	save([]int{1, 2})
	if r, ok := c.saved(cl, "ddp", 1); !ok || r.TimeToTarget != 12 || !slices.Equal(r.slowSet(), []int{1, 2}) {
		t.Fatalf("the same slow workers: reused %v, %+v", ok, r.slowSet())
	}
	save([]int{2, 3})
	if _, ok := c.saved(cl, "ddp", 1); ok {
		t.Error("a run that slowed workers 2 and 3 was reused for 1 and 2")
	}
	save([]int{1, 2})
	c.slowN = 1 // worker 1 is slowed under either, but the settings differ
	if _, ok := c.saved(cl, "ddp", 1); ok {
		t.Error("a run of two slow workers was reused for one")
	}
}
