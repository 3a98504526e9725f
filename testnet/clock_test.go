package testnet

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// tinyConfig is a fast virtual-clock testnet for the clock and churn tests.
func tinyConfig(nodes int, d time.Duration) plan.Config {
	cfg := plan.DefaultConfig()
	cfg.Nodes, cfg.Duration = nodes, d
	cfg.Model = "none"
	cfg.TimeScale = 0.25
	cfg.Barrier = psp.MustParse("pssp:4:2")
	cfg.StallWindow = 5 * time.Second
	return cfg
}

// The virtual clock outside a bubble is refused, not silently run on the
// machine's clock.
func TestVirtualNeedsBubble(t *testing.T) {
	_, err := Run(context.Background(), tinyConfig(4, time.Second))
	if err == nil || !strings.Contains(err.Error(), "synctest bubble") {
		t.Fatalf("virtual clock outside a bubble: err %v, want one that names the bubble", err)
	}
}

// Leaves and joins are independent Poisson processes: every event starts
// at the time the seed's schedule gives it, even while slow joins (100 ms
// links make a join take many round trips) are still under way. With the
// old loop, which waited for each join, later events ran late and then in
// a burst.
func TestChurnOnSchedule(t *testing.T) {
	cfg := tinyConfig(24, 30*time.Second)
	cfg.Churn = 1 // 24 leaves and 24 joins a minute
	cfg.ChurnMode = sim.Crash
	cfg.Latency = plan.Latency{Min: 100 * time.Millisecond, Max: 100 * time.Millisecond}
	res := runLogged(t, cfg)
	// The schedule: cumulative Exp draws from each process's own stream.
	rate := cfg.Churn * float64(cfg.Nodes) / 60
	schedule := func(stream uint64) []float64 {
		rng := rand.New(rand.NewPCG(cfg.Seed, stream))
		var out []float64
		for at := rng.ExpFloat64() / rate; at < cfg.Duration.Seconds(); at += rng.ExpFloat64() / rate {
			out = append(out, at)
		}
		return out
	}
	got := map[plan.Action][]float64{}
	for _, c := range res.Rows.Churn {
		got[plan.Action(c.Kind)] = append(got[plan.Action(c.Kind)], c.T)
	}
	for _, tc := range []struct {
		kind   plan.Action
		stream uint64
	}{{plan.Crash, 0x1ea7e}, {plan.Join, 0x701}} {
		want := schedule(tc.stream)
		if len(want) < 5 {
			t.Fatalf("the seed schedules only %d %s events: pick another", len(want), tc.kind)
		}
		if len(got[tc.kind]) != len(want) {
			t.Errorf("%d %s events, the schedule has %d", len(got[tc.kind]), tc.kind, len(want))
			continue
		}
		for i, at := range want {
			if d := got[tc.kind][i] - at; math.Abs(d) > 1e-6 {
				t.Errorf("%s %d began at %.3f s, scheduled at %.3f s", tc.kind, i, got[tc.kind][i], at)
			}
		}
	}
	if res.JoinS == nil || !(res.JoinS.P50 > 0.2) {
		t.Errorf("join times %+v: over 100 ms links a join takes several round trips", res.JoinS)
	}
	if res.Joined == 0 || res.Crashed != len(schedule(0x1ea7e)) || res.StalledNodes != 0 {
		t.Errorf("joined %d, crashed %d, stalled %d", res.Joined, res.Crashed, res.StalledNodes)
	}
}

