package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// tierSpec is where a run's workers run: "loopback" (this machine's
// loopback, every worker in this namespace) or a link tier of
// internal/netns, every worker in a namespace of its own behind an
// emulated access link (the delay each way is a quarter of the round trip
// between two workers). The link tiers are those of make compare-ddp
// (examples/torch/compare).
type tierSpec struct {
	Name string
	Link *netns.Link // nil: loopback
	RTT  time.Duration
	Bits float64 // the rate each way, bits per second
}

var tierSpecs = []tierSpec{
	{Name: "loopback"},
	{Name: "lan", Link: &netns.Link{Delay: 50 * time.Microsecond, Rate: 1e9 / 8}, RTT: 200 * time.Microsecond, Bits: 1e9},
	{Name: "region", Link: &netns.Link{Delay: 5 * time.Millisecond, Rate: 1e9 / 8}, RTT: 20 * time.Millisecond, Bits: 1e9},
	{Name: "continent", Link: &netns.Link{Delay: 17500 * time.Microsecond, Rate: 400e6 / 8}, RTT: 70 * time.Millisecond, Bits: 400e6},
	{Name: "consumer", Link: &netns.Link{Delay: 7500 * time.Microsecond, Rate: 100e6 / 8}, RTT: 30 * time.Millisecond, Bits: 100e6},
}

func tierOf(name string) (tierSpec, error) {
	var names []string
	for _, t := range tierSpecs {
		if t.Name == name {
			return t, nil
		}
		names = append(names, t.Name)
	}
	return tierSpec{}, fmt.Errorf("tier %q: want one of %s", name, strings.Join(names, ", "))
}

// network is one run's placement of its workers.
type network interface {
	// addr is worker i's IP address.
	addr(i int) string
	// command is a process of worker i.
	command(i int, name string, args ...string) *exec.Cmd
	// env is what worker i's processes need in their environment.
	env() []string
	// limit gives worker i's process pid (and the processes it starts)
	// cores CPUs.
	limit(i, pid int, cores float64) error
	// txBytes is what worker i's interface has sent (-1: not known).
	txBytes(ctx context.Context, i int) int64
	close() error
}

// open makes the network of a run of n workers.
func (t tierSpec) open(ctx context.Context, n int) (network, error) {
	if t.Link == nil {
		cg, err := newCgroups()
		if err != nil {
			return nil, err
		}
		return &loopback{cg: cg}, nil
	}
	nt, err := netns.New(ctx)
	if err != nil {
		return nil, err
	}
	ln := &linked{n: nt}
	for i := range n {
		h, err := nt.AddLinkedHost(ctx, i, *t.Link)
		if err != nil {
			_ = nt.Close()
			return nil, err
		}
		ln.hosts = append(ln.hosts, h)
	}
	return ln, nil
}

// probe measures the tier's round trip and rate between two workers.
func (t tierSpec) probe(ctx context.Context) (string, error) {
	if t.Link == nil {
		return "loopback: no emulated link", nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	nt, err := netns.New(ctx)
	if err != nil {
		return "", err
	}
	defer nt.Close()
	a, err := nt.AddLinkedHost(ctx, 0, *t.Link)
	if err != nil {
		return "", err
	}
	b, err := nt.AddLinkedHost(ctx, 1, *t.Link)
	if err != nil {
		return "", err
	}
	st, err := netns.MeasureLink(ctx, a, b, 30, min(max(int64(t.Link.Rate), 8<<20), 64<<20))
	if err != nil {
		return "", err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return fmt.Sprintf("%s: TCP round trip %.1f ms median (min %.1f, p90 %.1f; asked %.1f), %.0f Mbit/s (asked %.0f)",
		t.Name, ms(st.RTT(0.5)), ms(st.RTT(0)), ms(st.RTT(0.9)), ms(t.RTT), st.Rate*8/1e6, t.Bits/1e6), nil
}

// loopback runs every worker on this machine, on 127.0.0.1.
type loopback struct{ cg *cgroups }

func (*loopback) addr(int) string { return "127.0.0.1" }
func (*loopback) command(_ int, name string, args ...string) *exec.Cmd {
	return exec.Command(name, args...)
}
func (*loopback) env() []string                           { return nil }
func (l *loopback) limit(i, pid int, cores float64) error { return l.cg.limit(i, pid, cores) }
func (*loopback) txBytes(context.Context, int) int64      { return -1 }
func (l *loopback) close() error                          { l.cg.remove(); return nil }

// linked runs each worker in a namespace of its own behind an emulated
// link (internal/netns).
type linked struct {
	n     *netns.Net
	hosts []*netns.Host
}

func (l *linked) addr(i int) string { return l.hosts[i].IP.String() }
func (l *linked) command(i int, name string, args ...string) *exec.Cmd {
	return l.hosts[i].Command(name, args...)
}
func (*linked) env() []string { return []string{"GLOO_SOCKET_IFNAME=eth0"} }
func (l *linked) limit(i, pid int, cores float64) error {
	return l.n.LimitCPU(l.hosts[i], pid, cores)
}
func (l *linked) txBytes(ctx context.Context, i int) int64 {
	b, err := l.hosts[i].TxBytes(ctx)
	if err != nil {
		return -1
	}
	return b
}
func (l *linked) close() error { return l.n.Close() }

// childAttr makes a worker die with the runner, even when the runner is
// killed, and keeps it out of the terminal's process group (a SIGINT is
// the runner's, which stops the workers and removes what it made).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// cgroups are one run's CPU quotas on loopback: a directory under the
// cgroup v1 cpu controller with one child per limited worker, whose
// processes (the trainer, and the daemon it starts, which inherits the
// group) share the quota.
type cgroups struct{ dir string }

const cpuRoot = "/sys/fs/cgroup/cpu"

func newCgroups() (*cgroups, error) {
	dir := filepath.Join(cpuRoot, fmt.Sprintf("pspnode-diloco-%d", os.Getpid()))
	return &cgroups{dir: dir}, nil
}

// limit puts pid in worker i's group, which may use cores CPUs.
func (c *cgroups) limit(i, pid int, cores float64) error {
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu.cfs_quota_us")); err != nil {
		return fmt.Errorf("CPU quotas need the cgroup v1 cpu controller at %s (or --quota 0): %w", cpuRoot, err)
	}
	d := filepath.Join(c.dir, fmt.Sprintf("w%d", i))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w (run as root, or --quota 0)", err)
	}
	const period = 100000
	for _, f := range []struct{ name, v string }{
		{"cpu.cfs_period_us", strconv.Itoa(period)},
		{"cpu.cfs_quota_us", strconv.Itoa(int(cores * period))},
		{"cgroup.procs", strconv.Itoa(pid)},
	} {
		if err := os.WriteFile(filepath.Join(d, f.name), []byte(f.v), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", f.name, err)
		}
	}
	return nil
}

// remove removes the groups (their processes have ended).
func (c *cgroups) remove() {
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(c.dir, e.Name()))
		}
	}
	_ = os.Remove(c.dir)
}
