package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/examples/torch/evals"
	"github.com/pspnode/pspnode/internal/netns"
)

// run is one system on one cell with one seed.
type run struct {
	Tier   string `json:"tier"`
	Model  string `json:"model"`
	Slow   string `json:"slow"`
	System string `json:"system"`
	Seed   int    `json:"seed"`
	// SlowWorker is the first slowed worker's index (-1: none);
	// SlowWorkers every slowed worker's (with --slow-workers above 1).
	SlowWorker  int     `json:"slow_worker"`
	SlowWorkers []int   `json:"slow_workers,omitempty"`
	Duration    float64 `json:"duration_s"`
	// TimeToTarget is when the evaluations that count (curves) reached
	// the target; NaN when they did not.
	TimeToTarget float64 `json:"-"`
	// StepsPerS is steps per second per worker; SlowStepsPerS the slowed
	// workers' own (their steps over their time; NaN without one).
	StepsPerS     float64 `json:"steps_per_s_per_worker"`
	SlowStepsPerS float64 `json:"-"`
	FinalAccuracy float64 `json:"final_accuracy"`
	// BytesPerStep is what the workers' network interfaces sent (headers
	// included), per worker and step.
	BytesPerStep float64 `json:"bytes_per_worker_step"`
	// CPUSeconds is every worker process's CPU (trainers, daemons);
	// LinkCPU the link emulation's during training (this process's: the
	// switch runs in it), SwitchCPU the switch thread's alone;
	// LinkDropped the frames its full queues dropped.
	CPUSeconds  float64 `json:"cpu_s"`
	LinkCPU     float64 `json:"link_cpu_s"`
	SwitchCPU   float64 `json:"switch_cpu_s"`
	LinkDropped int64   `json:"link_dropped_frames"`
	// PeakRSS is the largest of the workers' peak resident sets (trainer
	// plus daemon).
	PeakRSS int64 `json:"peak_rss_bytes_per_worker"`
	// Where CPUSeconds went (summed over the workers, CPU seconds):
	// TrainerCPU and DaemonCPU are the trainers' and the daemons' whole
	// lives (set-up included); DaemonTrainCPU the daemons' during
	// training. From the trainers' summaries, during training: TrainCPU
	// their processes' CPU, ComputeCPU the batches' forward and backward,
	// StepCPU the optimizer's step (pspnode.Optimizer.step: the training
	// thread's part), EvalCPU the evaluations, of which there were
	// Evaluations; StepWall the optimizer steps' wall time (waiting at the
	// barrier, DDP's all-reduce), EvalWall the evaluations'; RunQueue the
	// time the training threads waited for a CPU (a busy machine). Steps
	// is every worker's steps; CPUToTarget
	// every worker process's CPU from the start of training until the
	// target was reached (NaN when it was not).
	TrainerCPU     float64 `json:"trainer_cpu_s"`
	DaemonCPU      float64 `json:"daemon_cpu_s"`
	DaemonTrainCPU float64 `json:"daemon_train_cpu_s"`
	TrainCPU       float64 `json:"trainer_train_cpu_s"`
	ComputeCPU     float64 `json:"compute_cpu_s"`
	StepCPU        float64 `json:"step_cpu_s"`
	EvalCPU        float64 `json:"eval_cpu_s"`
	Evaluations    int64   `json:"evaluations"`
	StepWall       float64 `json:"step_wall_s"`
	EvalWall       float64 `json:"eval_wall_s"`
	RunQueue       float64 `json:"run_queue_s"`
	Steps          int64   `json:"steps"`
	CPUToTarget    float64 `json:"-"`
	// Staleness is psp_update_staleness_steps over every daemon; nil when
	// no daemon serves it (DDP, or a daemon without the metric).
	Staleness *staleness `json:"staleness,omitempty"`
	// Lineages are the daemons' /status lineages at the end, one per
	// daemon ("" when unread); Forked says they were not all one.
	Lineages []string `json:"lineages,omitempty"`
	Forked   bool     `json:"forked"`
	// Settings is the barrier and exchange the daemons reported in
	// /status ("pssp:10:4, epidemic:4"): what a system of the daemon's
	// defaults ran.
	Settings string `json:"daemon_settings,omitempty"`
	// StartLate is the most a worker started after the common start time.
	StartLate float64 `json:"start_late_s"`
	// Load is the 1-minute load average at the end; Wall the run's wall
	// time, set-up and teardown included.
	Load float64 `json:"load_average"`
	Wall float64 `json:"wall_s"`
	// Setup is from the run's start until every trainer was ready; Train
	// from the common start until every trainer had ended.
	Setup float64 `json:"setup_s"`
	// From the launch of the workers' processes (all at once, as a user
	// starts a job: the daemons' peer IDs are known before): until every
	// worker had taken its first step (FirstStep), and until the target
	// (ToTarget: the time from the go signal to the target, TimeToTarget,
	// plus the time from the launch to the go signal). Both count the
	// harness's go signal, 0.3 s after the last trainer was set up; NaN
	// when not reached.
	FromLaunch struct {
		FirstStep float64 `json:"-"`
		ToTarget  float64 `json:"-"`
		// JSON forms.
		FirstStepJ *float64 `json:"first_step_s"`
		ToTargetJ  *float64 `json:"target_s"`
	} `json:"from_launch"`
	Train float64      `json:"train_s"`
	Curve [][2]float64 `json:"curve"` // (time, the accuracy that counts: worker 0's, or the median worker's)

	// JSON forms of the fields that may be NaN.
	TimeToTargetJ  *float64 `json:"time_to_target_s"`
	SlowStepsPerSJ *float64 `json:"slow_worker_steps_per_s,omitempty"`
	CPUToTargetJ   *float64 `json:"cpu_to_target_s,omitempty"`
}

