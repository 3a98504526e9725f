package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/internal/netns"
	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// testnetGCPercent is the collector target the testnet sets for its
// process, or 0 to leave it: plan.DefaultGCPercent for its size (at
// 200 nodes, GOGC=200 in place of Go's 100 raised pBSP(10)'s real/simulated
// step ratio from 0.76–0.82 to 0.88–0.90 for 2.0 → 2.7 GiB of peak RSS).
// An explicit flag wins over that, and GOGC in the environment over both
// (the runtime has applied it already).
func testnetGCPercent(flag, nodes int, env string) int {
	switch {
	case env != "":
		return 0
	case flag > 0:
		return flag
	}
	return plan.DefaultGCPercent(nodes)
}

// estimateGCPercent is the collector target the run's estimate assumes:
// the one set, or GOGC's if it is a number (0, the default, otherwise).
func estimateGCPercent(set int, env string) int {
	if set > 0 {
		return set
	}
	if p, err := strconv.Atoi(env); err == nil && p > 0 {
		return p
	}
	return 0
}

// testnetFlags are the testnet command's flags.
type testnetFlags struct {
	barriers                                            specList
	stragg, factor, scale, pollShare                    floatFlag
	pace                                                paceFlag
	exchange                                            exchange.Spec
	clock, churnMode, script, modelName, data           *string
	encoding, transport, cpuQuota, out, logLevel        *string
	cpuProf, memProf, hostile, latency, bandwidth       *string
	nodes, nat, victims, prefix                         *int
	connLow, connHigh, poolSize, gcPercent, stepStreams *int
	force, churnReplace, private                        *bool
	duration, warmup, evalEvery, slowDelay, connGrace   *time.Duration
	churn, lr, target, loss, normBound, staleSteps      *float64
	cleanup, asJSON, quiet, compare, sybilDef, noScreen *bool
	seed                                                *uint64
}

