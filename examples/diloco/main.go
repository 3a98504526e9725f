// Command diloco measures pspnode.DiLoCo beside DiLoCo over a blocking
// all-reduce and torch DDP: examples/diloco/charlm.py, a small
// character-level transformer on Debian's licence texts, with 4 workers,
// none slow or one slowed ×4 (its sleep per step, and a CPU quota through
// the cgroup v1 cpu controller), over several seeds. For each run it
// records the bytes each worker's network process wrote per trained sample
// (/proc/PID/io wchar: the pspnode daemon, or the gloo rank), the time to
// a target held-out loss, the final loss, CPU seconds and peak memory, and
// writes a table of medians over the seeds (table.md), every run
// (runs.json) and the loss curves (PNG) to --out.
//
//	go run ./examples/diloco --bin bin/pspnode --out results/diloco
//
// Systems: "diloco/BARRIER/EXCHANGE" (pspnode.DiLoCo, its daemon under
// that barrier and exchange), "allreduce" (the same outer step after a
// gloo all_reduce), "ddp", "psp/BARRIER/EXCHANGE" (pspnode.Optimizer, an
// exchange at every step) and "local" (one worker, for tuning); any of
// them with "@FLAGS", charlm.py flags for that system's workers alone
// ("diloco/pssp:2:4/epidemic:3:int8@--merge-wait=0.3").
//
// Tiers: "loopback" runs every worker on this machine's loopback. Run it
// as root (the CPU quotas need the cgroup file system).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/internal/figure"
)

const python = "/usr/bin/python3"

type config struct {
	bin, out, script string
	systems          []string
	tiers            []string
	slow             []int
	seeds            []int
	workers          int
	steps, h, batch  int
	lr, ddpLR        float64
	sleep, factor    float64
	quota            float64 // CPU cores per fast worker (its trainer and its daemon); 0: none
	target           float64
	deadline         time.Duration
	resume           bool
	extra            string // more charlm.py flags
}

// run is one system on one tier with one seed.
type run struct {
	Tier   string `json:"tier"`
	System string `json:"system"`
	Slow   int    `json:"slow_workers"`
	Seed   int    `json:"seed"`
	// BytesPerSample is what the workers' network processes wrote over
	// the samples they trained, all workers together.
	BytesPerSample float64 `json:"bytes_per_sample"`
	// WireBytes is what the workers' interfaces sent during the run
	// (emulated links; -1 on loopback): TCP/IP headers, retransmissions,
	// and every protocol of the daemon included.
	WireBytes int64 `json:"wire_bytes"`
	// TimeToTarget is when half the evaluating workers' held-out loss had
	// reached the target (null: not within the run).
	TimeToTarget *float64 `json:"time_to_target_s"`
	// FinalLoss is the median of the workers' final held-out losses (of
	// θ_outer under DiLoCo).
	FinalLoss  float64   `json:"final_loss"`
	Losses     []float64 `json:"final_losses"`
	Duration   float64   `json:"duration_s"`
	Samples    int64     `json:"samples"`
	Bytes      int64     `json:"bytes"`
	CPUSeconds float64   `json:"cpu_s"`
	PeakRSS    int64     `json:"peak_rss_bytes_per_worker"`
	Steps      []int     `json:"steps"`
	Load       float64   `json:"load_average"`
	// Merged is how many peers' models (or deltas) the workers' outer
	// steps merged (pspnode.DiLoCo).
	Merged int `json:"merged"`
	// DaemonOut is what the workers' daemons' streams carried out (the
	// models and every other protocol's messages, without TCP/IP
	// headers), and ModelsSent how many models (or moves) their exchanges
	// sent: with the model's encoded size they split the daemons' bytes
	// into the models' and the rest (pspnode systems; 0 otherwise).
	DaemonOut  int64 `json:"daemon_out_bytes"`
	ModelsSent int64 `json:"models_sent"`
	// StepAtTarget is worker 0's step when it reached the target.
	StepAtTarget int `json:"step_at_target"`
	// Params is the model's parameter count.
	Params int `json:"params"`
	// Curve is worker 0's held-out loss over time.
	Curve [][2]float64
}