// slowSet is the slowed workers' indices (nil: none), from a record of
// either form.
func (r run) slowSet() []int {
	switch {
	case len(r.SlowWorkers) > 0:
		return r.SlowWorkers
	case r.SlowWorker >= 0:
		return []int{r.SlowWorker}
	}
	return nil
}

func nanPtr(v float64) *float64 {
	if math.IsNaN(v) {
		return nil
	}
	return &v
}

func ptrNaN(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func (r run) forJSON() run {
	r.TimeToTargetJ, r.SlowStepsPerSJ, r.CPUToTargetJ = nanPtr(r.TimeToTarget), nanPtr(r.SlowStepsPerS), nanPtr(r.CPUToTarget)
	r.FromLaunch.FirstStepJ, r.FromLaunch.ToTargetJ = nanPtr(r.FromLaunch.FirstStep), nanPtr(r.FromLaunch.ToTarget)
	return r
}

func (r run) fromJSON() run {
	r.TimeToTarget, r.SlowStepsPerS, r.CPUToTarget = ptrNaN(r.TimeToTargetJ), ptrNaN(r.SlowStepsPerSJ), ptrNaN(r.CPUToTargetJ)
	r.FromLaunch.FirstStep, r.FromLaunch.ToTarget = ptrNaN(r.FromLaunch.FirstStepJ), ptrNaN(r.FromLaunch.ToTargetJ)
	return r
}

// line is a run's figures for the progress log.
func (r run) line(target float64) string {
	s := fmt.Sprintf("to %.0f %%: %s (from launch: first steps %s, target %s), %.2f steps/s per worker", 100*target, secs(r.TimeToTarget),
		secs(r.FromLaunch.FirstStep), secs(r.FromLaunch.ToTarget), r.StepsPerS)
	if !math.IsNaN(r.SlowStepsPerS) {
		s += fmt.Sprintf(" (slow worker %.2f)", r.SlowStepsPerS)
	}
	s += fmt.Sprintf(", final %.3f, %s/step, %.0f CPU-s (+%.0f link), RSS %s", r.FinalAccuracy, humanBytes(r.BytesPerStep),
		r.CPUSeconds, r.LinkCPU, humanBytes(float64(r.PeakRSS)))
	s += fmt.Sprintf(" [CPU: trainers %.1f (in training %.1f: compute %.1f, step %.1f, eval %.1f in %d), daemons %.1f (in training %.1f); %.1f CPU-ms/step; to target %.1f]",
		r.TrainerCPU, r.TrainCPU, r.ComputeCPU, r.StepCPU, r.EvalCPU, r.Evaluations, r.DaemonCPU, r.DaemonTrainCPU,
		1000*(r.TrainCPU+r.DaemonTrainCPU)/float64(max(r.Steps, 1)), r.CPUToTarget)
	if r.Staleness != nil {
		s += ", staleness " + r.Staleness.String()
	}
	if r.Forked {
		s += fmt.Sprintf(", FORKED: daemons ended on %d lineages", distinct(r.Lineages))
	}
	if r.StartLate > 0.5 {
		s += fmt.Sprintf(", a worker started %.1f s late", r.StartLate)
	}
	return s
}

// worker is one worker of a run: its namespace, trainer and (pspnode)
// daemon, and its files.
type worker struct {
	host                *netns.Host
	trainer, daemon     *proc
	csv, summary        string
	ready               string
	tx0                 int64
	metrics, statusBody string
	daemonCPU0          float64 // the daemon's CPU seconds when training started
	daemonCPU1          float64 // and when every trainer had ended
	firstStep           float64 // Unix time of the trainer's first step (its summary; 0: none)
}

// one runs system sys on cell cl with seed: a fresh network, one
// namespace per worker, every process started at once, training started
// at one instant once every trainer is ready.
func (c *config) one(ctx context.Context, cl cell, sys string, seed int) (r run, err error) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "pspnode-compare-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	n, err := netns.New(ctx)
	if err != nil {
		return r, err
	}
	var ws []*worker
	defer func() {
		// Teardown ignores ctx: it runs after a SIGINT too.
		for _, w := range ws {
			for _, p := range []*proc{w.trainer, w.daemon} {
				if p != nil && p.cmd.Process != nil {
					p.stop(syscall.SIGTERM, 5*time.Second)
				}
			}
		}
		if cerr := n.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	slow := c.slowSet(cl.Slow, seed)
	for i := range c.workers {
		h, err := n.AddLinkedHost(ctx, i, cl.Tier.Link)
		if err != nil {
			return r, err
		}
		ws = append(ws, &worker{host: h, csv: filepath.Join(dir, fmt.Sprintf("w%d.csv", i)),
			summary: filepath.Join(dir, fmt.Sprintf("w%d.json", i)), ready: filepath.Join(dir, fmt.Sprintf("w%d.ready", i))})
	}
	pspnode := sys != "ddp"
	var ids []string
	if pspnode {
		if ids, err = c.identities(ctx, dir, len(ws)); err != nil {
			return r, err
		}
	}
	goFile, stopFile := filepath.Join(dir, "go"), filepath.Join(dir, "stop")
	// Every process starts here, together: no worker has a head start.
	launched := time.Now()
	for i, w := range ws {
		if pspnode {
			w.daemon = &proc{cmd: w.host.Command(c.bin, c.daemonArgs(dir, sys, i, ws, ids)...), log: filepath.Join(dir, fmt.Sprintf("d%d.log", i))}
			if err := w.daemon.start(); err != nil {
				return r, err
			}
		}
		w.trainer = &proc{cmd: w.host.Command(python, c.trainerArgs(cl, dir, sys, seed, i, slices.Contains(slow, i), ws, goFile, stopFile)...),
			log: filepath.Join(dir, fmt.Sprintf("w%d.log", i))}
		w.trainer.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "OMP_NUM_THREADS=1")
		if !pspnode {
			w.trainer.cmd.Env = append(w.trainer.cmd.Env, "MASTER_ADDR="+ws[0].host.IP.String(), "MASTER_PORT=29500", "GLOO_SOCKET_IFNAME=eth0")
		}
		if err := w.trainer.start(); err != nil {
			return r, err
		}
	}
	if cl.Slow == slowCPU {
		for _, s := range slow {
			for _, p := range []*proc{ws[s].trainer, ws[s].daemon} {
				if p != nil {
					if err := n.LimitCPU(ws[s].host, p.cmd.Process.Pid, c.slowCores); err != nil {
						return r, err
					}
				}
			}
		}
	}
	if err := c.waitReady(ctx, ws); err != nil {
		return r, err
	}
	for _, w := range ws {
		if w.tx0, err = w.host.TxBytes(ctx); err != nil {
			return r, err
		}
	}
	for _, w := range ws {
		if w.daemon != nil {
			w.daemonCPU0 = procCPU(w.daemon.cmd.Process.Pid)
		}
	}
	cpu0, sw0 := selfCPU(), n.LinkCounters()
	start := time.Now().Add(300 * time.Millisecond)
	if err := os.WriteFile(goFile+".tmp", []byte(fmt.Sprintf("%.3f", float64(start.UnixNano())/1e9)), 0o644); err != nil {
		return r, err
	}
	if err := os.Rename(goFile+".tmp", goFile); err != nil {
		return r, err
	}
	setup := time.Since(began)
	cpuCurve, err := c.watch(ctx, cl, sys, ws, start, stopFile)
	if err != nil {
		return r, err
	}
	train := time.Since(start)
	for _, w := range ws {
		if w.daemon != nil {
			w.daemonCPU1 = procCPU(w.daemon.cmd.Process.Pid)
		}
	}
	// What the interfaces and forwarders did during training.
	var sent int64
	for _, w := range ws {
		tx, err := w.host.TxBytes(ctx)
		if err != nil {
			return r, err
		}
		sent += tx - w.tx0
	}
	sw1 := n.LinkCounters()
	linkCPU, switchCPU, dropped := selfCPU()-cpu0, (sw1.CPU - sw0.CPU).Seconds(), sw1.Dropped-sw0.Dropped
	if pspnode {
		for _, w := range ws {
			w.metrics, w.statusBody = scrape(w.host)
			w.daemon.stop(syscall.SIGTERM, 10*time.Second)
		}
	}
	if pspnode {
		c.keepScrapes(cl, sys, seed, ws)
	}
	r, err = c.tally(cl, sys, seed, slow, ws, sent)
	c.keepWorkerFiles(cl, sys, seed, ws)
	r.CPUToTarget = cpuAt(cpuCurve, r.TimeToTarget)
	r.LinkCPU, r.SwitchCPU, r.LinkDropped = linkCPU, switchCPU, dropped
	r.Setup, r.Train = setup.Seconds(), train.Seconds()
	r.FromLaunch.FirstStep, r.FromLaunch.ToTarget = fromLaunch(launched, start, ws, r.TimeToTarget)
	return r, err
}