// addTestnetFlags defines the testnet command's flags on fs.
func addTestnetFlags(fs *flag.FlagSet) *testnetFlags {
	def := plan.DefaultConfig()
	f := &testnetFlags{
		barriers:  specList{def.Barrier},
		stragg:    fractionFlag(0),
		factor:    positiveFlag(def.StraggleFactor),
		scale:     nonNegativeFlag(def.TimeScale),
		pollShare: shareFlag(def.PollShare),
		pace:      paceFlag{def.Pace},
		exchange:  def.Exchange,
	}
	f.nodes = fs.Int("nodes", def.Nodes, "number of nodes")
	f.duration = fs.Duration("duration", def.Duration, "training time (after the network has formed), on the run's clock")
	f.clock = fs.String("clock", string(def.Clock), "virtual (time moves only when every node waits: the protocol's figures, whatever this machine's load) or real (this machine's clock: figures include its CPU; the run reports whether it was overloaded)")
	f.churn = fs.Float64("churn", 0, "fraction of the nodes replaced per minute (leave and join rates)")
	f.churnReplace = fs.Bool("churn-replace", false, "bring a fresh node in as each churned node goes, so the population holds at --nodes (without it departures and joins are independent and the population wanders)")
	f.churnMode = fs.String("churn-mode", def.ChurnMode.String(), "how churned nodes leave: crash, graceful or mixed")
	f.script = fs.String("churn-script", "", "a churn timeline file: lines of 'TIME join|leave|crash COUNT|PCT%', 'TIME partition PCT%', 'TIME heal' or 'TIME crash-hostile' (stops every --hostile node), e.g. '60s crash 30%'")
	f.modelName = fs.String("model", def.Model, "model: none, linreg, logreg or mlp")
	f.data = fs.String("data", def.Data, "data: synthetic, mnist (the MNIST test set built into pspnode) or mnist:DIR")
	f.encoding = fs.String("encoding", def.Encoding, "update encoding: dense32, dense16, topk32 or topk16")
	f.lr = fs.Float64("lr", 0, "initial learning rate (0: the model's default)")
	f.transport = fs.String("transport", def.Transport, "mem (in-process network, for large N), tcp (loopback sockets, up to 300 nodes; real clock only) or netns (one pspnode run process per node, each in its own network namespace on a bridge; real clock; needs root, iproute2, and nftables for --nat)")
	f.private = fs.Bool("private", false, "give every node one swarm key, as pspnode run --swarm-key does (--transport tcp only); the log-flood role needs it")
	f.nat = fs.Int("nat", 0, "netns transport: put this many nodes behind a NAT router each (nftables masquerade; no port forward)")
	f.cpuQuota = fs.String("cpu-quota", "", "netns transport: FRACTION:CORES gives that fraction of the nodes that many CPUs each (a cgroup quota), e.g. 0.25:0.1")
	f.cleanup = fs.Bool("cleanup", false, "remove the namespaces, links and cgroups that netns runs whose process is gone left behind, then exit")
	f.seed = fs.Uint64("seed", def.Seed, "random seed (also of the nodes' keys; 0: random keys)")
	f.warmup = fs.Duration("warmup", def.Warmup, "longest wait for the overlay to form before training starts")
	f.evalEvery = fs.Duration("eval-every", def.EvalEvery, "evaluate the models this often (0: never)")
	f.target = fs.Float64("target", def.AccuracyTarget, "accuracy (R² for linreg) whose first crossing is reported")
	f.out = fs.String("out", "", "write CSV files, PNG figures and summary.json to this directory")
	f.asJSON = fs.Bool("json", false, "print exactly one JSON object on stdout (progress still goes to stderr)")
	f.quiet = fs.Bool("quiet", false, "no live progress on stderr")
	f.compare = fs.Bool("compare-sim", false, "also run the simulator with the same parameters (fidelity mode, and poll mode at the nodes' re-check rate) and report real/simulated step ratios")
	f.logLevel = fs.String("log-level", "error", "node log level: debug, info, warn or error")
	f.cpuProf = fs.String("cpu-profile", "", "write a CPU profile to this file (go tool pprof), from the end of the first warm-up to the end")
	f.memProf = fs.String("mem-profile", "", "write a heap profile to this file halfway through the (first) run's training, and a goroutine profile to FILE.goroutines")
	f.hostile = fs.String("hostile", "", "hostile or faulty roles for shares of the nodes, ROLE:SHARE,... with each SHARE in (0, 1) or (0%, 100%), adding up to less than all: "+roleNames()+" (e.g. liar-zero:5%; see docs/reliability.md)")
	f.sybilDef = fs.Bool("sybil-defence", true, "the nodes' address limits against many identities behind one address (sampler weights, routing-table diversity filter); false to measure what they defend against")
	f.victims = fs.Int("sybil-victims", 0, fmt.Sprintf("honest nodes the sybil-zone nodes crowd (0: %d)", plan.DefaultSybilVictims))
	f.prefix = fs.Int("sybil-prefix", 0, fmt.Sprintf("leading bits of its victim's DHT key each sybil-zone node's key shares, found by generating about 2^bits keys (0: %d; at most %d)", plan.DefaultSybilPrefix, plan.MaxSybilPrefix))
	f.slowDelay = fs.Duration("slow-delay", def.SlowDelay, "how late slow nodes answer step queries")
	f.latency = fs.String("latency", "0", "one-way latency of every link (mem transport): a duration (20ms), or drawn once per link from uniform:MIN-MAX (uniform:10ms-80ms)")
	f.bandwidth = fs.String("bandwidth", "0", "each node's uplink and downlink, shared by all its streams (mem transport; netns: tc tbf on its link): e.g. 100mbit, 1gbit, 12.5MB (per second); 0: unlimited")
	f.loss = fs.Float64("loss", 0, "probability that a step query or gossip message is lost (mem transport)")
	f.noScreen = fs.Bool("no-screen", false, "turn off the nodes' screening of step reports (to measure what it defends against)")
	f.normBound = fs.Float64("norm-bound", 0, "refuse received updates over this many times the norm of a node's own (0: the node default, 4; -1: off)")
	f.staleSteps = fs.Float64("stale-steps", def.StaleSteps, staleStepsHelp)
	f.connLow = fs.Int("conn-low", 0, "each node's connection-manager low watermark (0: by --nodes: 64, 16 above 500 nodes, 24 over tcp)")
	f.connHigh = fs.Int("conn-high", 0, "each node's connection-manager high watermark (0: by --nodes: 192, 512 above 100 nodes (so none is trimmed up to 500), 48 above 500, 64 over tcp)")
	f.connGrace = fs.Duration("conn-grace", 0, "how long each node's connection manager leaves a new connection untrimmed, in virtual time, on --transport mem (0: 20s); younger connections are held above --conn-high")
	f.stepStreams = fs.Int("step-streams", 0, "idle step streams each node keeps for its next queries (0: by --nodes: as many as its --conn-high, at least 64, at most half its inbound stream cap); fewer save memory above 500 nodes and cost CPU")
	f.poolSize = fs.Int("pool-size", 0, "each node's sampler pool, peers kept connected and verified (0: by --nodes: 64, 32 above 100 nodes, 24 above 500, 32 over tcp; at least β)")
	f.force = fs.Bool("force", false, "run even when the run's memory estimate exceeds the memory this machine has available (it is refused otherwise)")
	f.gcPercent = fs.Int("gc-percent", 0, "the Go collector's heap growth target (GOGC) for this process; 0: 200 up to 500 nodes, Go's 100 above (memory); a GOGC environment variable wins. The memory estimate follows it: 50 takes about a fifth less memory for a third more CPU at 1000 nodes")
	fs.Var(&f.barriers, "barrier", barrierHelp("barrier spec, or a comma-separated list run one after another and compared"))
	fs.Var(&f.stragg, "stragglers", "fraction of nodes that are stragglers")
	fs.Var(&f.factor, "straggle-factor", "task time multiplier of stragglers")
	fs.Var(&f.pollShare, "poll-share", pollShareHelp)
	fs.Var(&f.pace, "pace", paceHelp)
	fs.Var(&f.exchange, "exchange", exchangeHelp)
	fs.Var(&f.scale, "time-scale", "multiplies the paper's task time (Exp(1)+1) s; 0: none, steps take what the model's compute takes (real clock only)")
	return f
}

func testnetCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode testnet", stderr)
	f := addTestnetFlags(fs)
	return &ffcli.Command{
		Name:       "testnet",
		ShortUsage: "pspnode testnet [--nodes 50] [--duration 1m] [--barrier pssp:10:4] [--clock virtual|real] [--churn 0.2] [--out DIR] [--json] [flags]",
		ShortHelp:  "run a local testnet of real nodes (libp2p hosts, DHT, GossipSub, the engine) and report its figures",
		LongHelp: `Starts N real pspnode nodes in this process — real libp2p hosts, the real
Kademlia DHT, real GossipSub and the real training engine — over an
in-memory network (--transport mem, for hundreds of nodes) or TCP loopback.
Once the overlay has formed, all nodes start training at once; stragglers
and churn are injected; live progress goes to stderr; at the end it prints a
summary (or one JSON object with --json) and, with --out, CSV files and PNG
figures.

By default the testnet runs on a virtual clock (--clock virtual): time moves
only when every node is waiting, so the time model's task time and the
links' latency and bandwidth are the only things that take time, and CPU
work takes none. Its figures are the protocol's on any machine; a loaded
machine only makes the run take longer in wall time (progress shows the
speed). --clock real runs on this machine's clock, as a deployment would:
its figures include this machine's CPU, and the run measures whether the
machine set the pace (timer lag, CPU share, churn lag) and warns if so.

Examples:
  pspnode testnet                                   # 50 nodes, pSSP(10,4), 1 minute
  pspnode testnet --nodes 200 --duration 200s --time-scale 1 --barrier pbsp:10 --compare-sim
  pspnode testnet --nodes 200 --churn 0.2 --churn-mode mixed --duration 5m --out results/churn
  pspnode testnet --model logreg --data mnist --nodes 16 --stragglers 0.2
  pspnode testnet --nodes 100 --latency uniform:10ms-80ms --bandwidth 100mbit
  pspnode testnet --clock real --nodes 50 --json    # what real CPU costs
  pspnode testnet --transport netns --nodes 12 --nat 4 --model logreg --data mnist --barrier pssp:4:2

--transport netns runs each node as a separate 'pspnode run' process (this
binary) in a network namespace of its own, with its own address on a
bridge, and reads the report from the nodes' /status and /metrics. It
needs root and iproute2 (ip, tc), and nftables with --nat. Links take
--bandwidth (tc tbf), not --latency or --loss (tc netem). Everything it
makes is removed when it ends or is interrupted; --cleanup removes what a
killed run left.` + barrierSpecsHelp,
		FlagSet: fs,
		Options: envOptions(),
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("testnet takes no arguments, got %q", args)
			}
			return f.run(ctx, fs, stdout, stderr)
		},
	}
}

