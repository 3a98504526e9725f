package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/daemontest"
)

// built is the pspnode binary the tests run as a process: built once for
// all of them (a link costs several CPU-seconds and most of a gigabyte),
// in a folder TestMain removes.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// buildBinary compiles pspnode on its first call and returns the binary's
// path; every call after returns the same binary, or the same error.
func buildBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if built.dir, err = os.MkdirTemp("", "pspnode-test-bin-"); err != nil {
			built.err = err
			return
		}
		bin := filepath.Join(built.dir, "pspnode")
		if out, err := exec.Command(gobin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// proc is a running `pspnode run` process.
type proc = daemontest.Daemon

// startNode starts `pspnode run` (with --http) and reads its addresses.
func startNode(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	return daemontest.Start(t, bin, args...)
}

type status struct {
	PeerID  string  `json:"peer_id"`
	Step    int64   `json:"step"`
	Barrier string  `json:"barrier"`
	Waiting bool    `json:"waiting"`
	Peers   int     `json:"connected_peers"`
	Est     float64 `json:"population_estimate"`
	Recv    uint64  `json:"updates_received"`
}

func getStatus(p *proc) (status, error) {
	var s status
	return s, p.GetJSON("/status", &s)
}

// TestEndToEnd starts four `pspnode run` processes on 127.0.0.1,
// bootstrapped from the first, checks through /status that they all advance
// and that pSSP keeps them within its bound, kills the bootstrap node with
// SIGKILL, checks the others keep advancing, and stops them with SIGTERM.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	const n, staleness = 4, 2
	// β = 3 = P-1: every node samples all others, so pSSP(3, 2) must hold
	// the SSP(2) bound exactly: no node more than s+1 steps from another.
	// That is the paper's pSSP: the pace rule (on by default) lets a peer
	// that steps slower, as a process starved by a loaded machine does,
	// fall behind by design (psp.Pace; its tests hold it).
	common := []string{
		"--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0", "--job", "e2e",
		"--barrier", fmt.Sprintf("pssp:%d:%d", n-1, staleness), "--pace", "off", "--time-scale", "0.02",
		"--wait-peers", fmt.Sprint(n - 1), "--log-level", "warn",
	}
	nodes := []*proc{startNode(t, bin, common...)}
	for range n - 1 {
		nodes = append(nodes, startNode(t, bin, append(common, "--bootstrap", nodes[0].Addr)...))
	}

	// poll returns the live nodes' statuses.
	poll := func(ps []*proc) []status {
		var out []status
		for _, p := range ps {
			s, err := getStatus(p)
			if err != nil {
				t.Fatalf("status of %s: %v\nstderr:\n%s", p.ID, err, p.Stderr)
			}
			out = append(out, s)
		}
		return out
	}
	spread := func(ss []status) (lo, hi int64) {
		lo, hi = ss[0].Step, ss[0].Step
		for _, s := range ss {
			lo, hi = min(lo, s.Step), max(hi, s.Step)
		}
		return
	}
	waitAll := func(ps []*proc, target int64, within time.Duration, checkBound bool) []status {
		deadline := time.Now().Add(within)
		for {
			ss := poll(ps)
			lo, hi := spread(ss)
			// Statuses are read one after another, so a node may step
			// between two reads: allow one step of skew.
			if checkBound && lo > 0 && hi-lo > staleness+2 {
				t.Errorf("step spread %d..%d exceeds the pSSP bound s+1=%d (+1 read skew)", lo, hi, staleness+1)
			}
			if lo >= target {
				return ss
			}
			if time.Now().After(deadline) {
				t.Fatalf("nodes did not all reach step %d in %v: %+v", target, within, ss)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ss := waitAll(nodes, 30, 60*time.Second, true)
	for _, s := range ss {
		if s.Barrier != "pssp:3:2" || s.Recv == 0 || s.Peers < 1 {
			t.Errorf("unexpected status %+v", s)
		}
	}

	// Crash the bootstrap node: no node is special.
	if err := nodes[0].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-nodes[0].Done
	nodes[0].Done <- nil // for the cleanup
	rest := nodes[1:]
	_, hi := spread(poll(rest))
	waitAll(rest, hi+20, 60*time.Second, true)

	// Graceful stop: SIGTERM, exit code 0.
	for _, p := range rest {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range rest {
		select {
		case err := <-p.Done:
			if err != nil {
				t.Errorf("node %s exited with %v after SIGTERM; stderr:\n%s", p.ID, err, p.Stderr)
			}
			p.Done <- nil
		case <-time.After(15 * time.Second):
			t.Errorf("node %s did not exit within 15 s of SIGTERM", p.ID)
		}
	}
}

func TestIDCommand(t *testing.T) {
	key := filepath.Join(t.TempDir(), "k")
	code, out1, errs := runCLI(t, "id", "--identity", key)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	code, out2, _ := runCLI(t, "id", "--identity", key)
	if code != 0 || out1 != out2 || !strings.HasPrefix(out1, "12D3KooW") {
		t.Errorf("id not stable: %q vs %q", out1, out2)
	}
	st, _ := os.Stat(key)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v", st.Mode().Perm())
	}
	if code, _, _ := runCLI(t, "id"); code != 2 {
		t.Errorf("id without --identity: exit %d, want 2", code)
	}
}

// TestTestnetVirtualClock runs `pspnode testnet` on its default, virtual
// clock, as a user would: as a process of its own (the virtual clock ends
// the process when the run ends), with both profiles and --out.
func TestTestnetVirtualClock(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	dir := t.TempDir()
	cpu, heap, out := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "heap.pprof"), filepath.Join(dir, "out")
	cmd := exec.Command(bin, "testnet", "--nodes", "8", "--duration", "30s", "--model", "none", "--time-scale", "0.5",
		"--barrier", "pssp:3:1", "--json", "--cpu-profile", cpu, "--mem-profile", heap, "--out", out)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("pspnode testnet: %v\nstderr:\n%s", err, stderr.String())
	}
	var r struct {
		Clock          string          `json:"clock"`
		DurationS      float64         `json:"duration_s"`
		WallS          float64         `json:"wall_s"`
		VirtualPerWall float64         `json:"virtual_per_wall"`
		Overload       json.RawMessage `json:"overload"`
		Steps          struct{ Min, Mean float64 }
		StalledNodes   int `json:"stalled_nodes"`
	}
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	// 30 s of 1-s mean steps: about 30 steps, less the barrier's waits.
	if r.Clock != "virtual" || r.DurationS != 30 || !(r.WallS > 0) || !(r.VirtualPerWall > 0) || r.Overload != nil ||
		r.Steps.Min < 15 || r.Steps.Mean > 31 || r.StalledNodes != 0 {
		t.Errorf("result %+v", r)
	}
	for _, f := range []string{cpu, heap, heap + ".goroutines", filepath.Join(out, "summary.json"), filepath.Join(out, "churn_events.csv")} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 && !strings.HasSuffix(f, ".csv") {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	if !strings.Contains(stderr.String(), "s virtual") || !strings.Contains(stderr.String(), "testnet: estimate: about") {
		t.Errorf("progress does not show the estimate, virtual time and speed:\n%s", stderr.String())
	}
	// A run far beyond the machine's memory is refused before it starts,
	// as a usage error, naming the way out.
	// (A run that starts instead is killed at the context's end.)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	big := exec.CommandContext(ctx, bin, "testnet", "--nodes", "1000", "--model", "logreg", "--data", "mnist", "--exchange", "gossip", "--quiet")
	msg, err := big.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(msg), "--force") {
		t.Errorf("a 1000-node MNIST run over gossip: %v\n%s", err, msg)
	}
}

// TestTestnetVirtualClockInterrupt: SIGINT stops a virtual-clock run early;
// it still reports the time it ran, and exits 0.
func TestTestnetVirtualClockInterrupt(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	cmd := exec.Command(bin, "testnet", "--nodes", "6", "--duration", "1h", "--model", "none", "--barrier", "pssp:2:1", "--json")
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
	sc := bufio.NewScanner(errPipe)
	var seen []string
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.Contains(sc.Text(), "s virtual") { // training runs
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
		done <- cmd.Wait()
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
	var r struct {
		DurationS float64 `json:"duration_s"`
	}
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil || !(r.DurationS > 0 && r.DurationS < 3600) {
		t.Errorf("after SIGINT: duration %v s (err %v), want part of the hour", r.DurationS, err)
	}
}
