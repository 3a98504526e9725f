package plan

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// Clock is the time a testnet runs on.
type Clock string

const (
	// Virtual runs the testnet on a virtual clock: a testing/synctest
	// bubble, where time moves only when every goroutine is blocked. The
	// time model's compute time and the links' latency and bandwidth are
	// the only things that take time; CPU work takes none. Its figures are
	// the protocol's, whatever N, the time scale or the machine's load;
	// only the wall time a run takes depends on the machine. Run must then
	// be called inside a bubble: from a test, in synctest.Test; pspnode
	// testnet makes one (internal/vclock).
	Virtual Clock = "virtual"
	// Real runs on the machine's clock, as a deployment does. Every
	// figure then includes the machine's CPU: when the nodes need more
	// than the cores, the machine sets the pace. The result's Overload
	// says whether that happened.
	Real Clock = "real"
)

// ParseClock reads "virtual" or "real".
func ParseClock(s string) (Clock, error) {
	switch c := Clock(s); c {
	case Virtual, Real:
		return c, nil
	}
	return "", fmt.Errorf("clock %q: want virtual or real", s)
}

// Latency is the one-way latency of the testnet's links: Min == Max gives
// every link the same; otherwise each link draws one, once, uniformly in
// [Min, Max] (some peers near, some far).
type Latency struct{ Min, Max time.Duration }

// String renders the latency in ParseLatency syntax.
func (l Latency) String() string {
	if l.Max > l.Min {
		return fmt.Sprintf("uniform:%v-%v", l.Min, l.Max)
	}
	return l.Min.String()
}

// ParseLatency reads a fixed latency ("20ms", "0") or a per-link
// distribution "uniform:MIN-MAX" ("uniform:10ms-80ms").
func ParseLatency(s string) (Latency, error) {
	bad := fmt.Errorf("latency %q: want a duration such as 20ms, or uniform:MIN-MAX such as uniform:10ms-80ms", s)
	if rest, ok := strings.CutPrefix(s, "uniform:"); ok {
		lo, hi, ok := strings.Cut(rest, "-")
		if !ok {
			return Latency{}, bad
		}
		a, err1 := time.ParseDuration(lo)
		b, err2 := time.ParseDuration(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return Latency{}, bad
		}
		return Latency{a, b}, nil
	}
	if s == "0" {
		return Latency{}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return Latency{}, bad
	}
	return Latency{d, d}, nil
}

// ParseBandwidth reads a rate per second in bits (tc's units: "100mbit",
// "1gbit", "512kbit", "8000bit") or bytes ("12.5MB", "1GB", "64KiB", "100B"),
// and returns bytes per second. "0" is unlimited.
func ParseBandwidth(s string) (float64, error) {
	units := []struct {
		suffix string
		bytes  float64
	}{
		{"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"bit", 1.0 / 8},
		{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
	}
	if s == "0" {
		return 0, nil
	}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err == nil && v > 0 && !math.IsInf(v, 0) {
				return v * u.bytes, nil
			}
			break
		}
	}
	return 0, fmt.Errorf("bandwidth %q: want a rate such as 100mbit, 1gbit, 512kbit or 12.5MB (per second)", s)
}