// run is the testnet command once its flags are parsed: check them, make
// the job, and run it on the clock asked for.
func (f *testnetFlags) run(ctx context.Context, fs *flag.FlagSet, stdout, stderr0 io.Writer) error {
	// Progress, the nodes' logs and the heap profile's timer all
	// write to stderr from their own goroutines.
	stderr := &lockedWriter{w: stderr0}
	if *f.cleanup {
		return netnsCleanup(ctx, stderr)
	}
	clockSet := false
	fs.Visit(func(fl *flag.Flag) { clockSet = clockSet || fl.Name == "clock" })
	if *f.transport == "netns" && !clockSet {
		*f.clock = string(plan.Real)
		if !*f.quiet {
			fmt.Fprintln(stderr, "testnet: the netns transport runs real processes: using --clock real")
		}
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	if *f.gcPercent < 0 {
		return usagef("--gc-percent must be >= 0 (got %d)", *f.gcPercent)
	}
	p := testnetGCPercent(*f.gcPercent, cfg.Nodes, os.Getenv("GOGC"))
	if p > 0 && cfg.Transport != "netns" {
		defer debug.SetGCPercent(debug.SetGCPercent(p))
	}
	cfg.GCPercent = estimateGCPercent(p, os.Getenv("GOGC"))
	log, err := newLogger(stderr, *f.logLevel, "text")
	if err != nil {
		return err
	}
	cfg.Logger = log
	job := &testnetJob{cfg: cfg, barriers: f.barriers, out: *f.out, asJSON: *f.asJSON, quiet: *f.quiet, compare: *f.compare,
		memProf: *f.memProf, stdout: stdout, stderr: stderr}
	if *f.cpuProf != "" {
		file, err := os.Create(*f.cpuProf)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		job.cpu = newCPUProfile(file, *f.cpuProf, stderr)
	}
	if cfg.Clock == plan.Real {
		start := time.Now()
		return job.run(ctx, func() time.Duration { return time.Since(start) })
	}
	vclock.Exit(ctx, func(ctx context.Context, c *vclock.Clock) int {
		return exitCode(job.run(ctx, c.Wall), stderr)
	})
	return nil // not reached: Exit ends the process
}

// config is the testnet's Config from the flags (the first barrier's);
// a bad flag is a usage error.
func (f *testnetFlags) config() (plan.Config, error) {
	cfg := plan.DefaultConfig()
	cfg.Nodes, cfg.Duration, cfg.Barrier = *f.nodes, *f.duration, f.barriers[0]
	cfg.TimeScale, cfg.Stragglers, cfg.StraggleFactor = f.scale.x, f.stragg.x, f.factor.x
	if err := checkData(*f.data); err != nil {
		return cfg, err
	}
	cfg.Churn, cfg.Model, cfg.Data, cfg.Encoding, cfg.LR = *f.churn, *f.modelName, *f.data, *f.encoding, *f.lr
	cfg.Transport, cfg.Seed, cfg.Warmup, cfg.EvalEvery, cfg.AccuracyTarget = *f.transport, *f.seed, *f.warmup, *f.evalEvery, *f.target
	cfg.Private = *f.private
	cfg.SlowDelay, cfg.Loss, cfg.NormBound, cfg.NoScreen = *f.slowDelay, *f.loss, *f.normBound, *f.noScreen
	if !(*f.staleSteps >= 0) {
		return cfg, usagef("--stale-steps %v: want a number of steps >= 0 (0: every model or update counts fully)", *f.staleSteps)
	}
	cfg.StaleSteps = *f.staleSteps
	cfg.Force, cfg.ChurnReplace = *f.force, *f.churnReplace
	cfg.NoSybilDefence, cfg.SybilVictims, cfg.SybilPrefix = !*f.sybilDef, *f.victims, *f.prefix
	cfg.PollShare, cfg.Pace = f.pollShare.x, f.pace.c
	cfg.Exchange = f.exchange
	cfg.ConnLow, cfg.ConnHigh, cfg.PoolSize = *f.connLow, *f.connHigh, *f.poolSize
	cfg.ConnGrace, cfg.StepStreams = *f.connGrace, *f.stepStreams
	cfg.NAT, cfg.NodeLogLevel = *f.nat, *f.logLevel
	var err error
	if cfg.CPUQuota, err = plan.ParseCPUQuota(*f.cpuQuota); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Clock, err = plan.ParseClock(*f.clock); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Latency, err = plan.ParseLatency(*f.latency); err != nil {
		return cfg, usageError{err}
	}
	if cfg.Bandwidth, err = plan.ParseBandwidth(*f.bandwidth); err != nil {
		return cfg, usageError{err}
	}
	if *f.hostile != "" {
		rs, err := plan.ParseRoles(*f.hostile)
		if err != nil {
			return cfg, usageError{err}
		}
		cfg.Roles = rs
	}
	cm, err := sim.ParseChurnMode(*f.churnMode)
	if err != nil {
		return cfg, usageError{err}
	}
	cfg.ChurnMode = cm
	if *f.script != "" {
		file, err := os.Open(*f.script)
		if err != nil {
			return cfg, usagef("--churn-script: %v", err)
		}
		evs, err := plan.ParseScript(file)
		file.Close()
		if err != nil {
			return cfg, usagef("--churn-script %s: %v", *f.script, err)
		}
		cfg.Script = evs
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err}
	}
	if *f.compare && cfg.TimeScale == 0 {
		return cfg, usagef("--compare-sim needs the time model: a positive --time-scale")
	}
	return cfg, nil
}

