package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	ns "github.com/pspnode/pspnode/internal/netns"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
)

// netnsHTTPPort and netnsP2PPort are where every netns node listens, on its
// own address.
const (
	netnsHTTPPort = 9090
	netnsP2PPort  = 4001
)

// proc is one `pspnode run` process of a netns testnet.
type proc struct {
	idx     int
	host    *ns.Host
	factor  float64 // straggle factor of the time model
	cores   float64 // CPU quota, 0 for none
	cmd     *exec.Cmd
	stderr  *tailBuffer
	peerID  chan string   // the "peer id:" line, once
	exited  chan struct{} // closed when the process has been reaped
	exitErr error         // set before exited is closed
	url     string        // http://ip:port
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 4096 {
		b.buf = b.buf[len(b.buf)-4096:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}

// netnsRun is one netns testnet in progress: its network and processes.
type netnsRun struct {
	cfg    plan.Config
	net    *ns.Net
	procs  []*proc
	client *http.Client
}

// Run runs the testnet as one `pspnode run` process per node, each in
// its own network namespace, and reads their /status and /metrics.
func Run(ctx context.Context, cfg plan.Config) (res *report.Result, err error) {
	if err := ns.Check(cfg.NAT > 0); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	exe := cfg.Executable
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("testnet: the pspnode executable: %w", err)
		}
	}
	if cfg.Model != "none" {
		// Fail here, not in every child, on a bad data path.
		if err := checkData(cfg); err != nil {
			return nil, err
		}
	}
	// With NATed nodes, the bridge is public-looking address space, so
	// that AutoNAT, relays and hole punching act as on the internet.
	n, err := ns.New(ctx, ns.Options{PublicWAN: cfg.NAT > 0})
	if err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	if cfg.NetnsRun != nil {
		cfg.NetnsRun(n.ID, n.Subnet().String())
	}
	r := &netnsRun{cfg: cfg, net: n, client: &http.Client{Timeout: 3 * time.Second}}
	defer func() {
		// Teardown ignores ctx: it runs after a SIGINT too.
		if cerr := r.stop(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	// Every node may resolve every other, the host and (NATed) its router.
	if err := n.RaiseNeighbourLimits(cfg.Nodes * (cfg.Nodes + 3)); err != nil {
		return nil, fmt.Errorf("testnet: %w", err)
	}
	if err := r.start(ctx, exe); err != nil {
		return nil, err
	}
	warm := r.waitReady(ctx)
	if err := r.exitedEarly(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := r.startTraining(); err != nil {
		return nil, err
	}
	return r.train(ctx, warm)
}

// picks returns k of the indices 1..n-1 (node 0 is the bootstrap node and
// stays public), drawn by seed and salt.
func picks(n, k int, seed, salt uint64) map[int]bool {
	out := map[int]bool{}
	if k <= 0 {
		return out
	}
	for _, j := range rand.New(rand.NewPCG(seed, salt)).Perm(n - 1)[:min(k, n-1)] {
		out[j+1] = true
	}
	return out
}

// start builds every node's namespace and starts its process: node 0 first
// (every other node bootstraps from it), then the rest.
func (r *netnsRun) start(ctx context.Context, exe string) error {
	cfg := r.cfg
	nat := picks(cfg.Nodes, cfg.NAT, cfg.Seed, 0x4a7)
	quota := picks(cfg.Nodes, int(math.Round(cfg.CPUQuota.Fraction*float64(cfg.Nodes))), cfg.Seed, 0xc9a)
	slow := map[int]bool{}
	for _, i := range rand.New(rand.NewPCG(cfg.Seed, 0x57a6)).Perm(cfg.Nodes)[:int(math.Round(cfg.Stragglers*float64(cfg.Nodes)))] {
		slow[i] = true
	}
	var boot string
	buildStart := time.Now()
	for i := range cfg.Nodes {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := r.net.AddHost(ctx, i, nat[i], netnsHTTPPort)
		if err != nil {
			return fmt.Errorf("testnet: %w", err)
		}
		if cfg.Bandwidth > 0 {
			if err := r.net.Limit(ctx, h, cfg.Bandwidth); err != nil {
				return fmt.Errorf("testnet: %w", err)
			}
		}
		p := &proc{idx: i, host: h, factor: 1, stderr: &tailBuffer{}, peerID: make(chan string, 1), exited: make(chan struct{}),
			url: fmt.Sprintf("http://%s:%d", h.IP, netnsHTTPPort)}
		if slow[i] {
			p.factor = cfg.StraggleFactor
		}
		if quota[i] {
			p.cores = cfg.CPUQuota.Cores
		}
		if err := r.launch(p, exe, boot); err != nil {
			return err
		}
		if i == 0 {
			select {
			case id := <-p.peerID:
				boot = fmt.Sprintf("/ip4/%s/tcp/%d/p2p/%s", h.IP, netnsP2PPort, id)
			case <-p.exited:
				return fmt.Errorf("testnet: node 0 exited at start: %v: %s", p.exitErr, p.stderr)
			case <-time.After(30 * time.Second):
				return fmt.Errorf("testnet: node 0 printed no peer ID within 30 s: %s", p.stderr)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if cfg.BuildProgress != nil && ((i+1)%10 == 0 || i+1 == cfg.Nodes) {
			cfg.BuildProgress(i+1, cfg.Nodes, time.Since(buildStart))
		}
	}
	return nil
}

// args is node p's `pspnode run` command line.
func (r *netnsRun) args(p *proc, boot string) []string {
	c := r.cfg
	ip := p.host.IP.String()
	a := []string{"run",
		"--listen", fmt.Sprintf("/ip4/%s/tcp/%d", ip, netnsP2PPort),
		"--http", fmt.Sprintf("%s:%d", ip, netnsHTTPPort),
		"--job", "testnet", "--barrier", c.Barrier.String(), "--exchange", c.Exchange.String(), "--stale-steps", fmt.Sprint(c.StaleSteps),
		"--model", c.Model, "--data", c.Data,
		"--shards", strconv.Itoa(c.Nodes), "--shard", strconv.Itoa(p.idx),
		"--time-scale", strconv.FormatFloat(c.TimeScale, 'g', -1, 64),
		"--straggle-factor", strconv.FormatFloat(p.factor, 'g', -1, 64),
		"--poll-share", strconv.FormatFloat(c.PollShare, 'g', -1, 64),
		"--pace", c.Pace.String(),
		"--start-on-signal",
		"--eval-every", strconv.Itoa(netnsEvalSteps(c)),
		"--log-level", c.NodeLogLevel,
	}
	if c.NodeLogLevel == "" {
		a[len(a)-1] = "warn"
	}
	if c.LR > 0 {
		a = append(a, "--lr", strconv.FormatFloat(c.LR, 'g', -1, 64))
	}
	if c.NAT > 0 {
		// QUIC too: hole punching through the NAT routers' connection
		// tracking succeeds more often over UDP than by TCP simultaneous
		// open.
		a[2] += fmt.Sprintf(",/ip4/%s/udp/%d/quic-v1", ip, netnsP2PPort)
		if boot == "" {
			// The bootstrap node is every NATed node's static relay; it
			// knows it is public, so it relays from the start instead of
			// after AutoNAT has confirmed it.
			a = append(a, "--reachability", "public")
		}
	}
	if boot != "" {
		a = append(a, "--bootstrap", boot)
	}
	return a
}

// netnsEvalSteps is how many steps apart the nodes evaluate their models
// (pspnode run counts evaluation in steps): about EvalEvery of steps.
func netnsEvalSteps(c plan.Config) int {
	if c.Model == "none" || c.EvalEvery == 0 {
		return 0
	}
	if c.TimeScale > 0 {
		// A mean step takes about 2 s × the time scale.
		return max(1, int(c.EvalEvery.Seconds()/(2*c.TimeScale)))
	}
	return 200 // steps of pure compute take milliseconds
}

// launch starts p's process in its namespace and puts it in its cgroup.
func (r *netnsRun) launch(p *proc, exe, boot string) error {
	p.cmd = p.host.Command(exe, r.args(p, boot)...)
	p.cmd.SysProcAttr = childAttr()
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("testnet: node %d: %w", p.idx, err)
	}
	r.procs = append(r.procs, p)
	go func() { // owned by p: ends when the process's stdout closes, then reaps it
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "peer id: "); ok {
				select {
				case p.peerID <- id:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	if p.cores > 0 {
		if err := r.net.LimitCPU(p.host, p.cmd.Process.Pid, p.cores); err != nil {
			return fmt.Errorf("testnet: node %d: %w", p.idx, err)
		}
	}
	return nil
}

// waitReady waits until every node has joined and its overlay is ready
// (/status joined and overlay_ready), or Warmup passes, and returns how
// long it waited.
func (r *netnsRun) waitReady(ctx context.Context) time.Duration {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, r.cfg.Warmup)
	defer cancel()
	for wctx.Err() == nil {
		all := true
		for _, rd := range r.readAll(wctx, false) {
			all = all && rd.ok && rd.st.Joined && rd.st.OverlayReady
		}
		if all || r.exitedEarly() != nil {
			break
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-wctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return time.Since(start)
}

// startTraining sends every node the signal --start-on-signal waits for.
func (r *netnsRun) startTraining() error {
	for _, p := range r.procs {
		if err := p.cmd.Process.Signal(startSignal); err != nil {
			return fmt.Errorf("testnet: starting node %d: %w", p.idx, err)
		}
	}
	return nil
}

// exitedEarly names the first node whose process has ended.
func (r *netnsRun) exitedEarly() error {
	for _, p := range r.procs {
		select {
		case <-p.exited:
			return fmt.Errorf("testnet: node %d exited: %v: %s", p.idx, p.exitErr, p.stderr)
		default:
		}
	}
	return nil
}

// stop ends every process (SIGINT, so each tells its peers it leaves;
// SIGKILL after 10 s) and removes the network.
func (r *netnsRun) stop() error {
	for _, p := range r.procs {
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	expired := false
	for _, p := range r.procs {
		if !expired {
			select {
			case <-p.exited:
				continue
			case <-deadline.C:
				expired = true
			}
		}
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return r.net.Close()
}
