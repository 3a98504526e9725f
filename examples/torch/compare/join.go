package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// The join experiment (--join-params N): how long a worker that joins a
// running job takes to get the job's model of N parameters over a tier's
// links, against the time the bytes alone take on the joiner's link (its
// wire time). Peers workers train a Linear model of about N parameters
// (pspnode.Optimizer, the daemons' defaults) and stop after a step, so
// their daemons hold the model; then a joiner's daemon and trainer start,
// and the trainer's pspnode.Optimizer returns once its daemon has fetched
// the job's parameters, from several peers at once.

// joinScript is the Python of a joining or serving worker: argv is the
// daemon's address, N, the ready file (written once the model is the
// daemon's; a server then waits for the stop file) and the stop file.
const joinScript = `
import json, os, sys, time, torch, pspnode
addr, n, ready, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
torch.manual_seed(1)
m = torch.nn.Linear(1000, max(1, n // 1001))
t0 = time.time()
opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=1e-3), addr, model=m, model_name="bigjoin", connect_timeout=900)
t1 = time.time()
with open("/proc/self/status") as f:
    rss = [int(l.split()[1]) for l in f if l.startswith("VmHWM:")][0] / 1024
if opt.step_count == 0:  # a server: one step makes the model its daemon's
    opt.zero_grad(); m(torch.randn(8, 1000)).sum().backward(); opt.step()
print(json.dumps({"welcome_s": t1 - t0, "step": opt.step_count, "peak_rss_mib": rss,
                  "source": opt.client.welcome.params_source}), flush=True)
open(ready, "w").write("1")
while not os.path.exists(stop):
    time.sleep(0.2)
opt.close()
`

// joinResult is one join.
type joinResult struct {
	Tier          string  `json:"tier"`
	Params        int     `json:"params"`
	Peers         int     `json:"peers"`
	MiB           float64 `json:"mib"`
	WireS         float64 `json:"wire_s"`       // the model's bytes at the tier's rate
	FetchS        float64 `json:"fetch_s"`      // the joiner's daemon's fetch
	WelcomeS      float64 `json:"welcome_s"`    // the joiner's Optimizer, from construction to return
	FetchPeers    int     `json:"fetch_peers"`  // peers that gave a part
	DaemonCPU     float64 `json:"daemon_cpu_s"` // the joiner's daemon, in all
	DaemonPeakMiB float64 `json:"daemon_peak_mib"`
	TrainerPeak   float64 `json:"trainer_peak_mib"`
	Source        string  `json:"source"`
}

func (j joinResult) String() string {
	return fmt.Sprintf("%s: %.0f MiB from %d of %d peers in %.1f s (wire time %.1f s: %.2f×); the joiner's Optimizer returned in %.1f s; its daemon %.1f CPU-s, peak RSS %.0f MiB; its trainer's peak RSS %.0f MiB",
		j.Tier, j.MiB, j.FetchPeers, j.Peers, j.FetchS, j.WireS, j.FetchS/j.WireS, j.WelcomeS, j.DaemonCPU, j.DaemonPeakMiB, j.TrainerPeak)
}