// testnetJob is what the testnet command does once its flags are checked:
// one testnet run per barrier, then the report. On the virtual clock it runs
// inside the bubble, so it must not wait on anything made outside it.
type testnetJob struct {
	cfg                    plan.Config
	barriers               []psp.Spec
	out                    string
	asJSON, quiet, compare bool
	memProf                string
	cpu                    *cpuProfile // nil without --cpu-profile
	stdout, stderr         io.Writer
}

// run runs the job; wall tells the wall time since the command started.
func (j *testnetJob) run(ctx context.Context, wall func() time.Duration) error {
	cfg := j.cfg
	cfg.WallClock = wall
	if !j.quiet {
		j.watch(&cfg, wall)
	}
	stopProfiles := j.profile(&cfg)
	defer stopProfiles() // Run has returned: its progress calls are over
	var results []*report.Result
	for i, sp := range j.barriers {
		c := cfg
		c.Barrier = sp
		if len(j.barriers) > 1 && !j.quiet {
			fmt.Fprintf(j.stderr, "testnet: run %d/%d: %s\n", i+1, len(j.barriers), sp)
		}
		res, err := testnet.Run(ctx, c)
		if tooLarge := (*plan.ErrTooLarge)(nil); errors.As(err, &tooLarge) {
			return usageError{err} // what was asked does not fit: exit 2
		}
		if err != nil {
			return err
		}
		if j.compare {
			if err := testnet.CompareWithSim(c, res); err != nil {
				return err
			}
		}
		if j.out != "" {
			dir := j.out
			if len(j.barriers) > 1 {
				dir = filepath.Join(j.out, strings.ReplaceAll(sp.String(), ":", "_"))
			}
			if err := res.WriteOut(dir); err != nil {
				return err
			}
		}
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}
	return j.report(results, wall)
}

