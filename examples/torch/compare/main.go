package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/examples/torch/evals"
	"github.com/pspnode/pspnode/internal/figure"
)

const python = "/usr/bin/python3"

type config struct {
	bin, out               string
	workers                []int
	slow                   []float64
	systems                []string
	factor, scale, target  float64
	lr                     float64
	batch                  int
	fast, slowD, evalEvery time.Duration
	seed                   int
	resume                 bool
}

// run is one system at one size and slow share.
type run struct {
	System   string  `json:"system"`
	Workers  int     `json:"workers"`
	Slow     float64 `json:"slow_share"`
	Duration float64 `json:"duration_s"`
	// TimeToTarget is when half the workers had reached the target
	// (NaN, null in JSON: not within the run).
	TimeToTarget  float64  `json:"-"`
	TimeToTargetJ *float64 `json:"time_to_target_s"`
	StepsPerS     float64  `json:"steps_per_s_per_worker"`
	FinalAccuracy float64  `json:"final_accuracy"`
	BytesPerStep  float64  `json:"bytes_per_worker_step"`
	CPUSeconds    float64  `json:"cpu_s"`
	// PeakRSS is the largest resident set of one worker: its trainer
	// process plus, for pspnode, its daemon.
	PeakRSS int64 `json:"peak_rss_bytes_per_worker"`
	// Load is the machine's 1-minute load average when the run ended:
	// other work on the machine slows pspnode's daemons and the trainers.
	Load  float64      `json:"load_average"`
	Curve [][2]float64 `json:"-"` // (time, median accuracy)
}

func main() {
	var c config
	var workers, slow, systems string
	flag.StringVar(&c.bin, "bin", "bin/pspnode", "the pspnode binary (make build)")
	flag.StringVar(&c.out, "out", "results/ddp", "where the table, the CSV files and the figures go")
	flag.StringVar(&workers, "workers", "4,8", "worker counts")
	flag.StringVar(&slow, "slow", "0,0.25", "shares of slow workers")
	flag.StringVar(&systems, "systems", "ddp,pssp:2:4,asp,pssp:2:4/epidemic:2", "systems to run: ddp, or a pspnode barrier spec with an optional /EXCHANGE (e.g. pssp:2:4/epidemic:2)")
	flag.Float64Var(&c.factor, "slow-factor", 4, "how much slower a slow worker's task time is")
	flag.Float64Var(&c.scale, "time-scale", 0.05, "task time per step: (Exp(1)+1) × this seconds")
	flag.Float64Var(&c.target, "target", 0.9, "the held-out accuracy to reach")
	flag.Float64Var(&c.lr, "lr", 0.1, "learning rate (DDP averages the gradients; pspnode scales each update by 1/N)")
	flag.IntVar(&c.batch, "batch", 32, "batch size per worker")
	flag.DurationVar(&c.fast, "duration", 75*time.Second, "run length without slow workers")
	flag.DurationVar(&c.slowD, "duration-slow", 120*time.Second, "run length with slow workers")
	flag.DurationVar(&c.evalEvery, "eval-every", time.Second, "evaluation interval of each worker")
	flag.IntVar(&c.seed, "seed", 1, "seed of the batch orders and task times")
	flag.BoolVar(&c.resume, "resume", false, "reuse the runs an earlier, interrupted invocation with the same settings saved in --out")
	flag.Parse()
	var err error
	if c.workers, err = ints(workers); err == nil {
		c.slow, err = floats(slow)
	}
	c.systems = strings.Split(systems, ",")
	if err == nil {
		err = c.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(2)
	}
	if err := c.runAll(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func (c *config) check() error {
	if _, err := os.Stat(c.bin); err != nil {
		return fmt.Errorf("--bin %s: %w (run make build)", c.bin, err)
	}
	if out, err := exec.Command(python, "-c", "import torch, grpc, numpy").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import torch, grpc and numpy: %s (install python3-torch python3-grpcio python3-numpy)", python, strings.TrimSpace(string(out)))
	}
	for _, s := range c.systems {
		if s == "" {
			return fmt.Errorf("--systems: an empty name")
		}
	}
	return os.MkdirAll(c.out, 0o755)
}

func (c *config) runAll() error {
	var runs []run
	began := time.Now()
	for _, w := range c.workers {
		for _, sl := range c.slow {
			var curves []figure.Series
			for _, sys := range c.systems {
				fmt.Printf("%s, %d workers, %.0f %% slow ...\n", sys, w, 100*sl)
				r, ok := c.saved(sys, w, sl)
				if !ok {
					var err error
					if r, err = c.one(sys, w, sl); err != nil {
						return fmt.Errorf("%s with %d workers: %w", sys, w, err)
					}
					c.save(r)
				} else {
					fmt.Println("  (saved by an earlier invocation)")
				}
				fmt.Printf("  to %.0f %%: %s, %.2f steps/s per worker, final %.3f, %.0f bytes/step, %.0f CPU-s\n",
					100*c.target, secs(r.TimeToTarget), r.StepsPerS, r.FinalAccuracy, r.BytesPerStep, r.CPUSeconds)
				runs = append(runs, r)
				s := figure.Series{Name: label(sys)}
				for _, p := range r.Curve {
					s.X, s.Y = append(s.X, p[0]), append(s.Y, p[1])
				}
				curves = append(curves, s)
			}
			name := fmt.Sprintf("accuracy_%dw_slow%.0f.png", w, 100*sl)
			title := fmt.Sprintf("%d workers, %.0f %% slowed ×%g", w, 100*sl, c.factor)
			if err := figure.Lines(filepath.Join(c.out, name), figure.Options{Title: title, XLabel: "seconds",
				YLabel: "held-out accuracy (median worker)", LegendBottom: true}, curves...); err != nil {
				return err
			}
		}
	}
	if err := c.write(runs, time.Since(began)); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s in all)\n", filepath.Join(c.out, "table.md"), time.Since(began).Round(time.Second))
	return nil
}

