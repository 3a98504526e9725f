package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pspnode/pspnode/examples/torch/evals"
	"github.com/pspnode/pspnode/internal/daemontest"
	"github.com/pspnode/pspnode/internal/syncbuf"
)

// The trainer API's tests with real processes: `pspnode run --trainer`
// daemons and Python trainers (clients/python, examples/torch). They need
// Debian's python3-torch, python3-grpcio, python3-protobuf and
// python3-numpy, which `make test` installs.

const python = "/usr/bin/python3"

// needPython fails the test when the Python packages are missing.
func needPython(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes")
	}
	out, err := exec.Command(python, "-c", "import torch, grpc, google.protobuf, numpy").CombinedOutput()
	if err != nil {
		t.Fatalf("%s cannot import torch, grpc, protobuf and numpy (%v: %s): install Debian's python3-torch python3-grpcio python3-protobuf python3-numpy (make test-deps does)",
			python, err, strings.TrimSpace(string(out)))
	}
}

// repoRoot is the repository's top directory (tests run in cmd/pspnode).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// pythonAlone are the Python client's test modules that each take a
// third or more of its tests' time: each runs in an interpreter of its
// own, beside one interpreter for every other module.
var pythonAlone = []string{"test_diloco", "test_optim"}

// TestPythonClient runs the Python client's own tests against the
// binary: every module under clients/python/tests, in three interpreters
// at once (pythonAlone, and the rest). Their tests mostly wait on the
// daemons they start, so together they take little more than the longest
// alone. Each interpreter has its own temporary folder, where the client
// puts its daemons' folders and removes those of dead owners.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	needPython(t)
	bin := buildBinary(t)
	dir := filepath.Join(repoRoot(t), "clients", "python", "tests")
	files, err := filepath.Glob(filepath.Join(dir, "test_*.py"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test modules in %s (%v)", dir, err)
	}
	var rest []string
	for _, f := range files {
		if m := strings.TrimSuffix(filepath.Base(f), ".py"); !slices.Contains(pythonAlone, m) {
			rest = append(rest, m)
		}
	}
	groups := [][]string{rest}
	for _, m := range pythonAlone {
		if !slices.Contains(files, filepath.Join(dir, m+".py")) {
			t.Fatalf("pythonAlone names %s, not a module in %s", m, dir)
		}
		groups = append(groups, []string{m})
	}
	type result struct {
		out []byte
		err error
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	results := make([]chan result, len(groups))
	for i, mods := range groups {
		results[i] = make(chan result, 1)
		cmd := exec.CommandContext(ctx, python, append([]string{"-m", "unittest", "-v"}, mods...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PSPNODE_BIN="+bin, "PYTHONDONTWRITEBYTECODE=1", "TMPDIR="+t.TempDir())
		go func() {
			out, err := cmd.CombinedOutput()
			results[i] <- result{out, err}
		}()
	}
	for i, mods := range groups {
		t.Run(strings.Join(mods, ","), func(t *testing.T) {
			r := <-results[i]
			if r.err != nil {
				t.Fatalf("python tests: %v\n%s", r.err, r.out)
			}
			if !strings.Contains(string(r.out), "\nOK") || strings.Contains(string(r.out), "skipped") {
				t.Fatalf("python tests did not all run:\n%s", r.out)
			}
		})
	}
}

// trainerProc is a running examples/torch/mnist.py.
type trainerProc struct {
	cmd    *exec.Cmd
	csv    string
	stderr *syncbuf.Buffer
	done   chan error
}

// startTrainer runs mnist.py as shard i of n against a daemon.
func startTrainer(t *testing.T, root, daemon, dir string, i, n int, extra ...string) *trainerProc {
	t.Helper()
	p := &trainerProc{csv: filepath.Join(dir, fmt.Sprintf("trainer%d-%d.csv", i, time.Now().UnixNano())), stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	args := append([]string{filepath.Join(root, "examples", "torch", "mnist.py"), "--daemon", daemon,
		"--shard", strconv.Itoa(i), "--shards", strconv.Itoa(n), "--eval-every", "0.5", "--duration", "240",
		"--lr", "0.2", "--out", p.csv, "--log", "warning"}, extra...)
	p.cmd = exec.Command(python, args...)
	p.cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// evaluations reads the trainer's evaluations so far.
func (p *trainerProc) evaluations() []evals.Eval {
	ev, _ := evals.Read(p.csv)
	return ev
}

// last is the trainer's latest evaluation, and whether it has one.
func (p *trainerProc) last() (evals.Eval, bool) {
	ev := p.evaluations()
	if len(ev) == 0 {
		return evals.Eval{}, false
	}
	return ev[len(ev)-1], true
}

// waitUntil polls cond every 100 ms until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTorchTrainers: three daemons and three PyTorch trainers (MNIST,
// pSSP) reach 90 % held-out accuracy; killing one trainer and its daemon
// leaves the others stepping; a fourth worker joins and starts from the
// job's parameters (its first evaluations within 2 points of the
// others'); a trainer with another model is refused with a message naming
// both. Not parallel, unlike the tests that mostly wait on daemons: its
// trainers compute, about a core between them, and reach the accuracy
// within a deadline.
func TestTorchTrainers(t *testing.T) {
	needPython(t)
	bin := buildBinary(t)
	root := repoRoot(t)
	dir := t.TempDir()
	daemon := func(name string, boot string) (*daemontest.Daemon, string) {
		sock := "unix:" + filepath.Join(dir, name+".sock")
		args := []string{"--job", "torch-e2e", "--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0",
			"--trainer", sock, "--barrier", "pssp:2:2", "--nat-traversal=false", "--log-level", "warn"}
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		return daemontest.Start(t, bin, args...), sock
	}
	d0, s0 := daemon("d0", "")
	d1, s1 := daemon("d1", d0.Addr)
	d2, s2 := daemon("d2", d0.Addr)
	trainers := []*trainerProc{
		startTrainer(t, root, s0, dir, 0, 3),
		startTrainer(t, root, s1, dir, 1, 3),
		startTrainer(t, root, s2, dir, 2, 3),
	}
	exited := func(p *trainerProc) error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("trainer exited early (%v): %s", err, p.stderr)
		default:
			return nil
		}
	}
	waitUntil(t, 3*time.Minute, "three trainers at 90 % held-out accuracy", func() bool {
		for _, p := range trainers {
			if err := exited(p); err != nil {
				t.Fatal(err)
			}
			if e, ok := p.last(); !ok || e.Accuracy < 0.90 {
				return false
			}
		}
		return true
	})
	for i, p := range trainers {
		e, _ := p.last()
		t.Logf("trainer %d: accuracy %.3f at step %.0f after %.1f s", i, e.Accuracy, e.Step, e.Time)
	}

	// Kill trainer 2 and its daemon: the others go on stepping.
	_ = trainers[2].cmd.Process.Signal(syscall.SIGKILL)
	_ = d2.Cmd.Process.Signal(syscall.SIGKILL)
	stepOf := func(d *daemontest.Daemon) int64 {
		var st struct {
			Step int64 `json:"step"`
		}
		if err := d.GetJSON("/status", &st); err != nil {
			return -1
		}
		return st.Step
	}
	base0, base1 := stepOf(d0), stepOf(d1)
	waitUntil(t, time.Minute, "the other two to take 50 more steps each", func() bool {
		return stepOf(d0) >= base0+50 && stepOf(d1) >= base1+50
	})

	// A fourth worker joins: its daemon fetches the job's model from a
	// peer's trainer. Its first evaluation, before its first step, is far
	// above a new model's (about 10 %): within 5 points of the lowest of
	// the others' recent evaluations. The median of its first three is
	// within 2 points of the median of the others' recent ones. (One
	// evaluation of a model in training moves by up to 3 points from the
	// next; comparing one with one failed about one run in five.)
	d3, s3 := daemon("d3", d0.Addr)
	joiner := startTrainer(t, root, s3, dir, 2, 3)
	waitUntil(t, time.Minute, "the joiner's first three evaluations", func() bool {
		if err := exited(joiner); err != nil {
			t.Fatal(err)
		}
		return len(joiner.evaluations()) >= 3
	})
	jev := joiner.evaluations()[:3]
	first := jev[0]
	var recent []float64 // the others' last five evaluations each
	for _, p := range trainers[:2] {
		ev := p.evaluations()
		for _, e := range ev[max(0, len(ev)-5):] {
			recent = append(recent, e.Accuracy)
		}
	}
	slices.Sort(recent)
	joined := []float64{jev[0].Accuracy, jev[1].Accuracy, jev[2].Accuracy}
	slices.Sort(joined)
	others, lowest := recent[len(recent)/2], recent[0]
	t.Logf("joiner's first evaluations: %.3f at step %.0f, then %.3f, %.3f; the others' recent: median %.3f, lowest %.3f",
		first.Accuracy, first.Step, jev[1].Accuracy, jev[2].Accuracy, others, lowest)
	if first.Step < 50 || first.Accuracy < lowest-0.05 || joined[1] < others-0.02 || joined[1] > others+0.02 {
		t.Fatalf("the joiner started at step %.0f with accuracy %.3f (median of three %.3f); the others' recent median is %.3f, lowest %.3f",
			first.Step, first.Accuracy, joined[1], others, lowest)
	}
	if stepOf(d3) < 1 {
		t.Fatalf("the joiner's daemon is at step %d", stepOf(d3))
	}

	// A trainer of another model (another hidden width: other shapes,
	// another parameter count and model ID) is refused, naming both.
	_, s4 := daemon("d4", d0.Addr)
	wrong := startTrainer(t, root, s4, dir, 0, 3, "--hidden", "64")
	var werr error
	select {
	case werr = <-wrong.done:
		wrong.done <- werr
	case <-time.After(time.Minute):
		t.Fatal("a trainer of another model was not refused within a minute")
	}
	msg := wrong.stderr.String()
	if werr == nil || !strings.Contains(msg, "model mismatch") || !strings.Contains(msg, `"mnist-mlp-64"`) ||
		!strings.Contains(msg, "101770 parameters") || !strings.Contains(msg, "50890 float32 parameters") {
		t.Fatalf("another model: exit %v, stderr:\n%s", werr, msg)
	}
}

// A daemon started with --trainer-owned stops cleanly (exit 0) when its
// standard input closes, as it does when the process that started it
// exits, however it exits.
func TestTrainerOwnedStopsWithStdin(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a process")
	}
	bin := buildBinary(t)
	sock := filepath.Join(t.TempDir(), "owned.sock")
	cmd := exec.Command(bin, "run", "--job", "owned", "--listen", "/ip4/127.0.0.1/tcp/0", "--trainer", "unix:"+sock,
		"--trainer-owned", "--nat-traversal=false", "--log-level", "info")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		done <- nil
	})
	waitUntil(t, 30*time.Second, "the daemon to serve its trainer API", func() bool { return strings.Contains(out.String(), "trainer: unix:") })
	select {
	case err := <-done:
		t.Fatalf("the daemon exited with its stdin open: %v\n%s", err, out)
	default:
	}
	_ = stdin.Close()
	select {
	case err := <-done:
		done <- err
		if err != nil || !strings.Contains(out.String(), "standard input closed") {
			t.Fatalf("exit %v after stdin closed:\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not stop within 30 s of its stdin closing:\n%s", out)
	}
}

// The Python client installs with pip into a virtual environment that
// sees Debian's packages (no package index: --no-deps
// --no-build-isolation) from a tree that carries the binary in
// pspnode/bin/, as scripts/wheels.sh (make dist, make wheel) builds its
// wheels: the wheel is a platform wheel, and the installed package, run
// from outside the repository with no pspnode on PATH and no
// $PSPNODE_BIN, starts the binary it carries and takes a step.
func TestPythonPackageInstalls(t *testing.T) {
	t.Parallel()
	needPython(t)
	bin := buildBinary(t)
	root := repoRoot(t)
	dir := t.TempDir()
	// pip builds in the source tree (build/, *.egg-info): build a copy.
	src := filepath.Join(dir, "src")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "clients", "python"), src).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	_ = os.RemoveAll(filepath.Join(src, "pspnode", "bin"))
	if err := os.MkdirAll(filepath.Join(src, "pspnode", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", bin, filepath.Join(src, "pspnode", "bin", "pspnode")).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	wheels := filepath.Join(dir, "wheels")
	wheel := exec.Command(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, src)
	wheel.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := wheel.CombinedOutput(); err != nil {
		t.Fatalf("pip wheel (python3-pip, python3-setuptools, python3-wheel): %v: %s", err, out)
	}
	built, _ := filepath.Glob(filepath.Join(wheels, "pspnode-*.whl"))
	if len(built) != 1 || !strings.Contains(filepath.Base(built[0]), "-py3-none-linux_") {
		t.Fatalf("wheels %v: want one platform wheel, py3-none-linux_*", built)
	}
	// The venv's pip is Debian's, which it sees: a venv of its own pip
	// (ensurepip) costs several seconds more and installs the same.
	venv := filepath.Join(dir, "venv")
	if out, err := exec.Command(python, "-m", "venv", "--system-site-packages", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("venv (Debian's python3-venv; make test-deps installs it): %v: %s", err, out)
	}
	pip := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-deps", "--no-index", built[0])
	pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v: %s", built[0], err, out)
	}
	script := `
import os, shutil, sys, torch, pspnode
from pspnode.trainer.v3 import trainer_pb2
here = os.path.dirname(pspnode.__file__)
assert here.startswith(sys.prefix), (here, sys.prefix)
assert os.path.exists(os.path.join(here, "trainer", "v3", "trainer_pb2.pyi")), "no .pyi installed"
assert os.path.exists(os.path.join(here, "py.typed"))
assert shutil.which("pspnode") is None and "PSPNODE_BIN" not in os.environ
found = pspnode.find_binary()
assert found == os.path.join(here, "bin", "pspnode"), found
m = torch.nn.Linear(3, 1)
opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="installed", start_timeout=30)
opt.zero_grad(); m(torch.ones(2, 3)).sum().backward(); opt.step()
print("installed", here, "binary", found, "step", opt.step_count)
opt.close()
`
	run := exec.Command(filepath.Join(venv, "bin", "python"), "-c", script)
	run.Dir = dir // not the repository: the import must come from the venv
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PSPNODE_BIN=") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	run.Env = append(env, "PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1")
	out, err := run.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "step 1") {
		t.Fatalf("the installed package: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// The Python client's generated code is what scripts/proto-python.sh
// (make proto) makes of the .proto files now: a .proto changed without
// `make proto` fails here.
func TestPythonStubsCurrent(t *testing.T) {
	t.Parallel()
	needPython(t)
	root := repoRoot(t)
	dir := t.TempDir()
	if out, err := exec.Command(filepath.Join(root, "scripts", "proto-python.sh"), dir).CombinedOutput(); err != nil {
		t.Fatalf("scripts/proto-python.sh (protobuf-compiler, protobuf-compiler-grpc, mypy-protobuf; make test-deps installs them): %v: %s", err, out)
	}
	n := 0
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		want, _ := os.ReadFile(path)
		got, err := os.ReadFile(filepath.Join(root, "clients", "python", rel))
		if err != nil {
			t.Errorf("%s: generated, not committed: run make proto", rel)
			return nil
		}
		if string(got) != string(want) {
			t.Errorf("clients/python/%s differs from what the .proto files make: run make proto", rel)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Fatalf("only %d generated files", n)
	}
}