// joinAll runs the join experiment on every tier and writes join.json.
func (c *config) joinAll(ctx context.Context) error {
	var out []joinResult
	for _, t := range c.tiers {
		r, err := c.join(ctx, t)
		if err != nil {
			return fmt.Errorf("tier %s: %w", t.Name, err)
		}
		fmt.Println(r)
		out = append(out, r)
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	return os.WriteFile(filepath.Join(c.out, "join.json"), b, 0o644)
}

var fetchedLine = regexp.MustCompile(`fetched the job's model.* peers=(\d+).* seconds=([0-9.]+)`)

// join runs one join on tier t: c.workers − 1 serving workers, then one
// joiner.
func (c *config) join(ctx context.Context, t tier) (r joinResult, err error) {
	dir, err := os.MkdirTemp("", "pspnode-join-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	n, err := netns.New(ctx)
	if err != nil {
		return r, err
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop(syscall.SIGTERM, 5*time.Second)
		}
		err = errors.Join(err, n.Close())
	}()
	var hosts []*netns.Host
	for i := range c.workers {
		h, err := n.AddLinkedHost(ctx, i, t.Link)
		if err != nil {
			return r, err
		}
		hosts = append(hosts, h)
	}
	ids, err := c.identities(ctx, dir, c.workers)
	if err != nil {
		return r, err
	}
	stop := filepath.Join(dir, "stop")
	start := func(i int) (daemon, trainer *proc, ready string, err error) {
		args := []string{"run", "--job", "bigjoin", "--identity", filepath.Join(dir, fmt.Sprintf("k%d", i)),
			"--listen", fmt.Sprintf("/ip4/%s/tcp/4001", hosts[i].IP), "--trainer", "unix:" + filepath.Join(dir, fmt.Sprintf("d%d.sock", i)),
			"--nat-traversal=false", "--log-level", "info"}
		if i > 0 {
			args = append(args, "--bootstrap", fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", hosts[0].IP, ids[0]))
		}
		daemon = &proc{cmd: hosts[i].Command(c.bin, args...), log: filepath.Join(dir, fmt.Sprintf("d%d.log", i))}
		if err := daemon.start(); err != nil {
			return nil, nil, "", err
		}
		procs = append(procs, daemon)
		ready = filepath.Join(dir, fmt.Sprintf("w%d.ready", i))
		trainer = &proc{cmd: hosts[i].Command(python, "-c", joinScript, "unix:"+filepath.Join(dir, fmt.Sprintf("d%d.sock", i)),
			strconv.Itoa(c.joinParams), ready, stop), log: filepath.Join(dir, fmt.Sprintf("w%d.log", i))}
		client, _ := filepath.Abs(filepath.Join("clients", "python"))
		trainer.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "OMP_NUM_THREADS=1", "PYTHONPATH="+client)
		if err := trainer.start(); err != nil {
			return nil, nil, "", err
		}
		procs = append(procs, trainer)
		return daemon, trainer, ready, nil
	}
	wait := func(ready string, p *proc) error {
		for {
			if _, err := os.Stat(ready); err == nil {
				return nil
			}
			if p.exited() {
				return fmt.Errorf("a worker ended before it was ready (%v); its log: %s", p.err, tail(p.log))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	last := c.workers - 1
	for i := range last {
		_, tr, ready, err := start(i)
		if err != nil {
			return r, err
		}
		if err := wait(ready, tr); err != nil {
			return r, err
		}
	}
	d, tr, ready, err := start(last)
	if err != nil {
		return r, err
	}
	if err := wait(ready, tr); err != nil {
		return r, err
	}
	r = joinResult{Tier: t.Name, Params: c.joinParams, Peers: last, MiB: float64(4*(c.joinParams/1001*1001)) / (1 << 20),
		DaemonCPU: procCPU(d.cmd.Process.Pid), DaemonPeakMiB: peakRSS(d.cmd.Process.Pid)}
	r.WireS = float64(4*(c.joinParams/1001*1001)) / t.Link.Rate
	var w struct {
		WelcomeS float64 `json:"welcome_s"`
		Peak     float64 `json:"peak_rss_mib"`
		Source   string  `json:"source"`
	}
	if err := json.Unmarshal([]byte(firstLine(tr.log)), &w); err != nil {
		return r, fmt.Errorf("the joiner's report: %w; its log: %s", err, tail(tr.log))
	}
	r.WelcomeS, r.TrainerPeak, r.Source = w.WelcomeS, w.Peak, w.Source
	b, _ := os.ReadFile(d.log)
	m := fetchedLine.FindSubmatch(b)
	if m == nil {
		return r, fmt.Errorf("the joiner's daemon fetched no model (%s); its log: %s", w.Source, tail(d.log))
	}
	r.FetchPeers, _ = strconv.Atoi(string(m[1]))
	r.FetchS, _ = strconv.ParseFloat(string(m[2]), 64)
	return r, os.WriteFile(stop, nil, 0o644)
}

// peakRSS is a process's peak resident set in MiB (VmHWM).
func peakRSS(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return kb / 1024
		}
	}
	return 0
}

func firstLine(path string) string {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "{") {
			return l
		}
	}
	return ""
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