// With ChurnReplace each departure brings a fresh node in once the leaver
// has gone, on the departures' schedule, and no join comes otherwise: the
// population holds.
func TestChurnReplaceHoldsPopulation(t *testing.T) {
	cfg := tinyConfig(24, 30*time.Second)
	cfg.Churn, cfg.ChurnMode, cfg.ChurnReplace = 1, sim.Mixed, true
	res := runLogged(t, cfg)
	gone := res.Left + res.Crashed
	if gone < 10 {
		t.Fatalf("only %d departures in 30 s at 24 a minute", gone)
	}
	// The last departure's join may still be under way at the end.
	if res.Joined < gone-1 || res.Joined > gone || res.LiveNodes < cfg.Nodes-1 {
		t.Errorf("%d departures, %d joins, %d live of %d: the population did not hold", gone, res.Joined, res.LiveNodes, cfg.Nodes)
	}
	// Every join follows a departure: at no time are more nodes in than
	// at the start.
	live := cfg.Nodes
	for _, c := range res.Rows.Churn {
		if plan.Action(c.Kind) == plan.Join {
			live++
		} else {
			live--
		}
		if live > cfg.Nodes {
			t.Fatalf("at %.2f s %d nodes were in, above the %d the run started with", c.T, live, cfg.Nodes)
		}
	}
}

// Links take virtual time and nothing else does: with 50 ms one way, a step
// query's round trip is 100 ms of virtual time, however busy the machine.
func TestLinkLatencyOnVirtualClock(t *testing.T) {
	cfg := tinyConfig(8, 10*time.Second)
	cfg.Latency = plan.Latency{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}
	res := runLogged(t, cfg)
	if rtt := res.SampleRTTMs.P50; rtt < 100 || rtt > 101 {
		t.Errorf("step query round trip p50 %.2f ms of virtual time, want 100 ms (two 50 ms links)", rtt)
	}
	if res.Steps.Min < 10 {
		t.Errorf("steps %+v", res.Steps)
	}
}

func TestOverloadJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    report.Overload
		want bool
	}{
		{"light", report.Overload{TimerLagP95Ms: 2, TimerLagP99Ms: 2, StepTimeS: 2}, false},
		{"timers just within", report.Overload{TimerLagP95Ms: 99, TimerLagP99Ms: 99, StepTimeS: 2}, false},
		{"timers late", report.Overload{TimerLagP95Ms: 120, TimerLagP99Ms: 120, StepTimeS: 2}, true},
		{"late only now and then", report.Overload{TimerLagP95Ms: 2, TimerLagP99Ms: 300, StepTimeS: 2}, false},
		{"fast steps are stricter", report.Overload{TimerLagP95Ms: 30, TimerLagP99Ms: 30, StepTimeS: 0.4}, true},
		{"churn behind", report.Overload{TimerLagP95Ms: 1, TimerLagP99Ms: 1, ChurnLagS: 3, StepTimeS: 2}, true},
		{"no step time", report.Overload{TimerLagP95Ms: 500, TimerLagP99Ms: 500}, false},
	} {
		o := tc.o
		o.Judge()
		if o.Flagged != tc.want || (o.Flagged != (o.Reason != "")) {
			t.Errorf("%s: flagged %v (reason %q), want %v", tc.name, o.Flagged, o.Reason, tc.want)
		}
	}
}

// The probe keeps a bounded number of samples spread over the whole run.
func TestLagProbeBounded(t *testing.T) {
	var p lagProbe
	n := 3*maxProbes + 7
	for i := range n {
		p.note(float64(i))
	}
	s := p.sorted()
	if len(s) > maxProbes || len(s) < maxProbes/2 {
		t.Fatalf("%d samples kept of %d, want between %d and %d", len(s), n, maxProbes/2, maxProbes)
	}
	if s[0] > float64(n)/100 || s[len(s)-1] < 0.9*float64(n) {
		t.Errorf("samples span [%v, %v] of [0, %d): not spread over the run", s[0], s[len(s)-1], n)
	}
}