func label(sys string) string {
	if sys == "ddp" {
		return "torch DDP (gloo)"
	}
	barrier, exchange, ok := strings.Cut(sys, "/")
	if !ok {
		exchange = "gossip"
	}
	return "pspnode " + barrier + ", " + exchange
}

func secs(s float64) string {
	if math.IsNaN(s) {
		return "not reached"
	}
	return fmt.Sprintf("%.1f s", s)
}

// worker is one training process and, for pspnode, its daemon.
type worker struct {
	cmd     *exec.Cmd
	daemon  *exec.Cmd
	csv     string
	summary string
	done    chan error
}

// one runs one system with w workers, a share sl of them slow.
func (c *config) one(sys string, w int, sl float64) (run, error) {
	dur := c.fast
	if sl > 0 {
		dur = c.slowD
	}
	dir, err := os.MkdirTemp("", "pspnode-compare-")
	if err != nil {
		return run{}, err
	}
	defer os.RemoveAll(dir)
	nslow := int(math.Round(sl * float64(w)))
	var ws []*worker
	defer func() {
		for _, wk := range ws {
			for _, p := range []*exec.Cmd{wk.cmd, wk.daemon} {
				if p != nil && p.Process != nil {
					_ = p.Process.Kill()
				}
			}
		}
		for _, wk := range ws {
			<-wk.done
			if wk.daemon != nil && wk.daemon.ProcessState == nil {
				_ = wk.daemon.Wait()
			}
		}
	}()
	var port int
	if sys == "ddp" {
		if port, err = freePort(); err != nil {
			return run{}, err
		}
	}
	var boot string
	startAt := time.Now().Add(time.Duration(10+4*w) * time.Second)
	for i := range w {
		wk, addr, err := c.startWorker(dir, sys, i, w, i < nslow, port, startAt, dur, boot)
		if err != nil {
			return run{}, err
		}
		if boot == "" {
			boot = addr
		}
		ws = append(ws, wk)
	}
	// Bytes the daemons write, from when training starts.
	time.Sleep(time.Until(startAt))
	var daemonW0 []int64
	for _, wk := range ws {
		if wk.daemon != nil {
			daemonW0 = append(daemonW0, wchar(wk.daemon.Process.Pid))
		}
	}
	for i, wk := range ws {
		select {
		case err := <-wk.done:
			wk.done <- err
			if err != nil {
				log, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("w%d.log", i)))
				return run{}, fmt.Errorf("worker %d: %v\n%s", i, err, log)
			}
		case <-time.After(dur + 2*time.Minute):
			return run{}, fmt.Errorf("worker %d did not end", i)
		}
	}
	var daemonBytes int64
	for i, wk := range ws {
		if wk.daemon != nil {
			daemonBytes += wchar(wk.daemon.Process.Pid) - daemonW0[i]
			_ = wk.daemon.Process.Signal(syscall.SIGTERM)
			_ = wk.daemon.Wait()
		}
	}
	return c.tally(sys, w, sl, dur, ws, daemonBytes)
}