// Config is one testnet run. Start from DefaultConfig.
type Config struct {
	Nodes    int           // nodes at the start
	Duration time.Duration // training time, after the warm-up
	Barrier  psp.Spec
	Clock    Clock // Virtual (the default) or Real
	// WallClock, if set, returns the wall time since a fixed moment. On the
	// virtual clock time.Now is virtual, so the run can only report how
	// long it took in wall time (and live progress its speed) with it.
	WallClock func() time.Duration

	// TimeScale multiplies the paper's task time (Exp(1)+1) s. 0 (real
	// clock only) adds none: steps take what the model's compute takes.
	TimeScale      float64
	Stragglers     float64 // fraction of nodes slowed by StraggleFactor
	StraggleFactor float64

	Churn     float64       // fraction of the initial nodes replaced per minute
	ChurnMode sim.ChurnMode // how churned nodes leave
	// ChurnReplace makes every churned departure bring a fresh node in at
	// once, in place of the joins' own Poisson process: the population
	// holds at Nodes (the script's events still change it). Without it
	// departures and joins are independent, each at Churn × Nodes per
	// minute, and the population walks at random: over two hours at 20 %
	// per minute, 200 nodes drifted anywhere from 119 to 423.
	ChurnReplace bool
	Script       []Event // a churn timeline; with Churn, both apply

	Model    string // none, linreg, logreg, mlp
	Data     string // synthetic or mnist:DIR
	Encoding string // gossip encoding: dense32, dense16, topk32, topk16
	LR       float64
	// Exchange is the nodes' node.Config.Exchange: epidemic:S
	// (DefaultConfig: node.DefaultConfig's, epidemic:4) or gossip (the
	// zero value).
	Exchange exchange.Spec

	// Roles makes shares of the initial nodes hostile or faulty (see
	// Role); SlowDelay is how late Slow nodes answer step queries.
	Roles     []RoleShare
	SlowDelay time.Duration
	// Latency is added to every link one way; Bandwidth (bytes per second,
	// 0 unlimited) is each node's uplink and downlink, shared by all its
	// streams; Loss is the probability that a step query or a gossip
	// message is lost (mem transport only).
	Latency   Latency
	Bandwidth float64
	Loss      float64
	// NormBound overrides the nodes' update norm bound (node.Config.Exchange);
	// 0 keeps the node default, a negative value turns the check off.
	NormBound float64
	// StaleSteps is the nodes' Exchange.StaleSteps: what a peer made k
	// steps behind counts 1/(1 + k/StaleSteps) (0: fully).
	StaleSteps float64
	// NoScreen turns off the nodes' screening of step reports (psp.Screen),
	// to measure what it defends against.
	NoScreen bool
	// NoSybilDefence turns off the nodes' address limits (the overlay's
	// PerAddress: Sample's weights and the routing table's diversity
	// filter), to measure what they defend against.
	NoSybilDefence bool
	// SybilVictims is how many honest nodes the sybil-zone nodes crowd (0:
	// DefaultSybilVictims), and SybilPrefix how many leading bits of its
	// victim's DHT key each one's key shares at least (0:
	// DefaultSybilPrefix; at most MaxSybilPrefix).
	SybilVictims, SybilPrefix int
	// PollShare is the nodes' node.Config.Check.PollShare: the shortest
	// interval between re-checks of a node waiting at a sampled barrier,
	// as a share of its mean compute time per step.
	PollShare float64
	// Pace is the nodes' node.Config.Check.Pace: the pace rule of their
	// pBSP and pSSP checks (the zero value is off).
	Pace psp.PaceConfig

	Transport string // mem (in-process network), tcp (loopback) or netns (a process per node)
	// Private gives every node one swarm key (tcp transport only), as
	// pspnode run --swarm-key does: a private job.
	Private bool
	// NAT puts this many nodes (never node 0, the bootstrap node) behind a
	// NAT router each, and CPUQuota limits a share of the nodes' CPU
	// (netns transport only).
	NAT      int
	CPUQuota CPUQuota
	// Executable is the pspnode binary the netns transport starts for each
	// node (empty: this process's own executable); NodeLogLevel their
	// --log-level (empty: warn).
	Executable   string
	NodeLogLevel string
	// NetnsRun, if set, is told the netns run's ID and bridge subnet once
	// its bridge exists (every name it makes carries the ID).
	NetnsRun func(id, subnet string)
	// ConnLow and ConnHigh are each node's connection-manager watermarks
	// and PoolSize its sampler pool; 0 picks them from Nodes (smaller for
	// large testnets: every connection end costs memory).
	ConnLow, ConnHigh, PoolSize int
	// ConnGrace is how long a node's connection manager leaves a new
	// connection untrimmed (0: 20 s); every younger one is held on top
	// of ConnHigh.
	ConnGrace time.Duration
	// StepStreams is how many idle step streams each node keeps for its
	// next queries (0: one per connection it may hold, see stepStreams).
	StepStreams int
	Seed        uint64

	Warmup         time.Duration // longest wait for overlays before training starts
	RecordEvery    time.Duration // sampling period of the recorder
	EvalEvery      time.Duration // how often models are evaluated (0: never)
	StallWindow    time.Duration // no progress for this long, while allowed, is a stall
	AccuracyTarget float64       // accuracy whose first crossing is reported

	// Estimated, if set, is told the run's estimate (Estimate) before any
	// node is built (mem and tcp transports). Run refuses a run whose
	// estimated memory exceeds what the machine has available, with an
	// *ErrTooLarge, unless Force is set.
	Estimated func(Estimate)
	Force     bool
	// GCPercent is the collector target the process runs at
	// (runtime/debug.SetGCPercent), for the estimate's memory only: the
	// collector's headroom is most of the difference between a node's
	// live heap and its share of the RSS. 0 is what pspnode testnet sets
	// by default: 200 up to 500 nodes, 100 above (DefaultGCPercent).
	GCPercent int

	// BuildProgress, if set, is told as nodes are built.
	BuildProgress func(built, total int, elapsed time.Duration)
	// Progress, if set, receives a snapshot every RecordEvery.
	Progress func(report.Snapshot)
	// Logger receives the nodes' logs (warnings by default); nil discards.
	Logger *slog.Logger
}