// identities makes k identities in dir (k0, k1, ...) and returns their
// peer IDs, which the workers bootstrap from.
func (c *config) identities(ctx context.Context, dir string, k int) ([]string, error) {
	var ids []string
	for i := range k {
		out, err := exec.CommandContext(ctx, c.bin, "id", "--identity", filepath.Join(dir, fmt.Sprintf("k%d", i))).Output()
		if err != nil {
			return nil, fmt.Errorf("pspnode id: %w", err)
		}
		ids = append(ids, strings.TrimSpace(string(out)))
	}
	return ids, nil
}

// fromLaunch is the time from the launch until every worker had taken its
// first step, and until the target, reached timeToTarget after the go
// signal at start (NaN for what was not reached).
func fromLaunch(launched, start time.Time, ws []*worker, timeToTarget float64) (firstStep, toTarget float64) {
	last := 0.0
	for _, w := range ws {
		if w.firstStep <= 0 {
			last = math.NaN()
			break
		}
		last = max(last, w.firstStep)
	}
	l := float64(launched.UnixNano()) / 1e9
	return last - l, start.Sub(launched).Seconds() + timeToTarget
}

// daemonArgs is worker i's `pspnode run`: the system's barrier and
// exchange (none: the daemon's defaults), TCP on its own address, HTTP on
// its namespace's loopback, worker 0 as everyone's bootstrap peer.
func (c *config) daemonArgs(dir, sys string, i int, ws []*worker, ids []string) []string {
	args := []string{"run", "--job", "compare", "--identity", filepath.Join(dir, fmt.Sprintf("k%d", i)),
		"--listen", fmt.Sprintf("/ip4/%s/tcp/4001", ws[i].host.IP), "--trainer", "unix:" + filepath.Join(dir, fmt.Sprintf("d%d.sock", i)),
		"--http", "127.0.0.1:9090", "--nat-traversal=false", "--log-level", "warn"}
	barrier, exchange, _ := systemFlags(sys)
	if barrier != "" {
		args = append(args, "--barrier", barrier)
	}
	if exchange != "" {
		args = append(args, "--exchange", exchange)
	}
	if i > 0 {
		args = append(args, "--bootstrap", fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", ws[0].host.IP, ids[0]))
	}
	return args
}

// trainerArgs is worker i's mnist.py.
func (c *config) trainerArgs(cl cell, dir, sys string, seed, i int, slow bool, ws []*worker, goFile, stopFile string) []string {
	w := ws[i]
	evalEvery := c.evalEvery.Seconds()
	if i > 0 && (sys == "ddp" || !c.evalAll) {
		evalEvery = 0 // worker 0 alone evaluates during training; every worker once at the end
	}
	args := []string{filepath.Join("examples", "torch", "mnist.py"), "--model", cl.Model.Name,
		"--shard", strconv.Itoa(i), "--shards", strconv.Itoa(len(ws)), "--batch", strconv.Itoa(c.batch),
		"--lr", fmt.Sprint(cl.Model.LR), "--momentum", fmt.Sprint(cl.Model.Momentum), "--time-scale", fmt.Sprint(c.scale),
		"--eval-every", fmt.Sprint(evalEvery), "--duration", fmt.Sprint((c.maxDur + 10*time.Second).Seconds()),
		"--init-seed", strconv.Itoa(seed), "--seed", strconv.Itoa(1000*seed + i),
		"--out", w.csv, "--summary", w.summary, "--log", "warning",
		"--ready-file", w.ready, "--go-file", goFile, "--stop-file", stopFile}
	if slow && cl.Slow == slowSleep {
		args = append(args, "--slow-factor", fmt.Sprint(c.factor))
	}
	if sys == "ddp" {
		args = append(args, "--ddp", "--rank", strconv.Itoa(i), "--world", strconv.Itoa(len(ws)))
	} else {
		args = append(args, "--daemon", "unix:"+filepath.Join(dir, fmt.Sprintf("d%d.sock", i)))
	}
	return args
}

// waitReady waits until every trainer has written its ready file (it is
// set up: its daemon answered, or the DDP ranks met), at most 2 minutes.
func (c *config) waitReady(ctx context.Context, ws []*worker) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ready := 0
		for i, w := range ws {
			if _, err := os.Stat(w.ready); err == nil {
				ready++
			}
			for what, p := range map[string]*proc{"trainer": w.trainer, "daemon": w.daemon} {
				if p != nil && p.exited() {
					return fmt.Errorf("worker %d's %s ended before training (%v):\n%s", i, what, p.err, p.tail())
				}
			}
		}
		if ready == len(ws) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d trainers set up after 2 minutes", ready, len(ws))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watch follows training: every second it reads the evaluations, prints
// progress every 15 s, and creates the stop file once the run has reached
// the target and gone on for --after-target more, or has lasted
// --max-duration. It returns once every trainer has ended, with the
// workers' processes' CPU seconds since the start of training, sampled
// every second while every trainer ran (time, CPU).
func (c *config) watch(ctx context.Context, cl cell, sys string, ws []*worker, start time.Time, stopFile string) ([][2]float64, error) {
	stopped := false
	stopAt := time.Time{}
	lastLog := start
	cpu0, running := workersCPU(ws), true
	curve := [][2]float64{{time.Since(start).Seconds(), 0}}
	for {
		allDone := true
		for i, w := range ws {
			if !w.trainer.exited() {
				allDone = false
				continue
			}
			if w.trainer.err != nil {
				return nil, fmt.Errorf("worker %d's trainer: %v:\n%s", i, w.trainer.err, w.trainer.tail())
			}
		}
		if allDone {
			return curve, nil
		}
		now := time.Since(start).Seconds()
		if running {
			cpu := workersCPU(ws)
			if running = cpu >= 0; running {
				curve = append(curve, [2]float64{now, cpu - cpu0})
			}
		}
		curve, reached := medianCurve(c.curves(sys, ws), c.target, now)
		if !stopped && ((!math.IsNaN(reached) && now >= reached+c.after.Seconds()) || now >= c.maxDur.Seconds()) {
			if err := os.WriteFile(stopFile, nil, 0o644); err != nil {
				return nil, err
			}
			stopped, stopAt = true, time.Now()
		}
		if stopped && time.Since(stopAt) > time.Minute {
			return nil, errors.New("the trainers did not stop within a minute of the stop file")
		}
		if time.Since(lastLog) >= 15*time.Second {
			lastLog = time.Now()
			acc := math.NaN()
			if len(curve) > 0 {
				acc = curve[len(curve)-1][1]
			}
			fmt.Printf("    %3.0f s: accuracy %.3f, load %.1f\n", now, acc, loadAverage())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// workersCPU is the CPU seconds of every worker's processes so far; -1
// once one has ended (its /proc entry is gone or reaped).
func workersCPU(ws []*worker) float64 {
	var sum float64
	for _, w := range ws {
		for _, p := range []*proc{w.trainer, w.daemon} {
			if p == nil {
				continue
			}
			if p.exited() {
				return -1
			}
			v := procCPU(p.cmd.Process.Pid)
			if v < 0 {
				return -1
			}
			sum += v
		}
	}
	return sum
}

// cpuAt is the CPU of a (time, CPU) curve at time t, by linear
// interpolation; NaN when t is NaN or beyond the curve.
func cpuAt(curve [][2]float64, t float64) float64 {
	if math.IsNaN(t) || len(curve) == 0 {
		return math.NaN()
	}
	for i := 1; i < len(curve); i++ {
		a, b := curve[i-1], curve[i]
		if t <= b[0] {
			if b[0] <= a[0] {
				return b[1]
			}
			f := max(0, (t-a[0])/(b[0]-a[0]))
			return a[1] + f*(b[1]-a[1])
		}
	}
	return math.NaN()
}

// curves are the evaluations that count: worker 0's, or with
// --eval-workers all every pspnode worker's (DDP's rank 0 alone: its ranks
// hold the same parameters).
func (c *config) curves(sys string, ws []*worker) [][]evals.Eval {
	var out [][]evals.Eval
	for i, w := range ws {
		if i > 0 && (sys == "ddp" || !c.evalAll) {
			break
		}
		ev, _ := evals.Read(w.csv)
		out = append(out, ev)
	}
	return out
}

// tally is the run from its workers' files and processes; sent is what
// their interfaces sent during training.
func (c *config) tally(cl cell, sys string, seed int, slow []int, ws []*worker, sent int64) (run, error) {
	r := run{Tier: cl.Tier.Name, Model: cl.Model.Name, Slow: cl.Slow, System: sys, Seed: seed, SlowWorker: -1,
		SlowStepsPerS: math.NaN(), Load: loadAverage()}
	if len(slow) > 0 {
		r.SlowWorker = slow[0]
	}
	if len(slow) > 1 {
		r.SlowWorkers = slow
	}
	var steps, slowSteps int64
	var elapsed, final, slowElapsed float64
	for i, w := range ws {
		var s summary
		b, err := os.ReadFile(w.summary)
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil {
			return r, fmt.Errorf("worker %d's summary: %w\n%s", i, err, w.trainer.tail())
		}
		steps += s.Steps
		elapsed += s.Elapsed
		final += s.Final
		r.StartLate = max(r.StartLate, s.StartLate)
		r.Duration = max(r.Duration, s.Elapsed)
		if slices.Contains(slow, i) {
			slowSteps += s.Steps
			slowElapsed += s.Elapsed
		}
		r.TrainCPU += s.CPU
		r.ComputeCPU += s.ComputeCPU
		r.StepCPU += s.StepCPU
		r.EvalCPU += s.EvalCPU
		r.Evaluations += s.Evaluations
		r.StepWall += s.StepWall
		r.EvalWall += s.EvalWall
		r.RunQueue += s.RunQueue
		w.firstStep = s.FirstStep
		c1, p1 := usage(w.trainer)
		c2, p2 := usage(w.daemon)
		r.CPUSeconds += c1 + c2
		r.TrainerCPU += c1
		r.DaemonCPU += c2
		r.DaemonTrainCPU += w.daemonCPU1 - w.daemonCPU0
		r.PeakRSS = max(r.PeakRSS, p1+p2)
	}
	if elapsed > 0 {
		r.StepsPerS = float64(steps) / elapsed
	}
	if slowElapsed > 0 {
		r.SlowStepsPerS = float64(slowSteps) / slowElapsed
	}
	r.Steps = steps
	r.FinalAccuracy = final / float64(len(ws))
	r.BytesPerStep = float64(sent) / float64(max(steps, 1))
	curves := c.curves(sys, ws)
	for i, ev := range curves {
		if len(ev) == 0 {
			return r, fmt.Errorf("worker %d wrote no evaluation", i)
		}
	}
	r.Curve, r.TimeToTarget = medianCurve(curves, c.target, r.Duration)
	if sys != "ddp" {
		var hs []hist
		for _, w := range ws {
			h, ok, err := stalenessOf(w.metrics)
			if err != nil {
				fmt.Fprintln(os.Stderr, "compare: a daemon's /metrics:", err)
			}
			if ok {
				hs = append(hs, h)
			}
			r.Lineages = append(r.Lineages, lineageOf(w.statusBody))
			if st := settingsOf(w.statusBody); st != "" && !strings.Contains(r.Settings, st) {
				r.Settings = strings.TrimPrefix(r.Settings+"; "+st, "; ")
			}
		}
		r.Staleness = summarise(hs)
		r.Forked = distinct(r.Lineages) > 1
	}
	return r, nil
}