// startWorker starts worker i of w (slowed if slow), and for pspnode its
// daemon, joined through boot (none: it is the first) and returned addr.
// Workers wait until startAt and train for dur.
func (c *config) startWorker(dir, sys string, i, w int, slow bool, port int, startAt time.Time, dur time.Duration, boot string) (*worker, string, error) {
	var addr string
	wk := &worker{csv: filepath.Join(dir, fmt.Sprintf("w%d.csv", i)), summary: filepath.Join(dir, fmt.Sprintf("w%d.json", i)), done: make(chan error, 1)}
	args := []string{filepath.Join("examples", "torch", "mnist.py"), "--shard", strconv.Itoa(i), "--shards", strconv.Itoa(w),
		"--batch", strconv.Itoa(c.batch), "--lr", fmt.Sprint(c.lr), "--time-scale", fmt.Sprint(c.scale),
		"--eval-every", fmt.Sprint(c.evalEvery.Seconds()), "--duration", fmt.Sprint(dur.Seconds()),
		"--seed", strconv.Itoa(1000*c.seed + i), "--out", wk.csv, "--summary", wk.summary, "--log", "warning",
		"--start-at", fmt.Sprint(float64(startAt.UnixNano()) / 1e9)}
	if slow {
		args = append(args, "--slow-factor", fmt.Sprint(c.factor))
	}
	env := append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "OMP_NUM_THREADS=1")
	switch sys {
	case "ddp":
		args = append(args, "--ddp", "--rank", strconv.Itoa(i), "--world", strconv.Itoa(w))
		env = append(env, "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
	default:
		barrier, exchange, ok := strings.Cut(sys, "/")
		if !ok {
			exchange = "gossip"
		}
		sock := filepath.Join(dir, fmt.Sprintf("d%d.sock", i))
		d, a, err := c.daemon(dir, i, sock, barrier, exchange, boot)
		if err != nil {
			return nil, "", err
		}
		wk.daemon, addr = d, a
		args = append(args, "--daemon", "unix:"+sock)
	}
	wk.cmd = exec.Command(python, args...)
	wk.cmd.Env = env
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("w%d.log", i)))
	if err != nil {
		return nil, "", err
	}
	wk.cmd.Stdout, wk.cmd.Stderr = logf, logf
	if err := wk.cmd.Start(); err != nil {
		return nil, "", err
	}
	go func() { wk.done <- wk.cmd.Wait(); logf.Close() }()
	return wk, addr, nil
}

// tally is the run of sys from its workers' summaries and evaluation
// files, and the processes' resource use; daemonBytes is what the
// daemons wrote during training.
func (c *config) tally(sys string, w int, sl float64, dur time.Duration, ws []*worker, daemonBytes int64) (run, error) {
	var cpu float64
	var peak int64
	for _, wk := range ws {
		c1, p1 := usage(wk.cmd)
		c2, p2 := usage(wk.daemon)
		cpu += c1 + c2
		peak = max(peak, p1+p2)
	}
	r := run{System: sys, Workers: w, Slow: sl, Duration: dur.Seconds(), TimeToTarget: math.NaN()}
	var curves [][]evals.Eval
	var steps, bytes int64
	var elapsed, final float64
	for i, wk := range ws {
		var s struct {
			Steps   int64   `json:"steps"`
			Elapsed float64 `json:"elapsed_s"`
			Final   float64 `json:"final_accuracy"`
			Bytes   int64   `json:"bytes_written"`
		}
		b, err := os.ReadFile(wk.summary)
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil {
			return run{}, fmt.Errorf("worker %d summary: %w", i, err)
		}
		steps += s.Steps
		bytes += s.Bytes
		elapsed += s.Elapsed
		final += s.Final
		// DDP ranks hold the same parameters: rank 0 alone evaluates
		// during the run (mnist.py), and its curve is every rank's.
		if sys == "ddp" && i > 0 {
			continue
		}
		ev, err := readEvals(wk.csv)
		if err != nil {
			return run{}, err
		}
		curves = append(curves, ev)
	}
	if sys != "ddp" {
		bytes = daemonBytes
	}
	r.StepsPerS = float64(steps) / elapsed
	r.FinalAccuracy = final / float64(w)
	r.BytesPerStep = float64(bytes) / float64(max(steps, 1))
	r.CPUSeconds, r.PeakRSS = cpu, peak
	r.Load = loadAverage()
	r.Curve, r.TimeToTarget = medianCurve(curves, c.target, dur.Seconds())
	c.saveCurve(r)
	return r, nil
}

