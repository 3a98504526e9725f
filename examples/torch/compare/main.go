package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

const python = "/usr/bin/python3"

// Slow modes of a cell: no slow worker, --slow-workers whose task time
// (the sleep) is factor times longer, or --slow-workers whose processes
// get a CPU quota each.
const (
	slowNone  = "none"
	slowSleep = "sleep"
	slowCPU   = "cpu"
)

// modelSpec is one model of mnist.py and how it is trained, the same
// under every system.
type modelSpec struct {
	Name     string  // mnist.py --model
	LR       float64 // --lr
	Momentum float64 // --momentum
}

type config struct {
	bin, out  string
	tiers     []tier
	models    []modelSpec
	slows     []string
	systems   []string
	seeds     []int
	workers   int
	slowN     int     // how many workers are slowed in the sleep and cpu modes
	factor    float64 // how much slower a slow worker is
	slowCores float64 // a slow worker's CPU quota in the cpu mode
	scale     float64 // task time per step: (Exp(1)+1) × scale s
	target    float64
	batch     int
	maxDur    time.Duration // a run ends after this long whatever its accuracy
	after     time.Duration // and this long after it reached the target
	evalEvery time.Duration
	evalAll   bool // every pspnode worker evaluates during training, not worker 0 alone
	resume    bool
	probeOnly bool
	// joinParams, when set, runs the join experiment (join.go) instead.
	joinParams int
}

// cell is one setting the systems are compared in.
type cell struct {
	Tier  tier
	Model modelSpec
	Slow  string
}

func (c cell) String() string { return c.Tier.Name + " " + c.Model.Name + " slow=" + c.Slow }

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	if err := c.check(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	// SIGINT or SIGTERM cancels the run in progress: its processes are
	// stopped and its namespaces removed before the harness exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if swept, err := netns.Sweep(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "compare: removing what earlier runs left:", err)
	} else if len(swept) > 0 {
		fmt.Printf("removed what %d earlier, ended runs left behind: %s\n", len(swept), strings.Join(swept, ", "))
	}
	run := c.runAll
	if c.joinParams > 0 {
		run = c.joinAll
	}
	if err := run(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "compare: interrupted; finished runs are kept in", c.out, "(go on with --resume)")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line into a config.