// DefaultConfig is `make run`'s testnet: 50 nodes, pSSP(10, 4), synthetic
// linear regression, one minute of training at half the paper's task time.
func DefaultConfig() Config {
	return Config{
		Nodes:          50,
		Duration:       time.Minute,
		Barrier:        psp.Spec{Kind: psp.PSSP, Beta: 10, Staleness: 4},
		Clock:          Virtual,
		TimeScale:      0.5,
		StraggleFactor: 4,
		ChurnMode:      sim.Mixed,
		Model:          "linreg",
		Data:           "synthetic",
		Encoding:       "dense32",
		Transport:      "mem",
		SlowDelay:      500 * time.Millisecond,
		Seed:           1,
		Warmup:         30 * time.Second,
		RecordEvery:    time.Second,
		EvalEvery:      5 * time.Second,
		StallWindow:    30 * time.Second,
		AccuracyTarget: 0.85,
		PollShare:      node.DefaultConfig().Check.PollShare,
		Pace:           node.DefaultConfig().Check.Pace,
		Exchange:       node.DefaultConfig().Exchange.Spec,
		StaleSteps:     node.DefaultConfig().Exchange.StaleSteps,
	}
}

// Validate checks the configuration; errors name the field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := c.Pace.Validate(); err != nil {
		bad("pace: %w", err)
	}
	if !(c.PollShare > 0 && c.PollShare <= 1) {
		bad("poll share %v must be in (0, 1]", c.PollShare)
	}
	if c.Nodes < 2 || c.Nodes > 5000 {
		bad("nodes %d out of range [2, 5000]", c.Nodes)
	}
	if c.Duration <= 0 {
		bad("duration %v must be positive", c.Duration)
	}
	if err := c.Barrier.Validate(); err != nil {
		bad("barrier: %w", err)
	}
	switch c.Clock {
	case Virtual:
		if c.TimeScale == 0 {
			bad("time scale 0 (real compute only) cannot run on the virtual clock, where compute takes no time: every step would take none; use the real clock, or a positive time scale")
		}
		if c.Transport == "tcp" || c.Transport == "netns" {
			bad("the virtual clock needs the mem transport: real sockets and processes cannot run on a fake clock; use --clock real with --transport %s", c.Transport)
		}
	case Real:
	default:
		bad("clock %q: want virtual or real", c.Clock)
	}
	if !(c.TimeScale >= 0) || math.IsInf(c.TimeScale, 0) {
		bad("time scale %v must be a finite number >= 0", c.TimeScale)
	}
	if !(c.Stragglers >= 0 && c.Stragglers <= 1) {
		bad("stragglers %v: want a fraction of the nodes in [0, 1]", c.Stragglers)
	}
	if !(c.StraggleFactor >= 1) || math.IsInf(c.StraggleFactor, 0) {
		bad("straggle factor %v: want a finite task-time multiplier >= 1", c.StraggleFactor)
	}
	if !(c.Churn >= 0) || c.Churn > 10 {
		bad("churn %v must be a fraction per minute in [0, 10]", c.Churn)
	}
	switch c.Model {
	case "none", "linreg", "logreg", "mlp":
	default:
		bad("model %q: want none, linreg, logreg or mlp", c.Model)
	}
	switch c.Transport {
	case "mem", "tcp", "netns":
	default:
		bad("transport %q: want mem, tcp or netns", c.Transport)
	}
	if c.Transport == "netns" {
		errs = append(errs, c.validateNetns()...)
	} else if c.NAT != 0 || c.CPUQuota != (CPUQuota{}) {
		bad("NAT and CPU quotas need --transport netns")
	}
	if _, err := gossip.ParseEncoding(c.Encoding); err != nil {
		bad("encoding: %w", err)
	} else if c.Exchange.Kind == exchange.Epidemic && c.Encoding != "dense32" {
		bad("exchange %s sends whole models: encoding %s does not carry one faithfully; use dense32, or --exchange gossip", c.Exchange, c.Encoding)
	}
	if c.Transport == "tcp" && c.Nodes > 300 {
		bad("tcp transport: %d nodes do not fit the open-files limit; use --transport mem above 300", c.Nodes)
	}
	if c.Latency.Min < 0 || c.Latency.Max < c.Latency.Min || c.Latency.Max > 10*time.Second {
		bad("latency %v: want one-way latencies within [0, 10s]", c.Latency)
	}
	if !(c.Loss >= 0 && c.Loss < 1) {
		bad("loss %v: want a probability in [0, 1)", c.Loss)
	}
	if c.SlowDelay < 0 {
		bad("slow delay %v: want a duration >= 0", c.SlowDelay)
	}
	if !(c.Bandwidth >= 0) || math.IsInf(c.Bandwidth, 0) {
		bad("bandwidth %v must be a finite number of bytes per second >= 0", c.Bandwidth)
	}
	if c.Private && c.Transport != "tcp" {
		bad("a private job (swarm key) needs --transport tcp")
	}
	if (c.Latency.Max > 0 || c.Loss > 0 || c.Bandwidth > 0) && c.Transport == "tcp" {
		bad("latency, bandwidth and loss need the mem transport (bandwidth also the netns transport)")
	}
	total := 0.0
	for _, r := range c.Roles {
		if !slices.Contains(Roles, r.Role) || !(r.Fraction > 0 && r.Fraction < 1) {
			bad("role %q with share %v: want a known role and a share in (0, 1)", r.Role, r.Fraction)
		}
		total += r.Fraction
		if r.Role == LogFlood && (!c.Private || c.Transport != "tcp") {
			bad("role %q floods a private job with junk connections: it needs --transport tcp and --private", r.Role)
		}
		if r.Role == DriftPoison && (c.Exchange.Kind != exchange.Epidemic || c.Model == "none") {
			bad("role %q pushes models over the epidemic exchange: it needs a model and --exchange epidemic:S", r.Role)
		}
		if r.Role.Poisoner() && c.Exchange.Kind == exchange.Epidemic {
			bad("role %q: poisoned updates are counted on the gossip topic only; add --exchange gossip (under %s the distance bound refuses such models, counted as exchange.rejected.distance)", r.Role, c.Exchange)
		}
	}
	if total >= 1 {
		bad("role shares add up to %.3g: some nodes must stay honest", total)
	}
	c.validateSybil(bad)
	for _, e := range c.Script {
		if (e.Action == Partition || e.Action == Heal) && c.Transport != "mem" {
			bad("churn script: %s needs --transport mem", e.Action)
			break
		}
	}
	if c.ConnLow < 0 || c.ConnHigh < 0 || c.PoolSize < 0 {
		bad("connection watermarks %d/%d and pool size %d must be non-negative", c.ConnLow, c.ConnHigh, c.PoolSize)
	} else if low, high, _ := c.Limits(); high < low {
		bad("connection high watermark %d is below the low watermark %d", high, low)
	}
	if c.ConnGrace < 0 {
		bad("connection grace period %v must be non-negative", c.ConnGrace)
	}
	if c.StepStreams < 0 {
		bad("idle step streams %d must be non-negative", c.StepStreams)
	}
	if c.Warmup < 0 {
		bad("warm-up %v: want a duration >= 0", c.Warmup)
	}
	if c.EvalEvery < 0 {
		bad("eval interval %v: want a duration >= 0 (0: never)", c.EvalEvery)
	}
	if c.RecordEvery <= 0 || c.StallWindow <= 0 {
		bad("record interval %v and stall window %v must be positive", c.RecordEvery, c.StallWindow)
	}
	return errors.Join(errs...)
}

