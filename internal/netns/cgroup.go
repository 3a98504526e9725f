package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroupRoot is where cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroups is one run's CPU cgroup: a directory "pspnode-<id>" under the
// cpu controller's root (cgroup v1) or the unified hierarchy (v2), with one
// child per limited node.
type cgroups struct {
	dir string
	v2  bool
}

// cpuHierarchy finds where CPU quotas can be set: the unified hierarchy
// when it is mounted at cgroupRoot with the cpu controller, else the v1
// cpu controller.
func cpuHierarchy() (dir string, v2 bool, err error) {
	if b, err := os.ReadFile(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		if !strings.Contains(" "+strings.TrimSpace(string(b))+" ", " cpu ") {
			return "", false, errors.New("netns: the unified cgroup hierarchy has no cpu controller")
		}
		return cgroupRoot, true, nil
	}
	for _, d := range []string{"cpu", "cpu,cpuacct", "cpuacct,cpu"} {
		p := filepath.Join(cgroupRoot, d)
		if _, err := os.Stat(filepath.Join(p, "cpu.cfs_quota_us")); err == nil {
			return p, false, nil
		}
	}
	return "", false, errors.New("netns: CPU quotas need a cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max) mounted under " + cgroupRoot)
}

// CgroupDir is the run's cgroup directory, or "" before a quota was set.
func (n *Net) CgroupDir() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cgroups == nil {
		return ""
	}
	return n.cgroups.dir
}

// LimitCPU puts process pid of host h in a cgroup of its own that may use
// cores CPUs (cores × the period each period).
func (n *Net) LimitCPU(h *Host, pid int, cores float64) error {
	n.mu.Lock()
	if n.cgroups == nil {
		root, v2, err := cpuHierarchy()
		if err != nil {
			n.mu.Unlock()
			return err
		}
		dir := filepath.Join(root, Prefix+n.ID)
		if err := os.Mkdir(dir, 0o755); err != nil {
			n.mu.Unlock()
			return fmt.Errorf("netns: cgroup: %w", err)
		}
		n.cgroups = &cgroups{dir: dir, v2: v2}
		if v2 {
			// Children get the cpu controller.
			_ = os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu"), 0)
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0)
		}
	}
	cg := n.cgroups
	n.mu.Unlock()
	dir := filepath.Join(cg.dir, fmt.Sprintf("n%d", h.Index))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("netns: cgroup: %w", err)
	}
	const period = 100000 // µs
	quota := max(int64(cores*period), 1000)
	write := func(file, v string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			return fmt.Errorf("netns: cgroup %s: %w", file, err)
		}
		return nil
	}
	if cg.v2 {
		if err := write("cpu.max", fmt.Sprintf("%d %d", quota, period)); err != nil {
			return err
		}
	} else {
		if err := write("cpu.cfs_period_us", strconv.Itoa(period)); err != nil {
			return err
		}
		if err := write("cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	return write("cgroup.procs", strconv.Itoa(pid))
}

// remove deletes the run's cgroups; their processes must have ended (a
// cgroup empties a moment after its last process is reaped, so it retries
// for a second).
func (c *cgroups) remove() error {
	subs, _ := filepath.Glob(filepath.Join(c.dir, "n*"))
	var errs []error
	for _, d := range append(subs, c.dir) {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue
		}
		var err error
		for range 20 {
			if err = os.Remove(d); err == nil || os.IsNotExist(err) {
				err = nil
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("netns: cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}