func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var tiersF, models, slows, systems, seeds string
	var all bool
	var lrMLP, lrCNN, momCNN, lrWide, momWide float64
	fs.StringVar(&c.bin, "bin", "bin/pspnode", "the pspnode binary (make build)")
	fs.StringVar(&c.out, "out", "results/ddp", "where the tables, the runs and the figures go")
	fs.StringVar(&tiersF, "tiers", "lan,continent", "link tiers to run ("+tierNames()+")")
	fs.StringVar(&models, "models", "mlp", "models (mlp, cnn, wide: 784-2048-2048-10, 5.8 M parameters)")
	fs.StringVar(&slows, "slow", "none,sleep", "slow modes: none, sleep (--slow-workers workers' task time ×--slow-factor), cpu (--slow-workers workers' processes get --slow-cores each)")
	fs.StringVar(&systems, "systems", "ddp,default", "systems: ddp (torch DDP, gloo), default (pspnode run's own barrier and exchange), or BARRIER[/EXCHANGE] (e.g. pssp:2:4/epidemic:2)")
	fs.StringVar(&seeds, "seeds", "1,2,3", "seeds: each sets the batch order, the task times, the initial model and which worker is slow")
	fs.BoolVar(&all, "all", false, "every cell: all four tiers, both models, slow modes none, sleep and cpu, seeds 1,2,3 (overrides those flags; about "+fmt.Sprint(len(tiers))+"×2×3×3 cells per system)")
	fs.IntVar(&c.workers, "workers", 4, "workers per run")
	fs.IntVar(&c.slowN, "slow-workers", 1, "how many workers the sleep and cpu modes slow (1 to --workers − 1; worker 0, the evaluator, never)")
	fs.Float64Var(&c.factor, "slow-factor", 4, "how much slower a slow worker's task time is (sleep mode)")
	fs.Float64Var(&c.slowCores, "slow-cores", 0, "each slow worker's CPU quota in cores (cpu mode; 0: this machine's cores / workers / --slow-factor)")
	fs.Float64Var(&c.scale, "time-scale", 0.05, "task time per step: a sleep of (Exp(1)+1) × this seconds")
	fs.Float64Var(&c.target, "target", 0.9, "the held-out accuracy to reach")
	fs.IntVar(&c.batch, "batch", 32, "batch size per worker")
	fs.Float64Var(&lrMLP, "lr-mlp", 0.2, "the MLP's learning rate (plain SGD)")
	fs.Float64Var(&lrCNN, "lr-cnn", 0.05, "the CNN's learning rate")
	fs.Float64Var(&momCNN, "momentum-cnn", 0.9, "the CNN's SGD momentum")
	fs.Float64Var(&lrWide, "lr-wide", 0.05, "the wide MLP's learning rate")
	fs.Float64Var(&momWide, "momentum-wide", 0.9, "the wide MLP's SGD momentum")
	fs.DurationVar(&c.maxDur, "max-duration", 90*time.Second, "a run stops after this long of training")
	fs.DurationVar(&c.after, "after-target", 3*time.Second, "a run stops this long after it reached the target")
	fs.DurationVar(&c.evalEvery, "eval-every", time.Second, "evaluation interval (worker 0 of either system; see --eval-workers)")
	var evalWorkers string
	fs.StringVar(&evalWorkers, "eval-workers", "one", "which workers evaluate during training: one (worker 0 of either system: the same evaluation work for both) or all (every pspnode worker, and the median worker's accuracy counts; DDP's rank 0 alone, its parameters being every rank's)")
	fs.BoolVar(&c.resume, "resume", false, "reuse the runs an earlier invocation with the same settings saved in --out")
	fs.BoolVar(&c.probeOnly, "probe-only", false, "measure every tier's round trip and rate, write links.md, and stop")
	fs.IntVar(&c.joinParams, "join-params", 0, "instead of the comparison: on each tier, --workers − 1 workers of a model of this many parameters, then a joiner; how long it takes to get the job's model, against its bytes' wire time")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if all {
		tiersF, models, slows, seeds = tierNames(), "mlp,cnn", "none,sleep,cpu", "1,2,3"
	}
	switch evalWorkers {
	case "one":
	case "all":
		c.evalAll = true
	default:
		return nil, fmt.Errorf("--eval-workers %q: want one or all", evalWorkers)
	}
	for _, name := range split(tiersF) {
		t, ok := tierNamed(name)
		if !ok {
			return nil, fmt.Errorf("--tiers: no tier %q (have %s)", name, tierNames())
		}
		c.tiers = append(c.tiers, t)
	}
	for _, m := range split(models) {
		switch m {
		case "mlp":
			c.models = append(c.models, modelSpec{Name: "mlp", LR: lrMLP})
		case "cnn":
			c.models = append(c.models, modelSpec{Name: "cnn", LR: lrCNN, Momentum: momCNN})
		case "wide":
			c.models = append(c.models, modelSpec{Name: "wide", LR: lrWide, Momentum: momWide})
		default:
			return nil, fmt.Errorf("--models: no model %q (mlp, cnn, wide)", m)
		}
	}
	for _, s := range split(slows) {
		if s != slowNone && s != slowSleep && s != slowCPU {
			return nil, fmt.Errorf("--slow: no mode %q (none, sleep, cpu)", s)
		}
		c.slows = append(c.slows, s)
	}
	c.systems = split(systems)
	for _, s := range c.systems {
		if _, _, err := systemFlags(s); err != nil {
			return nil, err
		}
	}
	for _, s := range split(seeds) {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("--seeds: %q is not a seed", s)
		}
		c.seeds = append(c.seeds, v)
	}
	switch {
	case len(c.tiers) == 0 || len(c.models) == 0 || len(c.slows) == 0 || len(c.systems) == 0 || len(c.seeds) == 0:
		return nil, errors.New("nothing to run: --tiers, --models, --slow, --systems and --seeds each need one value")
	case c.workers < 2:
		return nil, fmt.Errorf("--workers %d: want 2 or more", c.workers)
	case c.slowN < 1 || c.slowN >= c.workers:
		return nil, fmt.Errorf("--slow-workers %d: want 1 to %d (--workers − 1: worker 0 is never slowed)", c.slowN, c.workers-1)
	case c.factor < 1:
		return nil, fmt.Errorf("--slow-factor %g: want 1 or more", c.factor)
	case c.target <= 0 || c.target >= 1:
		return nil, fmt.Errorf("--target %g: want an accuracy in (0, 1)", c.target)
	case c.maxDur <= 0 || c.after < 0 || c.evalEvery <= 0:
		return nil, errors.New("--max-duration and --eval-every must be positive, --after-target not negative")
	}
	if c.slowCores == 0 {
		c.slowCores = float64(runtime.NumCPU()) / float64(c.workers) / c.factor
	}
	return c, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// systemFlags is a system's `pspnode run` flags: none for ddp and default
