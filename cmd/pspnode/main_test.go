package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"--help"}, 0, "sim"},
		{[]string{"sim", "--help"}, 0, "--sweep-beta"},
		{[]string{"bound", "--help"}, 0, "--staleness"},
		{[]string{"sim", "--nodes", "x"}, 2, "invalid value"},
		{[]string{"sim", "--barrier", "pssp:10"}, 2, "pssp takes 2 parameter"},
		{[]string{"sim", "--barrier", "BSP"}, 2, `did you mean "bsp"`},
		{[]string{"sim", "--nodes", "0"}, 2, "nodes 0 out of range"},
		{[]string{"sim", "--stragglers", "2"}, 2, "not a fraction"},
		{[]string{"sim", "--barrier", "bsp", "--sweep-beta", "1,2"}, 2, "needs one probabilistic barrier (pbsp, pssp or pdssp)"},
		{[]string{"sim", "--churn-mode", "explode"}, 2, "unknown churn mode"},
		{[]string{"sim", "--mode", "fast"}, 2, "want fidelity, poll or timed"},
		{[]string{"sim", "--mode", "timed", "--barrier", "dssp:2:6"}, 2, "the simulator's DSSP is the server-based baseline: use fidelity or poll"},
		{[]string{"sim", "extra"}, 2, "takes no arguments"},
		{[]string{"bound", "--F", "1"}, 2, "must be in (0, 1)"},
		{[]string{"bound", "--beta", "-1"}, 2, "not a non-negative integer"},
		{[]string{"testnet", "--gc-percent", "-5"}, 2, "--gc-percent must be >= 0"},
		{[]string{"testnet", "--gc-percent", "x"}, 2, "invalid value"},
		{[]string{"testnet", "--clock", "wall"}, 2, "want virtual or real"},
		{[]string{"testnet", "--poll-share", "0"}, 2, "not a share in (0, 1]"},
		{[]string{"run", "--poll-share", "1.5"}, 2, "not a share in (0, 1]"},
		{[]string{"run", "--query-timeout", "0s"}, 2, "--query-timeout must be a positive duration"},
		{[]string{"run", "--query-timeout", "soon"}, 2, "invalid value"},
		{[]string{"run", "--poll-max", "-1ms"}, 2, "--poll-max must be a positive duration"},
		{[]string{"testnet", "--transport", "tcp"}, 2, "the virtual clock needs the mem transport"},
		{[]string{"testnet", "--time-scale", "0"}, 2, "cannot run on the virtual clock"},
		{[]string{"testnet", "--time-scale", "-1"}, 2, "not a number >= 0"},
		{[]string{"testnet", "--latency", "uniform:80ms-10ms"}, 2, "uniform:MIN-MAX"},
		{[]string{"testnet", "--bandwidth", "fast"}, 2, "want a rate such as 100mbit"},
		{[]string{"testnet", "--clock", "real", "--time-scale", "0", "--compare-sim"}, 2, "--compare-sim needs the time model"},
		{[]string{"testnet", "--exchange", "epidemic:0"}, 2, "S must be a whole number >= 1"},
		{[]string{"run", "--exchange", "epidemic:x"}, 2, "S must be a whole number >= 1"},
		{[]string{"run", "--exchange", "push"}, 2, "want gossip or epidemic:S"},
		{[]string{"testnet", "--exchange", "epidemic:2", "--encoding", "topk32"}, 2, "sends whole models"},
		{[]string{"run", "--nat-traversal=false", "--relay-service"}, 2, "--relay-service needs --nat-traversal"},
		{[]string{"run", "--relay-service=maybe"}, 2, "invalid boolean value"},
		{[]string{"run", "--reachability", "open"}, 2, "want auto, public or private"},
		{[]string{"run", "--nat-traversal=false", "--reachability", "public"}, 2, "--reachability public needs --nat-traversal"},
		{[]string{"run", "--per-address", "-1"}, 2, "--per-address must be >= 0"},
		{[]string{"testnet", "--hostile", "sybil-zone:1"}, 2, "want a percentage in (0, 100%) or a fraction in (0, 1)"},
		{[]string{"testnet", "--hostile", "sybil-host:0%"}, 2, "want a percentage in (0, 100%)"},
		{[]string{"testnet", "--hostile", "sybil-zone:60%,sybil-host:40%"}, 2, "some nodes must stay honest"},
		{[]string{"testnet", "--hostile", "sybil-grind:5%"}, 2, "want one of"},
		{[]string{"testnet", "--hostile", "sybil-zone:10%", "--sybil-prefix", "21"}, 2, "sybil prefix 21"},
		{[]string{"testnet", "--hostile", "sybil-zone:10%", "--sybil-victims", "-2"}, 2, "sybil victims -2"},
		{[]string{"testnet", "--hostile", "sybil-zone:80%", "--nodes", "10", "--sybil-victims", "3"}, 2, "3 victims, but only about 2 honest nodes"},
		{[]string{"testnet", "--sybil-defence=maybe"}, 2, "invalid"},
		{[]string{"testnet", "--transport", "netns", "--clock", "virtual"}, 2, "use --clock real with --transport netns"},
		{[]string{"testnet", "--transport", "netns", "--latency", "20ms"}, 2, "netem"},
		{[]string{"testnet", "--transport", "netns", "--loss", "0.1"}, 2, "netem"},
		{[]string{"testnet", "--transport", "netns", "--nodes", "3", "--nat", "3"}, 2, "node 0, the bootstrap node, stays public"},
		{[]string{"testnet", "--transport", "netns", "--cpu-quota", "2:1"}, 2, "FRACTION:CORES"},
		{[]string{"testnet", "--clock", "real", "--nat", "2"}, 2, "need --transport netns"},
		{[]string{"testnet", "--transport", "netns", "--churn", "0.2"}, 2, "churn"},
		{[]string{"testnet", "--data", "/does/not/exist"}, 2, `--data "/does/not/exist": want synthetic, mnist`},
		{[]string{"nosuch"}, 2, ""},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("pspnode %v: exit %d (want %d), stderr %q (want it to contain %q)", tc.args, code, tc.code, stderr, tc.want)
		}
	}
}