// Limits returns each node's connection watermarks and sampler pool size:
// ConnLow, ConnHigh and PoolSize where set, otherwise defaults by Nodes.
// The pool is never smaller than the barrier's β.
//
// Up to 500 nodes the high watermark is above the population, so the
// connection manager never trims: a node samples its step queries from
// every peer, and a trimmed connection is soon dialled again (with an
// identify exchange). At 200 nodes of pSSP(10, 4), watermarks 32/96 made
// a node open 151 connections a minute and cost 1.6× the CPU of holding
// them all (19 a minute), for 3 % less memory; at 300 nodes 1.12× for 6 %.
// Above 500 nodes memory decides (each connection's state is several
// kilobytes at both ends), and the watermarks are tight.
func (c Config) Limits() (low, high, pool int) {
	low, high, pool = 64, 192, 64
	switch {
	case c.Transport == "tcp":
		low, high, pool = 24, 64, 32
	case c.Nodes > 500:
		low, high, pool = 16, 48, 24
	case c.Nodes > 100:
		low, high, pool = 64, 512, 32
	}
	if c.ConnLow > 0 {
		low = c.ConnLow
	}
	if c.ConnHigh > 0 {
		high = c.ConnHigh
	}
	if c.PoolSize > 0 {
		pool = c.PoolSize
	}
	return low, high, max(pool, c.Barrier.Beta)
}