// (the daemon's own), --barrier and --exchange for BARRIER[/EXCHANGE].
func systemFlags(sys string) (barrier, exchange string, err error) {
	switch sys {
	case "ddp", "default":
		return "", "", nil
	case "":
		return "", "", errors.New("--systems: an empty name")
	}
	barrier, exchange, _ = strings.Cut(sys, "/")
	if barrier == "" || strings.ContainsAny(sys, " \t") {
		return "", "", fmt.Errorf("--systems: %q is not ddp, default or BARRIER[/EXCHANGE]", sys)
	}
	return barrier, exchange, nil
}

// check says what this machine lacks to run the comparison.
func (c *config) check() error {
	var missing []string
	if err := netns.CheckLinks(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := os.Stat(c.bin); err != nil && !c.probeOnly {
		missing = append(missing, fmt.Sprintf("the pspnode binary %s (run make build)", c.bin))
	}
	if !c.probeOnly {
		if out, err := exec.Command(python, "-c", "import torch, grpc, numpy").CombinedOutput(); err != nil {
			missing = append(missing, fmt.Sprintf("%s with torch, grpc and numpy (Debian: python3-torch python3-grpcio python3-numpy python3-protobuf; %s)",
				python, strings.TrimSpace(lastLine(string(out)))))
		}
	}
	for _, m := range c.slows {
		if m == slowCPU {
			if err := cgroupCPU(); err != nil {
				missing = append(missing, err.Error())
			}
			break
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("this machine cannot run the comparison: it needs\n  - %s\n(scripts/test-deps.sh installs the Debian packages: make test-deps)", strings.Join(missing, "\n  - "))
	}
	return os.MkdirAll(c.out, 0o755)
}

// cgroupCPU says whether CPU quotas can be set.
func cgroupCPU() error {
	for _, f := range []string{"/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"} {
		if _, err := os.Stat(f); err == nil {
			return nil
		}
	}
	return errors.New("a cgroup cpu controller for --slow cpu (v1 cpu.cfs_quota_us or v2 cpu.max under /sys/fs/cgroup)")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// cells lists what runAll runs, in order: tiers, then models, then slow
// modes.
func (c *config) cells() []cell {
	var out []cell
	for _, t := range c.tiers {
		for _, m := range c.models {
			for _, s := range c.slows {
				out = append(out, cell{Tier: t, Model: m, Slow: s})
			}
		}
	}
	return out
}

// runAll measures each tier's link, runs every cell's seeds and systems
// (a seed's systems one after the other, so that a change in the
// machine's load falls on both), and writes the tables and figures.
func (c *config) runAll(ctx context.Context) error {
	began := time.Now()
	var probes []probe
	for _, t := range c.tiers {
		p, err := measure(ctx, t)
		if err != nil {
			return err
		}
		fmt.Println("link", p)
		probes = append(probes, p)
	}
	if err := writeProbes(c.out, probes); err != nil {
		return err
	}
	if c.probeOnly {
		return nil
	}
	cells := c.cells()
	total := len(cells) * len(c.seeds) * len(c.systems)
	var runs []run
	k := 0
	var spent time.Duration // on runs made here, for the estimate
	made := 0
	for _, cl := range cells {
		for _, seed := range c.seeds {
			for _, sys := range c.systems {
				k++
				head := fmt.Sprintf("[%d/%d] %s seed %d %s", k, total, cl, seed, label(sys))
				r, ok := c.saved(cl, sys, seed)
				if ok {
					fmt.Println(head, "(saved by an earlier invocation)")
				} else {
					eta := ""
					if made > 0 {
						eta = fmt.Sprintf(", about %s to go", (spent / time.Duration(made) * time.Duration(total-k+1)).Round(time.Minute))
					}
					fmt.Printf("%s (%s so far%s)\n", head, time.Since(began).Round(time.Second), eta)
					t0 := time.Now()
					var err error
					if r, err = c.one(ctx, cl, sys, seed); err != nil {
						return fmt.Errorf("%s seed %d %s: %w", cl, seed, sys, err)
					}
					r.Wall = time.Since(t0).Seconds()
					spent += time.Since(t0)
					made++
					c.save(r)
				}
				fmt.Println("  " + r.line(c.target))
				runs = append(runs, r)
			}
		}
	}
	took := time.Since(began)
	if err := c.report(runs, probes, took); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s (%s in all)\n", filepath.Join(c.out, "table.md"), filepath.Join(c.out, "summary.md"), took.Round(time.Second))
	return nil
}

func label(sys string) string {
	switch sys {
	case "ddp":
		return "torch DDP (gloo)"
	case "default":
		return "pspnode (run defaults)"
	}
	barrier, exchange, ok := strings.Cut(sys, "/")
	if !ok {
		return "pspnode " + barrier
	}
	return "pspnode " + barrier + ", " + exchange
}

// settings names what a run's figures depend on besides its cell, system
// and seed: a saved run is reused only under the same settings.
func (c *config) settings(cl cell) string {
	s := fmt.Sprintf("v4 workers=%d factor=%g cores=%g scale=%g target=%g batch=%d lr=%g momentum=%g max=%v after=%v eval=%v evalall=%v link=%v/%g",
		c.workers, c.factor, c.slowCores, c.scale, c.target, c.batch, cl.Model.LR, cl.Model.Momentum, c.maxDur, c.after, c.evalEvery,
		c.evalAll, cl.Tier.Link.Delay, cl.Tier.Link.Rate)
	if c.slowN != 1 {
		// One slow worker keeps the settings of the runs saved before
		// the flag was.
		s += fmt.Sprintf(" slow-workers=%d", c.slowN)
	}
	return s
}

// slowSet is which workers a cell's slow mode slows under seed: --slow-workers
// of workers 1 to n − 1 from worker 1 + (seed − 1) mod (n − 1) on, wrapping
// round; none in mode none. Worker 0 evaluates for either system and is
// never slowed. One slow worker of seeds 1 to n − 1 is worker (seed mod n),
// as before the flag was.
func (c *config) slowSet(mode string, seed int) []int {
	if mode == slowNone {
		return nil
	}
	n := c.workers - 1
	first := ((seed-1)%n + n) % n
	var out []int
	for j := range c.slowN {
		out = append(out, 1+(first+j)%n)
	}
	return out
}

func (c *config) savedPath(cl cell, sys string, seed int) string {
	name := fmt.Sprintf("run_%s_%s_%s_%s_seed%d.json", cl.Tier.Name, cl.Model.Name, cl.Slow, fileName(sys), seed)
	return filepath.Join(c.out, "runs", name)
}

func fileName(s string) string { return strings.NewReplacer(":", "-", "/", "_").Replace(s) }

type savedRun struct {
	Settings string `json:"settings"`
	Run      run    `json:"run"`
}

// save keeps a finished run in --out/runs, for --resume and the tables.
func (c *config) save(r run) {
	cl := cell{Tier: mustTier(r.Tier), Model: c.model(r.Model), Slow: r.Slow}
	b, err := json.MarshalIndent(savedRun{Settings: c.settings(cl), Run: r.forJSON()}, "", " ")
	if err == nil {
		_ = os.MkdirAll(filepath.Join(c.out, "runs"), 0o755)
		err = os.WriteFile(c.savedPath(cl, r.System, r.Seed), b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare: saving the run:", err)
	}
}

// saved returns the run an earlier invocation saved, with --resume and the
// same settings.
func (c *config) saved(cl cell, sys string, seed int) (run, bool) {
	if !c.resume {
		return run{}, false
	}
	b, err := os.ReadFile(c.savedPath(cl, sys, seed))
	var s savedRun
	if err != nil || json.Unmarshal(b, &s) != nil || s.Settings != c.settings(cl) || !slices.Equal(s.Run.slowSet(), c.slowSet(cl.Slow, seed)) {
		return run{}, false
	}
	return s.Run.fromJSON(), true
}

func mustTier(name string) tier {
	t, _ := tierNamed(name)
	return t
}

func (c *config) model(name string) modelSpec {
	for _, m := range c.models {
		if m.Name == name {
			return m
		}
	}
	return modelSpec{Name: name}
}

// loadAverage is the machine's 1-minute load average (0 where /proc is
// missing).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func secs(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return "not reached"
	}
	return fmt.Sprintf("%.1f s", s)
}