// watch sets cfg's hooks that print the build and live progress to stderr.
func (j *testnetJob) watch(cfg *plan.Config, wall func() time.Duration) {
	virtual := cfg.Clock == plan.Virtual
	fmt.Fprintf(j.stderr, "testnet: starting %d nodes (%s transport, %s clock), barrier %s, model %s\n", cfg.Nodes, cfg.Transport, cfg.Clock, cfg.Barrier, cfg.Model)
	if !virtual {
		fmt.Fprintln(j.stderr, "testnet: real clock: the figures include this machine's CPU; the run reports whether the machine set the pace")
	}
	cfg.NetnsRun = func(id, subnet string) {
		fmt.Fprintf(j.stderr, "testnet: netns run %s on %s (namespaces %s%s-*; --cleanup removes them if this process is killed)\n", id, subnet, netns.Prefix, id)
	}
	cfg.Estimated = func(e plan.Estimate) {
		fmt.Fprintf(j.stderr, "testnet: estimate: %s\n", e)
	}
	cfg.BuildProgress = func(built, total int, d time.Duration) {
		if virtual {
			fmt.Fprintf(j.stderr, "testnet: built %d/%d nodes (%s of wall time so far)\n", built, total, wall().Round(time.Second))
			return
		}
		fmt.Fprintf(j.stderr, "testnet: built %d/%d nodes in %s\n", built, total, d.Round(time.Second))
	}
	var printed time.Duration = -1
	var rate progressRate
	cfg.Progress = func(s report.Snapshot) {
		// On the virtual clock snapshots can come many times a wall
		// second: print at most one a wall second. (The job's wall
		// time: each run's own, s.Wall, starts again at 0.)
		now := wall()
		if virtual && printed >= 0 && now-printed < time.Second {
			return
		}
		printed = now
		acc := ""
		if s.Accuracy == s.Accuracy {
			acc = fmt.Sprintf("  acc %.3f", s.Accuracy)
		}
		clock := fmt.Sprintf("%5.0fs", s.Elapsed.Seconds())
		switch {
		case virtual && s.Wall > 0:
			clock = fmt.Sprintf("%5.0fs virtual, %5.2f× real time", s.Elapsed.Seconds(), s.Elapsed.Seconds()/s.Wall.Seconds())
		case virtual:
			clock = fmt.Sprintf("%5.0fs virtual", s.Elapsed.Seconds())
		}
		fmt.Fprintf(j.stderr, "[%s] live %4d  step min/med/max %d/%d/%d  waiting %3d  est err %5.1f%%  updates/s %6.0f%s%s\n",
			clock, s.Live, s.StepMin, s.StepMedian, s.StepMax, s.Waiting, 100*s.EstimateError, s.UpdatesPerSec, acc, rate.line(s, cfg.Duration, cfg.TimeScale, procstat.CPUTime()))
	}
}

