package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/netns"
)

// netnsRuns lets one netns test run at a time: they run in parallel with
// the other tests, not with each other, as a sweep (--cleanup) can take a
// run that is starting or tearing down for one whose owner is gone, and
// two runs starting at once can draw the same subnet.
var netnsRuns sync.Mutex

// needNetns fails (never skips: CI runs as root with the tools .ci/run
// installs) when the netns transport cannot run here, and holds netnsRuns
// until the test ends.
func needNetns(t *testing.T) {
	t.Helper()
	if err := netns.Check(true); err != nil {
		t.Fatalf("%v: run the tests as root after `make test-deps` has installed iproute2 and nftables", err)
	}
	netnsRuns.Lock()
	t.Cleanup(netnsRuns.Unlock)
}

// netnsResult is the part of a netns testnet's JSON these tests read.
type netnsResult struct {
	Transport string  `json:"transport"`
	DurationS float64 `json:"duration_s"`
	LiveNodes int     `json:"live_nodes"`
	Steps     struct {
		Min float64 `json:"min"`
	} `json:"steps"`
	BarrierCheckMs struct {
		P50 float64 `json:"p50"`
	} `json:"barrier_check_ms"`
	NetNS struct {
		RunID    string `json:"run_id"`
		Subnet   string `json:"subnet"`
		CPUShare struct {
			Mean float64 `json:"mean"`
		} `json:"cpu_share"`
		RSSMiB struct {
			Mean float64 `json:"mean"`
		} `json:"rss_mib"`
		Quota *struct {
			Nodes int `json:"nodes"`
		} `json:"cpu_quota"`
		NAT *struct {
			Nodes    int `json:"nodes"`
			Querying int `json:"nodes_with_answered_queries"`
		} `json:"nat"`
	} `json:"netns"`
}

// assertNothingLeft checks that no namespace, link, cgroup or node process
// of run id (bridge subnet 10.A.0.0/16) remains.
func assertNothingLeft(t *testing.T, id, subnet string) {
	t.Helper()
	if id == "" || subnet == "" {
		t.Fatal("the result names no netns run")
	}
	names, err := netns.Namespaces(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range names {
		if strings.Contains(ns, id) {
			t.Errorf("namespace %s remains", ns)
		}
	}
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "p"+id) {
		t.Errorf("links of run %s remain:\n%s", id, out)
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"} {
		if _, err := os.Stat(filepath.Join(root, netns.Prefix+id)); err == nil {
			t.Errorf("cgroup %s remains", filepath.Join(root, netns.Prefix+id))
		}
	}
	// Node processes listen on their subnet's addresses; NATed nodes on
	// the LAN subnet 64 above.
	a, _, _ := strings.Cut(strings.TrimPrefix(subnet, "10."), ".")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "--start-on-signal") && strings.Contains(cmd, "--http 10."+a+".") {
			t.Errorf("node process remains: %s: %s", p, cmd)
		}
	}
}