// daemon starts `pspnode run --trainer` for worker i.
func (c *config) daemon(dir string, i int, sock, barrier, exchange, boot string) (*exec.Cmd, string, error) {
	args := []string{"run", "--job", "compare", "--listen", "/ip4/127.0.0.1/tcp/0", "--trainer", "unix:" + sock,
		"--barrier", barrier, "--exchange", exchange, "--nat-traversal=false", "--log-level", "warn"}
	if boot != "" {
		args = append(args, "--bootstrap", boot)
	}
	cmd := exec.Command(c.bin, args...)
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("d%d.log", i)))
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	sc := bufio.NewScanner(out)
	addr := ""
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "listening: ") && addr == "" {
			addr = strings.TrimPrefix(l, "listening: ")
		}
		if strings.HasPrefix(l, "trainer: ") {
			go func() { _, _ = bufio.NewReader(out).WriteTo(discard{}) }()
			return cmd, addr, nil
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	log, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("d%d.log", i)))
	return nil, "", fmt.Errorf("daemon %d did not start:\n%s", i, log)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// medianCurve is the median accuracy over workers at each second, each
// worker at its latest evaluation, and the first time it reaches target.
func medianCurve(curves [][]evals.Eval, target, dur float64) ([][2]float64, float64) {
	var curve [][2]float64
	reached := math.NaN()
	for t := 0.0; t <= dur+1e-9; t += 0.5 {
		var accs []float64
		for _, ev := range curves {
			acc := math.NaN()
			for _, e := range ev {
				if e.Time <= t {
					acc = e.Accuracy
				}
			}
			if !math.IsNaN(acc) {
				accs = append(accs, acc)
			}
		}
		if len(accs) < len(curves) {
			continue
		}
		slices.Sort(accs)
		// The lower median: half the workers are at least this good.
		m := accs[(len(accs)-1)/2]
		if len(accs)%2 == 0 {
			m = accs[len(accs)/2]
		}
		curve = append(curve, [2]float64{t, m})
		if math.IsNaN(reached) && m >= target {
			reached = t
		}
	}
	return curve, reached
}

// readEvals reads a worker's evaluations; a worker without any failed.
func readEvals(path string) ([]evals.Eval, error) {
	ev, err := evals.Read(path)
	if err == nil && len(ev) == 0 {
		err = errors.New(path + ": no evaluations")
	}
	return ev, err
}

func (c *config) saveCurve(r run) {
	rows := [][]string{}
	for _, p := range r.Curve {
		rows = append(rows, []string{fmt.Sprint(p[0]), fmt.Sprintf("%.4f", p[1])})
	}
	_ = figure.CSV(filepath.Join(c.out, fmt.Sprintf("curve_%s_%dw_slow%.0f.csv", strings.NewReplacer(":", "-", "/", "_").Replace(r.System), r.Workers, 100*r.Slow)),
		[]string{"time_s", "median_accuracy"}, rows)
}

// settings names what a run's figures depend on besides its system, size
// and slow share: a saved run is reused only under the same settings.
func (c *config) settings() string {
	return fmt.Sprintf("factor=%g scale=%g target=%g lr=%g batch=%d fast=%v slow=%v eval=%v seed=%d",
		c.factor, c.scale, c.target, c.lr, c.batch, c.fast, c.slowD, c.evalEvery, c.seed)
}

type savedRun struct {
	Settings string       `json:"settings"`
	Run      run          `json:"run"`
	Time     *float64     `json:"time_to_target_s"`
	Curve    [][2]float64 `json:"curve"`
}