func TestTestnetGCPercent(t *testing.T) {
	for _, tc := range []struct {
		flag, nodes int
		env         string
		want        int
	}{
		{0, 50, "", 200},
		{0, 500, "", 200},
		{0, 1000, "", 100}, // memory first: Go's default
		{300, 1000, "", 300},
		{300, 50, "150", 0}, // GOGC in the environment wins
		{0, 50, "off", 0},
	} {
		if got := testnetGCPercent(tc.flag, tc.nodes, tc.env); got != tc.want {
			t.Errorf("testnetGCPercent(%d, %d, %q) = %d, want %d", tc.flag, tc.nodes, tc.env, got, tc.want)
		}
	}
	// The estimate assumes what is set, else GOGC's number, else the
	// default (0).
	for _, tc := range []struct {
		set  int
		env  string
		want int
	}{
		{200, "", 200}, {0, "150", 150}, {0, "off", 0}, {0, "", 0}, {0, "-5", 0},
	} {
		if got := estimateGCPercent(tc.set, tc.env); got != tc.want {
			t.Errorf("estimateGCPercent(%d, %q) = %d, want %d", tc.set, tc.env, got, tc.want)
		}
	}
}

func TestSimJSON(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "--nodes", "30", "--duration", "40s", "--barrier", "pssp:5:2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatal("stdout holds more than one JSON value")
	}
	for _, k := range []string{"barrier", "nodes", "duration_s", "seed", "steps"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("missing %q in %v", k, obj)
		}
	}
	steps := obj["steps"].(map[string]any)
	for _, k := range []string{"min", "mean", "max", "p5", "p50", "p95", "stddev"} {
		if _, ok := steps[k]; !ok {
			t.Errorf("steps missing %q", k)
		}
	}
	if obj["barrier"] != "pssp:5:2" || obj["nodes"] != 30.0 || obj["duration_s"] != 40.0 {
		t.Errorf("wrong header fields: %v", obj)
	}
}