// progressRate tells, on a progress line, how fast a run goes in the units
// of its cost (paper node-seconds: a node for one second of the paper's
// task time, training time divided by the time scale) and when it will
// end, from the first progress snapshot on.
type progressRate struct {
	started         bool
	elapsed0, wall0 time.Duration
	cpu0            time.Duration
	nodeS           float64 // paper node-seconds since the first snapshot
	lastElapsed     time.Duration
}

// line returns the rate part of a progress line for snapshot s of a run
// of the given training duration and time scale; cpu is the process's CPU
// time so far. It is empty until there is something to tell.
func (r *progressRate) line(s report.Snapshot, duration time.Duration, timeScale float64, cpu time.Duration) string {
	if s.Wall < 0 || timeScale <= 0 {
		return ""
	}
	if !r.started || s.Elapsed < r.lastElapsed { // the first snapshot, or the next barrier's run
		*r = progressRate{}
		r.started, r.elapsed0, r.wall0, r.cpu0, r.lastElapsed = true, s.Elapsed, s.Wall, cpu, s.Elapsed
		return ""
	}
	r.nodeS += float64(s.Live) * (s.Elapsed - r.lastElapsed).Seconds() / timeScale
	r.lastElapsed = s.Elapsed
	wall, ran := (s.Wall - r.wall0).Seconds(), (s.Elapsed - r.elapsed0).Seconds()
	if wall <= 0 || ran <= 0 {
		return ""
	}
	out := fmt.Sprintf("  %.0f paper node-s/s", r.nodeS/wall)
	if c := (cpu - r.cpu0).Seconds(); c > 0 {
		out += fmt.Sprintf(" (%.0f per CPU-s)", r.nodeS/c)
	}
	if left := (duration - s.Elapsed).Seconds(); left > 0 {
		out += fmt.Sprintf("  ends in ~%s", time.Duration(left*wall/ran*float64(time.Second)).Round(time.Second))
	}
	return out
}

// profile sets cfg's progress hook to start the CPU profile and time the
// heap profile, when the job has them. The stop it returns ends both; call
// it once testnet.Run has returned.
func (j *testnetJob) profile(cfg *plan.Config) (stop func()) {
	var stops []func()
	if j.cpu != nil {
		// Profile the training phase only (from the first progress tick),
		// not the overlay's warm-up.
		progress := cfg.Progress
		cfg.Progress = func(s report.Snapshot) {
			j.cpu.begin()
			if progress != nil {
				progress(s)
			}
		}
		stops = append(stops, j.cpu.stop)
	}
	if j.memProf != "" {
		// Halfway through the training phase of the first run (timed from
		// its first progress tick, after the build and warm-up).
		var once sync.Once
		var tm *time.Timer
		progress := cfg.Progress
		cfg.Progress = func(s report.Snapshot) {
			once.Do(func() { tm = time.AfterFunc(cfg.Duration/2, func() { writeMemProfile(j.memProf, j.stderr) }) })
			if progress != nil {
				progress(s)
			}
		}
		stops = append(stops, func() {
			if tm != nil {
				tm.Stop()
			}
		})
	}
	return func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
}

// report writes the comparison of several runs with --out, and prints the
// results: one JSON value with --json, else a summary or a comparison.
func (j *testnetJob) report(results []*report.Result, wall func() time.Duration) error {
	if j.out != "" {
		if len(results) > 1 {
			if err := report.WriteComparison(j.out, results); err != nil {
				return err
			}
		}
		fmt.Fprintf(j.stderr, "testnet: wrote CSV files, figures and summary.json to %s\n", j.out)
	}
	if !j.quiet {
		fmt.Fprintf(j.stderr, "testnet: done in %s of wall time\n", wall().Round(time.Second))
	}
	if j.asJSON {
		// The JSON carries overload.flagged; the warning still goes to
		// stderr, where a person reads it.
		for _, r := range results {
			if w := r.OverloadWarning(); w != "" {
				fmt.Fprintln(j.stderr, w)
			}
		}
		enc := json.NewEncoder(j.stdout)
		enc.SetIndent("", "  ")
		if len(results) == 1 {
			return enc.Encode(results[0])
		}
		return enc.Encode(results)
	}
	if len(results) == 1 {
		results[0].PrintSummary(j.stdout)
	} else {
		report.PrintComparison(j.stdout, results)
	}
	return nil
}