func (c *config) savedPath(sys string, w int, sl float64) string {
	return filepath.Join(c.out, fmt.Sprintf("run_%s_%dw_slow%.0f.json", strings.NewReplacer(":", "-", "/", "_").Replace(sys), w, 100*sl))
}

// save keeps one finished run in --out, so that an interrupted invocation
// can be resumed (--resume).
func (c *config) save(r run) {
	s := savedRun{Settings: c.settings(), Run: r, Curve: r.Curve}
	if !math.IsNaN(r.TimeToTarget) {
		s.Time = &r.TimeToTarget
	}
	if b, err := json.Marshal(s); err == nil {
		_ = os.WriteFile(c.savedPath(r.System, r.Workers, r.Slow), b, 0o644)
	}
}

// saved returns the run an earlier invocation saved, with --resume and the
// same settings.
func (c *config) saved(sys string, w int, sl float64) (run, bool) {
	if !c.resume {
		return run{}, false
	}
	b, err := os.ReadFile(c.savedPath(sys, w, sl))
	var s savedRun
	if err != nil || json.Unmarshal(b, &s) != nil || s.Settings != c.settings() {
		return run{}, false
	}
	r := s.Run
	r.Curve, r.TimeToTarget = s.Curve, math.NaN()
	if s.Time != nil {
		r.TimeToTarget = *s.Time
	}
	return r, true
}

func (c *config) write(runs []run, took time.Duration) error {
	for i := range runs {
		if t := runs[i].TimeToTarget; !math.IsNaN(t) {
			runs[i].TimeToTargetJ = &t
		}
	}
	b, err := json.MarshalIndent(runs, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "runs.json"), b, 0o644); err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "| workers | slow | system | time to %.0f %% | vs DDP | steps/s per worker | final accuracy | bytes sent per worker per step | CPU s | peak RSS per worker | load |\n", 100*c.target)
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	ddp := map[[2]float64]float64{}
	for _, r := range runs {
		if r.System == "ddp" {
			ddp[[2]float64{float64(r.Workers), r.Slow}] = r.TimeToTarget
		}
	}
	for _, r := range runs {
		ratio := "—"
		if d, ok := ddp[[2]float64{float64(r.Workers), r.Slow}]; ok && r.System != "ddp" && !math.IsNaN(d) && !math.IsNaN(r.TimeToTarget) {
			ratio = fmt.Sprintf("%.2f×", r.TimeToTarget/d)
		}
		slow := "none"
		if r.Slow > 0 {
			slow = fmt.Sprintf("%.0f %% ×%g", 100*r.Slow, c.factor)
		}
		fmt.Fprintf(&sb, "| %d | %s | %s | %s | %s | %.2f | %.3f | %s | %.0f | %s | %.1f |\n", r.Workers, slow, label(r.System),
			secs(r.TimeToTarget), ratio, r.StepsPerS, r.FinalAccuracy, humanBytes(r.BytesPerStep), r.CPUSeconds, humanBytes(float64(r.PeakRSS)), r.Load)
	}
	fmt.Fprintf(&sb, "\nTask time (Exp(1)+1)·%g s per step, batch %d, learning rate %g, runs of %v (%v with slow workers); %v in all.\n",
		c.scale, c.batch, c.lr, c.fast, c.slowD, took.Round(time.Second))
	return os.WriteFile(filepath.Join(c.out, "table.md"), []byte(sb.String()), 0o644)
}

func humanBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f kB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// wchar is what process pid has written (to files and sockets).
func wchar(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// usage is the CPU seconds and peak resident bytes of an ended process.
func usage(p *exec.Cmd) (cpu float64, peak int64) {
	if p == nil || p.ProcessState == nil {
		return 0, 0
	}
	cpu = (p.ProcessState.UserTime() + p.ProcessState.SystemTime()).Seconds()
	if ru, ok := p.ProcessState.SysUsage().(*syscall.Rusage); ok {
		peak = ru.Maxrss * 1024
	}
	return cpu, peak
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 2 {
			return nil, fmt.Errorf("%q: want whole numbers >= 2", s)
		}
		out = append(out, v)
	}
	return out, nil
}

func floats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || v >= 1 {
			return nil, fmt.Errorf("%q: want shares in [0, 1)", s)
		}
		out = append(out, v)
	}
	return out, nil
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