func TestSimSweepAndOut(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "sim", "--nodes", "30", "--duration", "30s", "--barrier", "pbsp:1", "--sweep-beta", "0,2,8", "--json", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var arr []map[string]any
	if err := json.Unmarshal([]byte(out), &arr); err != nil || len(arr) != 3 {
		t.Fatalf("want a JSON array of 3 runs, got %v: %s", err, out)
	}
	if arr[0]["barrier"] != "pbsp:0" || arr[2]["barrier"] != "pbsp:8" {
		t.Errorf("sweep barriers: %v, %v", arr[0]["barrier"], arr[2]["barrier"])
	}
	for _, f := range []string{"final_steps.csv", "steps_over_time.csv", "summary.json", "beta_sweep.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

func TestSweepWithoutBarrierSweepsPBSP(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "--nodes", "20", "--duration", "10s", "--sweep-beta", "0,3", "--json")
	var arr []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &arr) != nil || len(arr) != 2 || arr[1]["barrier"] != "pbsp:3" {
		t.Fatalf("exit %d, %s: %s", code, errs, out)
	}
	// Naming the paper's five barriers explicitly is a list, not one barrier.
	if code, _, _ := runCLI(t, "sim", "--barrier", paperBarriers, "--sweep-beta", "1"); code != 2 {
		t.Errorf("a list of barriers with --sweep-beta: exit %d, want 2", code)
	}
}

func TestSimTable(t *testing.T) {
	code, out, _ := runCLI(t, "sim", "--nodes", "20", "--duration", "20s")
	if code != 0 || !strings.Contains(out, "pssp:10:4") || !strings.Contains(out, "bsp") {
		t.Errorf("default sim should compare the paper's five barriers; exit %d:\n%s", code, out)
	}
}

func TestBound(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "bound", "--beta", "1,10", "--F", "0.5,0.9", "--json", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rows []map[string]float64
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 4 {
		t.Fatalf("want 4 rows: %v %s", err, out)
	}
	// F=0.5, β=1, r=4, T=10000: S=2/3, mean bound 14.667 (see psp tests).
	if m := rows[0]["mean_bound"]; m < 14.66 || m > 14.67 {
		t.Errorf("mean bound %v, want 14.667", m)
	}
	for _, f := range []string{"bound.csv", "bound_mean.png", "bound_variance.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestTestnetProfiles runs a tiny testnet with both profiles and checks
// that each file was written during training and says so on stderr.
func TestTestnetProfiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cpu, heap := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "heap.pprof")
	code, _, errs := runCLI(t, "testnet", "--clock", "real", "--nodes", "6", "--duration", "4s", "--warmup", "2s",
		"--model", "none", "--barrier", "pssp:2:1", "--json", "--cpu-profile", cpu, "--mem-profile", heap)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, f := range []string{cpu, heap, heap + ".goroutines"} {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	if !strings.Contains(errs, "goroutines") {
		t.Errorf("stderr does not report the memory split: %q", errs)
	}
}

// pspnode version prints the -ldflags version, or without one the module
// version from the build information, never nothing.
func TestVersion(t *testing.T) {
	if code, out, _ := runCLI(t, "version"); code != 0 || out != "pspnode devel\n" {
		t.Errorf("version without -ldflags: exit %d, %q; want pspnode devel", code, out)
	}
	defer func(v string) { version = v }(version)
	version = "v1.2.3"
	if _, out, _ := runCLI(t, "version"); out != "pspnode v1.2.3\n" {
		t.Errorf("version set by -ldflags: %q", out)
	}
}

// --mode timed runs the nodes' own barrier policy in the simulator.
func TestSimTimedMode(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "--nodes", "30", "--duration", "40s", "--barrier", "pbsp:5", "--mode", "timed", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Mode  string `json:"mode"`
		Steps struct {
			Mean float64 `json:"mean"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// 40 s of 2-s steps: a node under pBSP(5) makes some, and fewer than 20.
	if res.Mode != "timed" || !(res.Steps.Mean > 5 && res.Steps.Mean < 20) {
		t.Errorf("mode %q, mean step %v", res.Mode, res.Steps.Mean)
	}
}
