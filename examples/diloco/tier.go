package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// tier is where the workers run and how they reach each other.
type tier interface {
	// addr is worker i's IP address.
	addr(i int) string
	// command is a process of worker i.
	command(i int, name string, args ...string) *exec.Cmd
}

func tierOf(name string) (tier, error) {
	switch name {
	case "loopback":
		return loopback{}, nil
	}
	return nil, fmt.Errorf("tier %q: want loopback", name)
}

// loopback runs every worker on this machine, on 127.0.0.1.
type loopback struct{}

func (loopback) addr(int) string { return "127.0.0.1" }
func (loopback) command(_ int, name string, args ...string) *exec.Cmd {
	return exec.Command(name, args...)
}

// cgroups are one run's CPU quotas: a directory under the cgroup v1 cpu
// controller with one child per limited worker, whose processes (the
// trainer, and the daemon it starts, which inherits the group) share the
// quota.
type cgroups struct{ dir string }

const cpuRoot = "/sys/fs/cgroup/cpu"

func newCgroups() (*cgroups, error) {
	if _, err := os.Stat(filepath.Join(cpuRoot, "cpu.cfs_quota_us")); err != nil {
		return &cgroups{}, fmt.Errorf("CPU quotas need the cgroup v1 cpu controller at %s (or --quota 0): %w", cpuRoot, err)
	}
	dir := filepath.Join(cpuRoot, fmt.Sprintf("pspnode-diloco-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return &cgroups{}, fmt.Errorf("cgroup: %w (run as root, or --quota 0)", err)
	}
	return &cgroups{dir: dir}, nil
}

// limit puts pid in worker i's group, which may use cores CPUs.
func (c *cgroups) limit(i, pid int, cores float64) error {
	d := filepath.Join(c.dir, fmt.Sprintf("w%d", i))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return fmt.Errorf("cgroup: %w", err)
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
	if c.dir == "" {
		return
	}
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(c.dir, e.Name()))
		}
	}
	_ = os.Remove(c.dir)
}