// writeMemProfile writes a heap profile to file and a goroutine profile to
// file.goroutines, and says how the process's memory splits.
func writeMemProfile(file string, stderr io.Writer) {
	f, err := os.Create(file)
	if err != nil {
		fmt.Fprintf(stderr, "testnet: no heap profile written: %v\n", err)
		return
	}
	_ = pprof.Lookup("heap").WriteTo(f, 0)
	f.Close()
	if g, err := os.Create(file + ".goroutines"); err == nil {
		_ = pprof.Lookup("goroutine").WriteTo(g, 0)
		g.Close()
	}
	// The heap profile does not show goroutine stacks or the collector's
	// headroom; say how the process's memory splits.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(stderr, "testnet: heap profile written to %s: heap %d MiB in use (%d MiB from the OS), stacks %d MiB, %d goroutines\n",
		file, ms.HeapInuse>>20, ms.HeapSys>>20, ms.StackInuse>>20, runtime.NumGoroutine())
}

// cpuProfile is a CPU profile that begins when training does. pprof's
// writer goroutine must not run in a virtual-clock bubble (it blocks in the
// runtime, which the bubble would take for activity and never move its
// clock), so the profile is started by a goroutine made outside, which
// begin wakes.
type cpuProfile struct {
	f         *os.File
	name      string
	stderr    io.Writer
	signal    chan struct{} // closed by begin
	attempted chan struct{} // closed once the profile was started (or failed to)
	quit      chan struct{} // closed by stop
	once      sync.Once
	err       error // of starting; set before attempted is closed
}

// newCPUProfile must be called outside any bubble.
func newCPUProfile(f *os.File, name string, stderr io.Writer) *cpuProfile {
	p := &cpuProfile{f: f, name: name, stderr: stderr,
		signal: make(chan struct{}), attempted: make(chan struct{}), quit: make(chan struct{})}
	go func() { // outside the bubble; ends at begin or stop
		select {
		case <-p.signal:
			p.err = pprof.StartCPUProfile(p.f)
			close(p.attempted)
		case <-p.quit:
		}
	}()
	return p
}

func (p *cpuProfile) begin() { p.once.Do(func() { close(p.signal) }) }

// stop ends the profile, or, if it never began, removes the file.
func (p *cpuProfile) stop() {
	close(p.quit)
	begun := false
	select {
	case <-p.signal:
		begun = true
		<-p.attempted
	default:
	}
	switch {
	case begun && p.err == nil:
		pprof.StopCPUProfile()
		p.f.Close()
		return
	case !begun:
		p.err = errors.New("training never started")
	}
	p.f.Close()
	os.Remove(p.name)
	fmt.Fprintf(p.stderr, "testnet: no CPU profile written: %v\n", p.err)
}

// lockedWriter serialises writes to w from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// netnsCleanup sweeps what killed netns runs left behind.
func netnsCleanup(ctx context.Context, stderr io.Writer) error {
	if err := netns.Check(false); err != nil {
		return err
	}
	swept, err := netns.Sweep(ctx)
	fmt.Fprintf(stderr, "testnet: removed what %d stale netns run(s) left behind %v\n", len(swept), swept)
	return err
}

// roleNames lists the testnet's hostile roles for --hostile's help.
func roleNames() string {
	names := make([]string, len(plan.Roles))
	for i, r := range plan.Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}
