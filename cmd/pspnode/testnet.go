package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet"
	"github.com/pspnode/pspnode/testnet/sim"
)

// testnetGCPercent is the collector target the testnet sets for its
// process, or 0 to leave it. Hundreds of nodes in one process share one
// heap, and with Go's default (GOGC=100) collection took about 30 % of a
// saturated 2-core testnet's CPU; at 200 nodes, GOGC=200 raised pBSP(10)'s
// real/simulated step ratio from 0.76–0.82 to 0.88–0.90 for 2.0 → 2.7 GiB
// of peak RSS. Above 500 nodes memory is the tighter limit, so Go's default
// stays. An explicit flag wins over that, and GOGC in the environment over
// both (the runtime has applied it already).
func testnetGCPercent(flag, nodes int, env string) int {
	switch {
	case env != "":
		return 0
	case flag > 0:
		return flag
	case nodes <= 500:
		return 200
	}
	return 0
}

func testnetCommand(stdout, stderr io.Writer) *ffcli.Command {
	fs := newFlagSet("pspnode testnet", stderr)
	def := testnet.DefaultConfig()
	var (
		barriers  = specList{def.Barrier}
		stragg    fraction
		factor    = positive(def.StraggleFactor)
		scale     = positive(def.TimeScale)
		nodes     = fs.Int("nodes", def.Nodes, "number of nodes")
		duration  = fs.Duration("duration", def.Duration, "training time (after the network has formed)")
		churn     = fs.Float64("churn", 0, "fraction of the nodes replaced per minute (leave and join rates)")
		churnMode = fs.String("churn-mode", def.ChurnMode.String(), "how churned nodes leave: crash, graceful or mixed")
		script    = fs.String("churn-script", "", "a churn timeline file: lines of 'TIME join|leave|crash COUNT|PCT%', e.g. '60s crash 30%'")
		modelName = fs.String("model", def.Model, "model: none, linreg, logreg or mlp")
		data      = fs.String("data", def.Data, "data: synthetic, or mnist:DIR")
		encoding  = fs.String("encoding", def.Encoding, "update encoding: dense32, dense16, topk32 or topk16")
		lr        = fs.Float64("lr", 0, "initial learning rate (0: the model's default)")
		transport = fs.String("transport", def.Transport, "mem (in-process network, for large N) or tcp (loopback sockets, up to 300 nodes)")
		seed      = fs.Uint64("seed", def.Seed, "random seed")
		warmup    = fs.Duration("warmup", def.Warmup, "longest wait for the overlay to form before training starts")
		evalEvery = fs.Duration("eval-every", def.EvalEvery, "evaluate the models this often (0: never)")
		target    = fs.Float64("target", def.AccuracyTarget, "accuracy (R² for linreg) whose first crossing is reported")
		out       = fs.String("out", "", "write CSV files, PNG figures and summary.json to this directory")
		asJSON    = fs.Bool("json", false, "print exactly one JSON object on stdout (progress still goes to stderr)")
		quiet     = fs.Bool("quiet", false, "no live progress on stderr")
		compare   = fs.Bool("compare-sim", false, "also run the simulator with the same parameters and report real/simulated step ratios")
		logLevel  = fs.String("log-level", "error", "node log level: debug, info, warn or error")
		cpuProf   = fs.String("cpu-profile", "", "write a CPU profile to this file (go tool pprof), from the end of the first warm-up to the end")
		memProf   = fs.String("mem-profile", "", "write a heap profile to this file halfway through the (first) run's training, and a goroutine profile to FILE.goroutines")
		hostile   = fs.String("hostile", "", "hostile or faulty roles for shares of the nodes, ROLE:SHARE,...: liar-ahead, liar-zero, liar-random, poison-nan, poison-huge, poison-length, poison-norm, flooder, slow (e.g. liar-zero:5%)")
		slowDelay = fs.Duration("slow-delay", def.SlowDelay, "how late slow nodes answer step queries")
		latency   = fs.Duration("latency", 0, "one-way latency added to every link (mem transport)")
		loss      = fs.Float64("loss", 0, "probability that a step query or gossip message is lost (mem transport)")
		noScreen  = fs.Bool("no-screen", false, "turn off the nodes' screening of step reports (to measure what it defends against)")
		pollShare = fs.Float64("poll-share", def.PollShare, pollShareHelp)
		normBound = fs.Float64("norm-bound", 0, "refuse received updates over this many times the norm of a node's own (0: the node default, 4; -1: off)")
		connLow   = fs.Int("conn-low", 0, "each node's connection-manager low watermark (0: by --nodes: 64, 32 above 100 nodes, 16 above 500, 24 over tcp)")
		connHigh  = fs.Int("conn-high", 0, "each node's connection-manager high watermark (0: by --nodes: 192, 96 above 100 nodes, 48 above 500, 64 over tcp)")
		poolSize  = fs.Int("pool-size", 0, "each node's sampler pool, peers kept connected and verified (0: by --nodes: 64, 32 above 100 nodes, 24 above 500, 32 over tcp; at least β)")
		gcPercent = fs.Int("gc-percent", 0, "the Go collector's heap growth target (GOGC) for this process; 0: 200 up to 500 nodes, Go's 100 above (memory); a GOGC environment variable wins")
	)
	fs.Var(&barriers, "barrier", "barrier spec, or a comma-separated list run one after another and compared ("+psp.Grammar+")")
	fs.Var(&stragg, "stragglers", "fraction of nodes that are stragglers")
	fs.Var(&factor, "straggle-factor", "task time multiplier of stragglers")
	fs.Var(&scale, "time-scale", "multiplies the paper's task time (Exp(1)+1) s")
	return &ffcli.Command{
		Name:       "testnet",
		ShortUsage: "pspnode testnet [--nodes 50] [--duration 1m] [--barrier pssp:10:4] [--churn 0.2] [--out DIR] [--json] [flags]",
		ShortHelp:  "run a local testnet of real nodes (libp2p hosts, DHT, GossipSub, the engine) and report its figures",
		LongHelp: `Starts N real pspnode nodes in this process — real libp2p hosts, the real
Kademlia DHT, real GossipSub and the real training engine — over an
in-memory network (--transport mem, for hundreds of nodes) or TCP loopback.
Once the overlay has formed, all nodes start training at once; stragglers
and churn are injected; live progress goes to stderr; at the end it prints a
summary (or one JSON object with --json) and, with --out, CSV files and PNG
figures.

Examples:
  pspnode testnet                                   # 50 nodes, pSSP(10,4), 1 minute
  pspnode testnet --nodes 200 --duration 200s --time-scale 1 --barrier pbsp:10 --compare-sim
  pspnode testnet --nodes 200 --churn 0.2 --churn-mode mixed --duration 5m --out results/churn
  pspnode testnet --model logreg --data mnist:../shared/data/mnist --nodes 16 --stragglers 0.2
  pspnode testnet --nodes 100 --hostile liar-zero:5% --duration 90s   # RELIABILITY.md`,
		FlagSet: fs,
		Options: envOptions(),
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("testnet takes no arguments, got %q", args)
			}
			cfg := testnet.DefaultConfig()
			cfg.Nodes, cfg.Duration, cfg.Barrier = *nodes, *duration, barriers[0]
			cfg.TimeScale, cfg.Stragglers, cfg.StraggleFactor = float64(scale), float64(stragg), float64(factor)
			cfg.Churn, cfg.Model, cfg.Data, cfg.Encoding, cfg.LR = *churn, *modelName, *data, *encoding, *lr
			cfg.Transport, cfg.Seed, cfg.Warmup, cfg.EvalEvery, cfg.AccuracyTarget = *transport, *seed, *warmup, *evalEvery, *target
			cfg.SlowDelay, cfg.Latency, cfg.Loss, cfg.NormBound, cfg.NoScreen = *slowDelay, *latency, *loss, *normBound, *noScreen
			cfg.PollShare = *pollShare
			cfg.ConnLow, cfg.ConnHigh, cfg.PoolSize = *connLow, *connHigh, *poolSize
			if *hostile != "" {
				rs, err := testnet.ParseRoles(*hostile)
				if err != nil {
					return usageError{err}
				}
				cfg.Roles = rs
			}
			cm, err := sim.ParseChurnMode(*churnMode)
			if err != nil {
				return usageError{err}
			}
			cfg.ChurnMode = cm
			if _, err := gossip.ParseEncoding(*encoding); err != nil {
				return usageError{err}
			}
			if *script != "" {
				f, err := os.Open(*script)
				if err != nil {
					return fmt.Errorf("churn script: %w", err)
				}
				evs, err := testnet.ParseScript(f)
				f.Close()
				if err != nil {
					return usageError{err}
				}
				cfg.Script = evs
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			if *gcPercent < 0 {
				return usagef("--gc-percent must be >= 0 (got %d)", *gcPercent)
			}
			if p := testnetGCPercent(*gcPercent, cfg.Nodes, os.Getenv("GOGC")); p > 0 {
				defer debug.SetGCPercent(debug.SetGCPercent(p))
			}
			log, err := newLogger(stderr, *logLevel, "text")
			if err != nil {
				return err
			}
			cfg.Logger = log
			if !*quiet {
				fmt.Fprintf(stderr, "testnet: starting %d nodes (%s transport), barrier %s, model %s\n", cfg.Nodes, cfg.Transport, cfg.Barrier, cfg.Model)
				cfg.BuildProgress = func(built, total int, d time.Duration) {
					fmt.Fprintf(stderr, "testnet: built %d/%d nodes in %s\n", built, total, d.Round(time.Second))
				}
				cfg.Progress = func(s testnet.Snapshot) {
					acc := ""
					if s.Accuracy == s.Accuracy {
						acc = fmt.Sprintf("  acc %.3f", s.Accuracy)
					}
					fmt.Fprintf(stderr, "[%5.0fs] live %4d  step min/med/max %d/%d/%d  waiting %3d  est err %5.1f%%  updates/s %6.0f%s\n",
						s.Elapsed.Seconds(), s.Live, s.StepMin, s.StepMedian, s.StepMax, s.Waiting, 100*s.EstimateError, s.UpdatesPerSec, acc)
				}
			}
			if *cpuProf != "" {
				// Profile the training phase only (from the first progress
				// tick), not the overlay's warm-up.
				f, err := os.Create(*cpuProf)
				if err != nil {
					return fmt.Errorf("cpu profile: %w", err)
				}
				var once sync.Once
				var startErr error = errors.New("training never started")
				progress := cfg.Progress
				cfg.Progress = func(s testnet.Snapshot) {
					once.Do(func() { startErr = pprof.StartCPUProfile(f) })
					if progress != nil {
						progress(s)
					}
				}
				defer func() { // Run has returned: its progress calls are over
					if startErr == nil {
						pprof.StopCPUProfile()
						f.Close()
						return
					}
					f.Close()
					os.Remove(*cpuProf)
					fmt.Fprintf(stderr, "testnet: no CPU profile written: %v\n", startErr)
				}()
			}
			if *memProf != "" {
				// Halfway through the training phase of the first run
				// (timed from its first progress tick, after the build and
				// warm-up).
				write := func() {
					f, err := os.Create(*memProf)
					if err != nil {
						fmt.Fprintf(stderr, "testnet: no heap profile written: %v\n", err)
						return
					}
					_ = pprof.Lookup("heap").WriteTo(f, 0)
					f.Close()
					if g, err := os.Create(*memProf + ".goroutines"); err == nil {
						_ = pprof.Lookup("goroutine").WriteTo(g, 0)
						g.Close()
					}
					// The heap profile does not show goroutine stacks or the
					// collector's headroom; say how the process's memory splits.
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					fmt.Fprintf(stderr, "testnet: heap profile written to %s: heap %d MiB in use (%d MiB from the OS), stacks %d MiB, %d goroutines\n",
						*memProf, ms.HeapInuse>>20, ms.HeapSys>>20, ms.StackInuse>>20, runtime.NumGoroutine())
				}
				var once sync.Once
				var tm *time.Timer
				progress := cfg.Progress
				cfg.Progress = func(s testnet.Snapshot) {
					once.Do(func() { tm = time.AfterFunc(cfg.Duration/2, write) })
					if progress != nil {
						progress(s)
					}
				}
				defer func() { // Run has returned: its progress calls are over
					if tm != nil {
						tm.Stop()
					}
				}()
			}
			start := time.Now()
			var results []*testnet.Result
			for i, sp := range barriers {
				c := cfg
				c.Barrier = sp
				if len(barriers) > 1 && !*quiet {
					fmt.Fprintf(stderr, "testnet: run %d/%d: %s\n", i+1, len(barriers), sp)
				}
				res, err := testnet.Run(ctx, c)
				if err != nil {
					return err
				}
				if *compare {
					if err := testnet.CompareWithSim(c, res); err != nil {
						return err
					}
				}
				if *out != "" {
					dir := *out
					if len(barriers) > 1 {
						dir = filepath.Join(*out, strings.ReplaceAll(sp.String(), ":", "_"))
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
			if *out != "" {
				if len(results) > 1 {
					if err := testnet.WriteComparison(*out, results); err != nil {
						return err
					}
				}
				fmt.Fprintf(stderr, "testnet: wrote CSV files, figures and summary.json to %s\n", *out)
			}
			if !*quiet {
				fmt.Fprintf(stderr, "testnet: done in %s\n", time.Since(start).Round(time.Second))
			}
			if *asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if len(results) == 1 {
					return enc.Encode(results[0])
				}
				return enc.Encode(results)
			}
			if len(results) == 1 {
				results[0].PrintSummary(stdout)
			} else {
				testnet.PrintComparison(stdout, results)
			}
			return nil
		},
	}
}