// TestNetnsTestnet runs a netns testnet of 3 node processes (one behind
// NAT, one CPU-limited, all rate-limited) for a few seconds, checks its
// report, and that nothing of it remains.
func TestNetnsTestnet(t *testing.T) {
	t.Parallel()
	needNetns(t)
	bin := buildBinary(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "testnet", "--transport", "netns", "--nodes", "3", "--duration", "5s", "--model", "none",
		"--time-scale", "0.05", "--barrier", "pssp:2:1", "--nat", "1", "--cpu-quota", "0.34:0.5", "--bandwidth", "100mbit",
		"--json", "--quiet", "--out", out)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("pspnode testnet --transport netns: %v\nstderr:\n%s", err, stderr.String())
	}
	var r netnsResult
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	assertNothingLeft(t, r.NetNS.RunID, r.NetNS.Subnet)
	// 5 s of 0.1-s mean steps; a loaded machine slows them, but every node
	// steps, and reports its process's cost.
	if r.Transport != "netns" || r.LiveNodes != 3 || r.Steps.Min < 1 || !(r.BarrierCheckMs.P50 > 0) ||
		!(r.NetNS.CPUShare.Mean > 0) || !(r.NetNS.RSSMiB.Mean > 5) {
		t.Errorf("result %+v\nstderr:\n%s", r, stderr.String())
	}
	if r.NetNS.NAT == nil || r.NetNS.NAT.Nodes != 1 || r.NetNS.Quota == nil || r.NetNS.Quota.Nodes != 1 {
		t.Errorf("NAT and quota groups: %+v", r.NetNS)
	}
	for _, f := range []string{"summary.json", "processes.csv", "steps_over_time.csv", "step_distribution.png"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

// TestNetnsTestnetInterrupt: SIGINT stops a netns testnet in training; it
// reports the time it ran, exits 0, and leaves nothing behind.
func TestNetnsTestnetInterrupt(t *testing.T) {
	t.Parallel()
	needNetns(t)
	bin := buildBinary(t)
	cmd := exec.Command(bin, "testnet", "--transport", "netns", "--nodes", "3", "--nat", "1", "--duration", "1h",
		"--model", "none", "--time-scale", "0.05", "--barrier", "pssp:2:1", "--json")
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	lines := make(chan string)
	go func() { // ends when the child's stderr closes
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		done <- cmd.Wait()
	}()
	var seen []string
	timeout := time.After(3 * time.Minute)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("testnet ended before training:\n%s", strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if strings.HasPrefix(l, "[") { // a progress line: training runs
				if err := cmd.Process.Signal(os.Interrupt); err != nil {
					t.Fatal(err)
				}
				break wait
			}
		case <-timeout:
			_ = cmd.Process.Signal(os.Interrupt)
			t.Fatalf("no training within 3 minutes:\n%s", strings.Join(seen, "\n"))
		}
	}
	go func() { // drain the rest; ends with the child's stderr
		for range lines {
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGINT: %v\nstderr:\n%s", err, strings.Join(seen, "\n"))
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("no exit within 60 s of SIGINT; stderr:\n%s", strings.Join(seen, "\n"))
	}
	var r netnsResult
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil || !(r.DurationS > 0 && r.DurationS < 3600) {
		t.Fatalf("after SIGINT: duration %v s (err %v), want part of the hour\n%s", r.DurationS, err, stdout.String())
	}
	assertNothingLeft(t, r.NetNS.RunID, r.NetNS.Subnet)
}

// TestNetnsMissingTool: without nft, --nat is refused before anything is
// made, with an error that names the tool and its package.
func TestNetnsMissingTool(t *testing.T) {
	t.Parallel()
	needNetns(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	for _, tool := range []string{"ip", "tc"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "testnet", "--transport", "netns", "--nodes", "3", "--nat", "1", "--duration", "5s", "--model", "none")
	cmd.Env = append(os.Environ(), "PATH="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "nft (Debian package nftables)") {
		t.Errorf("without nft: %v\n%s", err, out)
	}
}

// TestNetnsCleanupAfterKill: when the testnet is killed (SIGKILL, no
// teardown), the kernel ends its node processes, and --cleanup removes the
// namespaces, links and cgroups it left.
func TestNetnsCleanupAfterKill(t *testing.T) {
	t.Parallel()
	needNetns(t)
	bin := buildBinary(t)
	cmd := exec.Command(bin, "testnet", "--transport", "netns", "--nodes", "3", "--nat", "1", "--cpu-quota", "0.34:0.5",
		"--duration", "1h", "--model", "none", "--time-scale", "0.05", "--barrier", "pssp:2:1")
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() { // ends when the child's stderr closes
		sc := bufio.NewScanner(errPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var id, subnet string
	var seen []string
	timeout := time.After(3 * time.Minute)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("testnet ended before training:\n%s", strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if rest, ok := strings.CutPrefix(l, "testnet: netns run "); ok {
				f := strings.Fields(rest)
				id, subnet = f[0], f[2]
			}
			if strings.HasPrefix(l, "[") {
				break wait
			}
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatalf("no training within 3 minutes:\n%s", strings.Join(seen, "\n"))
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	_ = cmd.Wait()
	if id == "" {
		t.Fatalf("no run ID announced:\n%s", strings.Join(seen, "\n"))
	}
	if names, _ := netns.Namespaces(t.Context()); !strings.Contains(strings.Join(names, " "), id) {
		t.Fatalf("a killed run left no namespace to clean up (%v): the test tests nothing", names)
	}
	out, err := exec.Command(bin, "testnet", "--cleanup").CombinedOutput()
	if err != nil || !strings.Contains(string(out), id) {
		t.Fatalf("--cleanup: %v\n%s", err, out)
	}
	// The nodes died with their parent (PR_SET_PDEATHSIG), or by --cleanup.
	assertNothingLeft(t, id, subnet)
}
