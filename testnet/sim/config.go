package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/pspnode/pspnode/psp"
)

// Mode selects how waiting nodes are re-evaluated.
type Mode int

const (
	// Fidelity re-evaluates every waiting node, with a fresh sample, at
	// every completion event: the paper's simulator.
	Fidelity Mode = iota
	// Poll has each waiting node re-check every PollInterval seconds, as a
	// real node does; for very large N.
	Poll
	// Timed has each waiting node re-check when its barrier policy
	// (psp.Checker) says: psp.BarrierTiming from its mean task time and
	// the live population, with no round trip; and a peer's progress
	// wakes it as a real node's does (a peer it found behind tells it
	// when it reaches the node's threshold; a query from a peer at or
	// behind it wakes it).
	Timed
)

// String returns "fidelity", "poll" or "timed".
func (m Mode) String() string {
	switch m {
	case Poll:
		return "poll"
	case Timed:
		return "timed"
	}
	return "fidelity"
}

// ChurnMode says how leaving nodes leave.
type ChurnMode int

const (
	Crash    ChurnMode = iota // vanish without a word
	Graceful                  // announce the leave
	Mixed                     // each leave is a crash or graceful with equal odds
)

// String returns "crash", "graceful" or "mixed".
func (c ChurnMode) String() string {
	return [...]string{"crash", "graceful", "mixed"}[c]
}

// ParseChurnMode parses "crash", "graceful" or "mixed".
func ParseChurnMode(s string) (ChurnMode, error) {
	switch s {
	case "crash":
		return Crash, nil
	case "graceful":
		return Graceful, nil
	case "mixed":
		return Mixed, nil
	}
	return 0, fmt.Errorf("unknown churn mode %q: want crash, graceful or mixed", s)
}

// Config is one simulation run. Start from DefaultConfig.
type Config struct {
	Nodes    int      // initial population
	Duration float64  // simulated seconds
	Barrier  psp.Spec // barrier every node runs
	Seed     uint64   // the run is a pure function of Config
	// Pace is the pace rule of the nodes' pBSP and pSSP checks
	// (psp.PaceConfig; the zero value is the paper's barriers). The
	// default is the node's.
	Pace psp.PaceConfig

	TimeScale      float64 // multiplies every task time; 1 is the paper's model
	Stragglers     float64 // fraction of nodes that are stragglers, in [0, 1]
	StraggleFactor float64 // stragglers' task time multiplier, >= 1

	Mode         Mode
	PollInterval float64 // seconds between re-checks in Poll mode

	LeaveRate float64   // fraction of the initial population leaving per minute
	JoinRate  float64   // fraction of the initial population joining per minute
	ChurnMode ChurnMode // how leavers leave
	// Replace makes every leave bring a fresh node in at once, in place of
	// the joins' own process (JoinRate is then ignored): the population
	// holds at Nodes. Without it leaves and joins are independent, and the
	// population walks at random.
	Replace    bool
	JoinSample int // live nodes a joiner looks at to adopt a step

	RecordEvery float64 // seconds between per-node step snapshots; 0 disables the series
	StallWindow float64 // a waiting node without progress for this long counts as stalled
	LagR        int     // r of the recorded lag CDF F(r); -1 means the barrier's staleness (4 for ASP)

	// Progress, if set, is called now and then with the simulated time.
	Progress func(now float64)
}

// DefaultConfig is the PSP paper's step experiment: 200 nodes, 200 simulated
// seconds, no stragglers, pSSP with β = 10 and s = 4.
func DefaultConfig() Config {
	return Config{
		Nodes:          200,
		Duration:       200,
		Barrier:        psp.Spec{Kind: psp.PSSP, Beta: 10, Staleness: 4},
		Seed:           1,
		Pace:           psp.DefaultPaceConfig(),
		TimeScale:      1,
		StraggleFactor: 4,
		PollInterval:   0.25,
		ChurnMode:      Mixed,
		JoinSample:     psp.JoinSample,
		RecordEvery:    1,
		StallWindow:    30,
		LagR:           -1,
	}
}

// Validate checks a Config, with errors that name the field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Nodes < 1 || c.Nodes > 10_000_000 {
		bad("nodes %d out of range [1, 10000000]", c.Nodes)
	}
	if !(c.Duration > 0) || math.IsInf(c.Duration, 0) {
		bad("duration %v must be a positive number of seconds", c.Duration)
	}
	if err := c.Barrier.Validate(); err != nil {
		bad("barrier: %w", err)
	}
	if err := c.Pace.Validate(); err != nil {
		bad("pace: %w", err)
	}
	if !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0) {
		bad("time scale %v must be positive", c.TimeScale)
	}
	if !(c.Stragglers >= 0 && c.Stragglers <= 1) {
		bad("stragglers %v must be a fraction in [0, 1]", c.Stragglers)
	}
	if !(c.StraggleFactor >= 1) || math.IsInf(c.StraggleFactor, 0) {
		bad("straggle factor %v must be >= 1", c.StraggleFactor)
	}
	if c.Mode == Timed && server(c.Barrier) {
		bad("timed mode runs the nodes' barrier policy; the simulator's %s is the server-based baseline: use fidelity or poll", strings.ToUpper(c.Barrier.Kind.String()))
	}
	if c.Mode == Poll && !(c.PollInterval > 0) {
		bad("poll interval %v must be positive", c.PollInterval)
	}
	if !(c.LeaveRate >= 0) || !(c.JoinRate >= 0) || math.IsInf(c.LeaveRate, 0) || math.IsInf(c.JoinRate, 0) {
		bad("churn rates must be non-negative (leave %v, join %v)", c.LeaveRate, c.JoinRate)
	}
	if c.RecordEvery < 0 || c.StallWindow < 0 || math.IsNaN(c.RecordEvery) || math.IsNaN(c.StallWindow) {
		bad("record interval and stall window must be non-negative")
	}
	if c.RecordEvery > 0 && c.Duration/c.RecordEvery > 1e6 {
		bad("record interval %v too small for duration %v", c.RecordEvery, c.Duration)
	}
	return errors.Join(errs...)
}

// server reports whether the simulator runs sp as its kind's server-based
// baseline (psp.DSSPController) rather than through each node's Checker.
func server(sp psp.Spec) bool {
	info, _ := sp.Kind.Info()
	return info.Server
}