func main() {
	var c config
	var systems, tiers, slow, seeds string
	flag.StringVar(&c.bin, "bin", "bin/pspnode", "the pspnode binary (make build)")
	flag.StringVar(&c.out, "out", "results/diloco", "where the table, runs.json and the figures go")
	flag.StringVar(&c.script, "script", "examples/diloco/charlm.py", "the worker")
	flag.StringVar(&systems, "systems", "diloco/pssp:2:4/epidemic:1,allreduce,ddp", "systems (see the package comment)")
	flag.StringVar(&tiers, "tiers", "loopback", "network tiers")
	flag.StringVar(&slow, "slow", "0,1", "numbers of slow workers")
	flag.StringVar(&seeds, "seeds", "1,2,3", "seeds of the data streams")
	flag.IntVar(&c.workers, "workers", 4, "workers")
	flag.IntVar(&c.steps, "steps", 800, "steps per worker (inner steps under DiLoCo)")
	flag.IntVar(&c.h, "H", 100, "inner steps per outer step")
	flag.IntVar(&c.batch, "batch", 8, "sequences per worker per step")
	flag.Float64Var(&c.lr, "lr", 3e-3, "AdamW's rate under DiLoCo (the inner one) and alone")
	flag.Float64Var(&c.ddpLR, "ddp-lr", 1e-2, "AdamW's rate under DDP and psp (one step of the averaged gradient of the workers' batches)")
	flag.Float64Var(&c.sleep, "sleep", 0.05, "seconds each step sleeps beside its compute")
	flag.Float64Var(&c.factor, "slow-factor", 4, "how much slower a slow worker is (its sleep and its CPU quota)")
	flag.Float64Var(&c.quota, "quota", 0.4, "CPU cores of a fast worker's trainer and daemon (0: no quota)")
	flag.Float64Var(&c.target, "target", 2.2, "the held-out loss to reach")
	flag.DurationVar(&c.deadline, "deadline", 10*time.Minute, "the longest a run may train")
	flag.BoolVar(&c.resume, "resume", false, "reuse the runs runs.json in --out holds")
	flag.StringVar(&c.extra, "extra", "", "more charlm.py flags for every worker")
	flag.Parse()
	var err error
	c.systems, c.tiers = strings.Split(systems, ","), strings.Split(tiers, ",")
	if c.slow, err = ints(slow); err == nil {
		c.seeds, err = ints(seeds)
	}
	if err == nil {
		err = c.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "diloco:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := c.runAll(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "diloco:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func (c *config) check() error {
	if _, err := os.Stat(c.bin); err != nil {
		return fmt.Errorf("--bin %s: %w (run make build)", c.bin, err)
	}
	if out, err := exec.Command(python, "-c", "import torch, grpc, numpy").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import torch, grpc and numpy: %s", python, strings.TrimSpace(string(out)))
	}
	for _, t := range c.tiers {
		if _, err := tierOf(t); err != nil {
			return err
		}
	}
	for _, s := range c.systems {
		if _, _, _, err := parseSystem(s); err != nil {
			return err
		}
	}
	return os.MkdirAll(c.out, 0o755)
}

// parseSystem returns a system's kind, its daemon's flags and its
// workers' own flags: a system may end with "@FLAGS", charlm.py flags
// that come after --extra's for its workers alone (the last of a flag
// given twice counts), e.g. "diloco/pssp:2:4/epidemic:3:int8@--merge-wait=0.3"
// or "allreduce@--H=200".
func parseSystem(s string) (kind string, daemonArgs, workerArgs []string, err error) {
	s, flags, _ := strings.Cut(s, "@")
	workerArgs = strings.Fields(flags)
	parts := strings.Split(s, "/")
	switch parts[0] {
	case "allreduce", "ddp", "local":
		if len(parts) > 1 {
			return "", nil, nil, fmt.Errorf("system %q: %s takes no barrier or exchange", s, parts[0])
		}
		return parts[0], nil, workerArgs, nil
	case "diloco", "psp":
		if len(parts) != 3 {
			return "", nil, nil, fmt.Errorf("system %q: want %s/BARRIER/EXCHANGE, e.g. %s/pssp:2:4/epidemic:1", s, parts[0], parts[0])
		}
		return parts[0], []string{"--barrier", parts[1], "--exchange", parts[2]}, workerArgs, nil
	}
	return "", nil, nil, fmt.Errorf("system %q: want diloco/B/X, allreduce, ddp, psp/B/X or local (each with an optional @FLAGS)", s)
}

func (c *config) runAll(ctx context.Context) error {
	saved := map[string]run{}
	if c.resume {
		if b, err := os.ReadFile(filepath.Join(c.out, "runs.json")); err == nil {
			var rs []run
			if err := json.Unmarshal(b, &rs); err != nil {
				return fmt.Errorf("runs.json: %w", err)
			}
			for _, r := range rs {
				saved[key(r.Tier, r.System, r.Slow, r.Seed)] = r
			}
		}
	}
	var runs []run
	began := time.Now()
	var links []string
	for _, t := range c.tiers {
		spec, _ := tierOf(t)
		p, err := spec.probe(ctx)
		if err != nil {
			return fmt.Errorf("probing tier %s: %w", t, err)
		}
		fmt.Println(p)
		links = append(links, p)
	}
	if err := os.WriteFile(filepath.Join(c.out, "links.md"), []byte(strings.Join(links, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	// The systems of one seed run one after the other, so that the
	// machine's other work weighs on each alike.
	for _, tier := range c.tiers {
		for _, sl := range c.slow {
			var curves []figure.Series
			for _, seed := range c.seeds {
				for _, sys := range c.systems {
					fmt.Printf("%s, %s, %d slow, seed %d ...\n", tier, sys, sl, seed)
					r, ok := saved[key(tier, sys, sl, seed)]
					if !ok {
						var err error
						if r, err = c.one(ctx, tier, sys, sl, seed); err != nil {
							return fmt.Errorf("%s on %s, %d slow, seed %d: %w", sys, tier, sl, seed, err)
						}
						runs = append(runs, r)
						if err := c.saveRuns(append(slices.Collect(mapsValues(saved)), runs...)); err != nil {
							return err
						}
					} else {
						runs = append(runs, r)
						fmt.Println("  (saved by an earlier invocation)")
					}
					fmt.Printf("  to loss %.2f: %s; final %.3f; %.0f bytes/sample; %.0f CPU-s; %.0f s (load %.1f)\n",
						c.target, secsP(r.TimeToTarget), r.FinalLoss, r.BytesPerSample, r.CPUSeconds, r.Duration, r.Load)
					if seed == c.seeds[0] {
						s := figure.Series{Name: sys}
						for _, p := range r.Curve {
							s.X, s.Y = append(s.X, p[0]), append(s.Y, p[1])
						}
						curves = append(curves, s)
					}
				}
			}
			name := fmt.Sprintf("loss_%s_slow%d.png", tier, sl)
			title := fmt.Sprintf("%s, %d workers, %d slowed ×%g (seed %d)", tier, c.workers, sl, c.factor, c.seeds[0])
			if err := figure.Lines(filepath.Join(c.out, name), figure.Options{Title: title, XLabel: "seconds",
				YLabel: "held-out loss of worker 0 (nats/char)"}, curves...); err != nil {
				return err
			}
		}
	}
	if err := c.saveRuns(mergeRuns(saved, runs)); err != nil {
		return err
	}
	if err := c.writeTable(runs, time.Since(began)); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s in all)\n", filepath.Join(c.out, "table.md"), time.Since(began).Round(time.Second))
	return nil
}

func key(tier, sys string, slow, seed int) string {
	return fmt.Sprintf("%s|%s|%d|%d", tier, sys, slow, seed)
}

func mapsValues(m map[string]run) func(func(run) bool) {
	return func(yield func(run) bool) {
		for _, r := range m {
			if !yield(r) {
				return
			}
		}
	}
}

func mergeRuns(saved map[string]run, runs []run) []run {
	all := map[string]run{}
	for k, r := range saved {
		all[k] = r
	}
	for _, r := range runs {
		all[key(r.Tier, r.System, r.Slow, r.Seed)] = r
	}
	return slices.Collect(mapsValues(all))
}

func (c *config) saveRuns(rs []run) error {
	slices.SortFunc(rs, func(a, b run) int {
		return strings.Compare(key(a.Tier, a.System, a.Slow, a.Seed), key(b.Tier, b.System, b.Slow, b.Seed))
	})
	b, err := json.MarshalIndent(rs, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.out, "runs.json"), b, 0o644)
}

// summary is what charlm.py writes.
type summary struct {
	Steps    int          `json:"steps"`
	Samples  int64        `json:"samples"`
	Elapsed  float64      `json:"elapsed_s"`
	Curve    [][3]float64 `json:"curve"` // seconds, step, loss
	Final    float64      `json:"final_loss"`
	Bytes    int64        `json:"bytes_written"`
	CPU      float64      `json:"cpu_s"`
	PeakRSS  int64        `json:"peak_rss"`
	Slow     bool         `json:"slow"`
	Params   int          `json:"params"`
	Corpus   string       `json:"corpus_sha256"`
	OuterSt  int          `json:"outer_steps"`
	OutBytes int64        `json:"daemon_out_bytes"`
	Merged   int          `json:"merged_total"`
	Sent     int64        `json:"updates_sent"`
}

// worker is one charlm.py process.
type worker struct {
	cmd                     *exec.Cmd
	summary, logPath, ready string
	slow                    bool
	done                    chan error
}

// one runs sys on tier with sl slow workers and seed: a fresh network,
// every worker started at once, training started at one instant once every
// worker is ready (connected to its daemon's job, or to gloo's group).
func (c *config) one(ctx context.Context, tierName, sys string, sl, seed int) (r run, err error) {
	kind, dargs, wargs, _ := parseSystem(sys)
	tier, _ := tierOf(tierName)
	dir, err := os.MkdirTemp("", "pspnode-diloco-")
	if err != nil {
		return run{}, err
	}
	defer os.RemoveAll(dir)
	n := c.workers
	if kind == "local" {
		n = 1
	}
	nw, err := tier.open(ctx, n)
	if err != nil {
		return run{}, err
	}
	var ws []*worker
	defer func() {
		for _, w := range ws {
			if w.cmd.ProcessState == nil {
				_ = w.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		for _, w := range ws {
			select {
			case <-w.done:
			case <-time.After(15 * time.Second):
				_ = w.cmd.Process.Kill()
				<-w.done
			}
			w.done <- nil
		}
		err = errors.Join(err, nw.close())
	}()
	lr := c.lr
	if kind == "ddp" || kind == "psp" {
		lr = c.ddpLR
	}
	pspnode := kind == "diloco" || kind == "psp"
	goFile, addrFile := filepath.Join(dir, "go"), filepath.Join(dir, "addr")
	port := 29500 // gloo's rendezvous, on worker 0's address
	if tier.Link == nil {
		if port, err = freePort(); err != nil {
			return run{}, err
		}
	}
	boot := ""
	for i := range n {
		slow := i >= n-sl // the last sl workers are slow
		w := &worker{summary: filepath.Join(dir, fmt.Sprintf("w%d.json", i)), logPath: filepath.Join(dir, fmt.Sprintf("w%d.log", i)),
			ready: filepath.Join(dir, fmt.Sprintf("w%d.ready", i)), slow: slow, done: make(chan error, 1)}
		args := []string{c.script, "--system", kind, "--rank", strconv.Itoa(i), "--world", strconv.Itoa(n),
			"--steps", strconv.Itoa(c.steps), "--H", strconv.Itoa(c.h), "--batch", strconv.Itoa(c.batch),
			"--lr", fmt.Sprint(lr), "--sleep", fmt.Sprint(c.sleep), "--slow-factor", fmt.Sprint(c.factor),
			"--seed", strconv.Itoa(seed), "--deadline", fmt.Sprint(c.deadline.Seconds()), "--bin", c.bin,
			"--job", fmt.Sprintf("diloco-%d", os.Getpid()), "--master", fmt.Sprintf("%s:%d", nw.addr(0), port),
			"--listen", fmt.Sprintf("/ip4/%s/tcp/0", nw.addr(i)), "--ready-file", w.ready, "--go-file", goFile,
			"--out", w.summary}
		if slow {
			args = append(args, "--slow")
		}
		if len(dargs) > 0 {
			args = append(args, "--daemon-args", strings.Join(dargs, " "))
		}
		if pspnode && i == 0 {
			args = append(args, "--addr-file", addrFile)
		}
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		args = append(append(args, strings.Fields(c.extra)...), wargs...)
		w.cmd = nw.command(i, python, args...)
		w.cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "OMP_NUM_THREADS=1"), nw.env()...)
		w.cmd.SysProcAttr = childAttr()
		logf, err := os.Create(w.logPath)
		if err != nil {
			return run{}, err
		}
		w.cmd.Stdout, w.cmd.Stderr = logf, logf
		if err := w.cmd.Start(); err != nil {
			logf.Close()
			return run{}, err
		}
		go func() { w.done <- w.cmd.Wait(); logf.Close() }()
		ws = append(ws, w)
		if c.quota > 0 {
			q := c.quota
			if slow {
				q /= c.factor
			}
			if err := nw.limit(i, w.cmd.Process.Pid, q); err != nil {
				return run{}, err
			}
		}
		if pspnode && i == 0 {
			if boot, err = waitFile(ctx, addrFile, w, 2*time.Minute); err != nil {
				return run{}, fmt.Errorf("worker 0's daemon address: %w\n%s", err, tail(w.logPath))
			}
		}
	}
	for i, w := range ws {
		if _, err := waitFile(ctx, w.ready, w, 3*time.Minute); err != nil {
			return run{}, fmt.Errorf("worker %d was not ready: %w\n%s", i, err, tail(w.logPath))
		}
	}
	tx0 := make([]int64, n)
	for i := range ws {
		tx0[i] = nw.txBytes(ctx, i)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		return run{}, err
	}
	// A pspnode job's fast workers end on their own; its slow ones are
	// told to stop then (they have no step count to share). Gloo's ranks
	// end together.
	limit := c.deadline + 3*time.Minute
	timeout := time.After(limit)
	for i, w := range ws {
		if w.slow && pspnode {
			continue
		}
		select {
		case err := <-w.done:
			w.done <- err
			if err != nil {
				return run{}, fmt.Errorf("worker %d: %v\n%s", i, err, tail(w.logPath))
			}
		case <-timeout:
			return run{}, fmt.Errorf("worker %d did not end within %v\n%s", i, limit, tail(w.logPath))
		case <-ctx.Done():
			return run{}, ctx.Err()
		}
	}
	for i, w := range ws {
		if !w.slow || !pspnode {
			continue
		}
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-w.done:
			w.done <- err
			if _, serr := os.Stat(w.summary); err != nil && serr != nil { // ended by the signal before its summary
				return run{}, fmt.Errorf("slow worker %d: %v\n%s", i, err, tail(w.logPath))
			}
		case <-time.After(2 * time.Minute):
			return run{}, fmt.Errorf("slow worker %d did not stop\n%s", i, tail(w.logPath))
		}
	}
	r, err = c.tally(tierName, sys, sl, seed, ws)
	if err != nil {
		return run{}, err
	}
	r.WireBytes = -1
	if tx0[0] >= 0 {
		r.WireBytes = 0
		for i := range ws {
			r.WireBytes += nw.txBytes(ctx, i) - tx0[i]
		}
	}
	return r, nil
}

// tally makes the run of its workers' summaries.
func (c *config) tally(tier, sys string, sl, seed int, ws []*worker) (run, error) {
	r := run{Tier: tier, System: sys, Slow: sl, Seed: seed, Load: loadAverage()}
	var reached []float64
	evaluating := 0
	var curves [][][3]float64
	for i, w := range ws {
		b, err := os.ReadFile(w.summary)
		var s summary
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil {
			return run{}, fmt.Errorf("worker %d's summary: %w\n%s", i, err, tail(w.logPath))
		}
		r.Samples += s.Samples
		r.Bytes += s.Bytes
		r.CPUSeconds += s.CPU
		r.PeakRSS = max(r.PeakRSS, s.PeakRSS)
		r.Duration = max(r.Duration, s.Elapsed)
		r.Steps = append(r.Steps, s.Steps)
		r.Merged += s.Merged
		r.DaemonOut += s.OutBytes
		r.ModelsSent += s.Sent
		r.Losses = append(r.Losses, s.Final)
		r.Params = s.Params
		if len(s.Curve) == 0 {
			continue // a DDP rank other than 0: rank 0's curve is every rank's
		}
		evaluating++
		curves = append(curves, s.Curve)
		for _, p := range s.Curve {
			if p[2] <= c.target {
				reached = append(reached, p[0])
				break
			}
		}
	}
	r.BytesPerSample = float64(r.Bytes) / float64(max(r.Samples, 1))
	r.FinalLoss = median(r.Losses)
	half := (evaluating + 1) / 2
	if len(reached) >= half && half > 0 {
		slices.Sort(reached)
		t := reached[half-1]
		r.TimeToTarget = &t
	}
	if len(curves) > 0 { // worker 0's (never a slow one; DDP's rank 0 holds every rank's parameters)
		for _, p := range curves[0] {
			r.Curve = append(r.Curve, [2]float64{p[0], p[2]})
			if r.TimeToTarget != nil && r.StepAtTarget == 0 && p[2] <= c.target {
				r.StepAtTarget = int(p[1])
			}
		}
		if r.TimeToTarget != nil && r.StepAtTarget == 0 { // worker 0 was not among the first half
			r.StepAtTarget = int(curves[0][len(curves[0])-1][1])
		}
	}
	return r, nil
}

// waitFile waits for a file that w writes, and returns its contents.
func waitFile(ctx context.Context, path string, w *worker, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		select {
		case err := <-w.done:
			w.done <- err
			return "", fmt.Errorf("the worker ended: %v", err)
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return "", errors.New("timed out")
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// loadAverage is the machine's 1-minute load average.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return math.NaN()
	}
	f := strings.Fields(string(b))
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
