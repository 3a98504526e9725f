package testnet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

func FuzzParseScript(f *testing.F) {
	f.Add("60s crash 10%\n30s join 5\n")
	f.Add("1h leave 100%")
	f.Add("#\n\n5ms join 1 # x")
	f.Fuzz(func(t *testing.T, s string) {
		evs, err := plan.ParseScript(strings.NewReader(s))
		if err != nil {
			return
		}
		for i, e := range evs {
			if e.At < 0 || (e.Count < 1 && !(e.Fraction > 0 && e.Fraction <= 1)) {
				t.Fatalf("accepted a bad event %+v", e)
			}
			if i > 0 && evs[i-1].At > e.At {
				t.Fatal("events out of order")
			}
		}
	})
}

// smallConfig is the 20-node pSSP(5,2) testnet the tests run: fast steps,
// short stall window, frequent evaluation.
func smallConfig(d time.Duration) plan.Config {
	cfg := plan.DefaultConfig()
	cfg.Nodes = 20
	cfg.Duration = d
	cfg.TimeScale = 0.05
	cfg.Barrier = psp.MustParse("pssp:5:2")
	cfg.StallWindow = 3 * time.Second
	cfg.EvalEvery = 2 * time.Second
	return cfg
}

// runLogged runs a testnet on the virtual clock (or, with Clock Real, on
// the machine's) and logs its summary. On the virtual clock the run is
// pace-independent: time moves only when every node waits.
func runLogged(t *testing.T, cfg plan.Config) *report.Result {
	t.Helper()
	var res *report.Result
	run := func(t *testing.T) {
		var err error
		res, err = Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Clock == plan.Virtual {
		vclock.Test(t, run)
	} else {
		run(t)
	}
	if res == nil {
		t.FailNow()
	}
	var sb strings.Builder
	res.PrintSummary(&sb)
	t.Log("\n" + sb.String())
	return res
}

// TestNoteFree checks the stall rule: a stall is a whole window free to go
// on (barrier open, not computing) without progress; a long computation or
// a closed barrier restarts the clock.
func TestNoteFree(t *testing.T) {
	const w = 30 * time.Second
	sec := func(s int) time.Duration { return time.Duration(s) * time.Second }
	tests := []struct {
		name  string
		ticks []bool // free at 0 s, 10 s, 20 s, ...
		want  bool   // stalled at the last tick
	}{
		{"free a whole window", []bool{true, true, true, true}, true},
		{"free just short of it", []bool{true, true, true}, false},
		{"busy in between", []bool{true, true, false, true, true}, false},
		{"free after a long computation", []bool{false, false, false, true, true, true, true}, true},
		{"never free", []bool{false, false, false, false, false}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &member{freeSince: -1}
			var got bool
			for i, free := range tc.ticks {
				got = m.noteFree(sec(10*i), free, w)
			}
			if got != tc.want {
				t.Errorf("stalled = %v, want %v", got, tc.want)
			}
		})
	}
}

// A node is free to go on from its launch: one that never steps is
// stalled at the first record a window later, even when the recorder,
// starved of CPU, took no record in between. The window used to start at
// the first record that found the node free.
func TestStalledFromLaunch(t *testing.T) {
	const w = 30 * time.Second
	m := &member{freeSince: -1}
	m.launched(0, 0)
	if !m.noteFree(w, true, w) {
		t.Error("a node free since its launch a whole window ago is not stalled")
	}
	m.launched(0, 0)
	if m.noteFree(w-time.Second, true, w) {
		t.Error("stalled before a whole window")
	}
}

// The stall rule counts a node that has computed one step for far longer
// than the time model allows as free to go on: a step of 0.1 s that takes
// a minute is the machine's stall, not a straggler's step. It used to
// count every node inside its task's Step as busy, however long.
func TestStallFree(t *testing.T) {
	const long = time.Second // stallStepShare × a 0.1-s mean step
	for _, tc := range []struct {
		name               string
		allowed, computing bool
		since, longest     time.Duration
		want               bool
	}{
		{"waiting, barrier open", true, false, time.Minute, long, true},
		{"barrier closed", false, false, time.Minute, long, false},
		{"computing a plausible step", true, true, 500 * time.Millisecond, long, false},
		{"computing one step for a minute", true, true, time.Minute, long, true},
		{"computing for a minute, barrier closed", false, true, time.Minute, long, false},
		{"no time model: computing is busy", true, true, time.Hour, 0, false},
	} {
		if got := stallFree(tc.allowed, tc.computing, tc.since, tc.longest); got != tc.want {
			t.Errorf("%s: free %v, want %v", tc.name, got, tc.want)
		}
	}
	tn := &testnet{cfg: plan.Config{TimeScale: 0.05}}
	if got := tn.longestStep(&member{factor: 4}); got != 4*time.Second {
		t.Errorf("longest step of a straggler (×4) at time scale 0.05: %v, want 4 s", got)
	}
}