// A real-clock run measures its own overload figures.
func TestRealClockReportsOverload(t *testing.T) {
	cfg := tinyConfig(6, 3*time.Second)
	cfg.Clock = plan.Real
	cfg.TimeScale = 0.5
	res := runLogged(t, cfg)
	o := res.Overload
	if o == nil {
		t.Fatal("no overload figures on the real clock")
	}
	if !(o.TimerLagP50Ms >= 0 && o.TimerLagP95Ms >= o.TimerLagP50Ms && o.TimerLagP99Ms >= o.TimerLagP95Ms && o.CPUShare > 0 && o.StepTimeS == 1) {
		t.Errorf("overload figures %+v", o)
	}
	if res.Clock != "real" || res.WallS <= 0 {
		t.Errorf("clock %q, wall %v s", res.Clock, res.WallS)
	}
}

// spin keeps every processor of the process busy until the deadline with
// n goroutines that compute without ever blocking (the scheduler preempts
// each every 10 ms or so and puts it back in the global run queue). Each
// stops by itself at the deadline: a timer to stop them would need a
// goroutine to run. wait waits for them.
func spin(n int, deadline time.Time) (wait func()) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for time.Now().Before(deadline) {
			}
		})
	}
	return wg.Wait
}

// The probe sees goroutines wait for a processor, not only its timer: 512
// spinning goroutines per processor leave a timer's goroutine to run at
// once (the scheduler serves it first), but a goroutine that yields, as
// the nodes' goroutines do whenever they wait for a message or a lock,
// waits behind all of them, seconds. The probe used to time its timer
// alone and read tens of milliseconds.
func TestLagProbeSeesRunQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var p lagProbe
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx, time.Now(), func() { close(started) })
	}()
	<-started
	wait := spin(512*runtime.GOMAXPROCS(0), time.Now().Add(3*time.Second))
	wait()
	// The probe runs at the latest once the spinners have stopped; give
	// it a few periods more, then stop it.
	for p.count() < 3 {
		runtime.Gosched()
	}
	cancel()
	<-done
	lags := p.sorted()
	p99 := sim.Percentile(lags, 99)
	t.Logf("%d samples, p50 %.1f ms, p99 %.1f ms", len(lags), 1000*sim.Percentile(lags, 50), 1000*p99)
	if p99 < 1 {
		t.Errorf("probe lag p99 %.3f s under 3 s of spinning goroutines, want over 1 s", p99)
	}
}

// The probe counts from the training's start, not from when its goroutine
// first ran: on an overloaded machine a goroutine just started waits for
// its first instruction as long as any, and a probe started after the
// nodes of a 200-node run took no sample in 44 s.
func TestLagProbeCountsLateStart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var p lagProbe
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx, time.Now().Add(-time.Second), func() {}) // first ran 1 s late
	}()
	for p.count() == 0 {
		runtime.Gosched()
	}
	cancel()
	<-done
	lags := p.sorted()
	if n := len(lags); n < 90 || lags[n-1] < 0.99 {
		t.Errorf("%d samples up to %.3f s for a probe that started 1 s late: want the 100 periods it missed, up to 1 s", n, lags[n-1])
	}
}

// A real-clock run flags itself when something else keeps the process's
// processors busy, and an unloaded one does not. The load is 512 spinning
// goroutines per processor from the first record of the training (1 s in)
// for 4 s: a goroutine that yields then waits about 512 × 10 ms for a
// processor, so that the probe runs seconds late for most of the 7-s
// training, several times the flag's threshold at p95, 1 s (5 % of a 20-s
// mean step, long so that the hiccups of a machine shared with other work
// stay far below it). (Started before the training, the load held up the
// run itself until it ended.)
func TestOverloadFlag(t *testing.T) {
	spinners := 512 * runtime.GOMAXPROCS(0)
	run := func(load bool) *report.Result {
		cfg := tinyConfig(8, 7*time.Second)
		cfg.Clock = plan.Real
		cfg.TimeScale = 10 // a 20-s mean step: the threshold is 1 s
		wait := func() {}
		if load {
			var once sync.Once
			cfg.Progress = func(report.Snapshot) {
				once.Do(func() { wait = spin(spinners, time.Now().Add(4*time.Second)) })
			}
		}
		res := runLogged(t, cfg)
		wait()
		if res.Overload == nil {
			t.Fatal("no overload figures on the real clock")
		}
		return res
	}
	if o := run(false).Overload; o.Flagged {
		t.Errorf("unloaded run flagged: %+v", *o)
	}
	o := run(true).Overload
	if !o.Flagged || o.TimerLagP95Ms < 1000*report.OverloadLagShare*o.StepTimeS {
		t.Errorf("run under %d spinning goroutines not flagged: %+v", spinners, *o)
	}
}

// On the virtual clock nothing reports overload, and the run still knows
// its wall time when given a wall clock.
func TestVirtualClockWall(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		cfg := tinyConfig(4, 5*time.Second)
		calls := 0
		cfg.WallClock = func() time.Duration { calls++; return time.Duration(calls) * time.Millisecond }
		res, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Overload != nil || res.Clock != "virtual" || res.DurationS != 5 || !(res.WallS > 0) || !(res.VirtualPerWall > 0) {
			t.Errorf("virtual run: clock %q, duration %v, wall %v, speed %v, overload %+v", res.Clock, res.DurationS, res.WallS, res.VirtualPerWall, res.Overload)
		}
	})
}

func TestParseLatency(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want plan.Latency
		ok   bool
	}{
		{"0", plan.Latency{}, true},
		{"20ms", plan.Latency{Min: 20 * time.Millisecond, Max: 20 * time.Millisecond}, true},
		{"uniform:10ms-80ms", plan.Latency{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}, true},
		{"uniform:5ms-5ms", plan.Latency{Min: 5 * time.Millisecond, Max: 5 * time.Millisecond}, true},
		{"uniform:80ms-10ms", plan.Latency{}, false},
		{"uniform:10ms", plan.Latency{}, false},
		{"normal:1ms-2ms", plan.Latency{}, false},
		{"-5ms", plan.Latency{}, false},
		{"fast", plan.Latency{}, false},
	} {
		got, err := plan.ParseLatency(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseLatency(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.Max > 0 {
			if back, _ := plan.ParseLatency(got.String()); back != got {
				t.Errorf("%v does not round-trip through String (%q)", got, got.String())
			}
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"0", 0, true},
		{"100mbit", 12.5e6, true},
		{"1gbit", 125e6, true},
		{"512kbit", 64e3, true},
		{"12.5MB", 12.5e6, true},
		{"64KiB", 65536, true},
		{"100", 0, false},
		{"-1mbit", 0, false},
		{"fastmbit", 0, false},
		{"10mbps", 0, false},
	} {
		got, err := plan.ParseBandwidth(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestHostileRoles is a small run of every kind of hostile role, for the
// race detector's pass (TestHostileTestnet checks the defences at size).
func TestHostileRoles(t *testing.T) {
	cfg := tinyConfig(12, 4*time.Second)
	cfg.Model = "linreg"
	cfg.Exchange = exchange.Spec{} // gossip: the poison is counted on its topic
	cfg.Roles = []plan.RoleShare{{Role: plan.LiarRandom, Fraction: 0.1}, {Role: plan.PoisonNaN, Fraction: 0.1}, {Role: plan.PoisonNorm, Fraction: 0.1}, {Role: plan.Flooder, Fraction: 0.1}, {Role: plan.Slow, Fraction: 0.1}, {Role: plan.SlowModel, Fraction: 0.1}}
	cfg.Churn = 1
	res := runLogged(t, cfg)
	h := res.Hostile
	if h == nil || h.PoisonApplied != 0 || h.Target == nil || h.Target.StreamsRefused == 0 || h.Target.ModelStreamsRefused == 0 {
		t.Errorf("hostile report %+v", h)
	}
	if res.StalledNodes != 0 || res.Steps.Min < 3 {
		t.Errorf("honest nodes: steps %+v, %d stalled", res.Steps, res.StalledNodes)
	}
}
