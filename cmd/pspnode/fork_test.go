package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the README's commands as a user would, on 127.0.0.1.

// A node started with another --model than the job it joins exits 2 with
// a message that names --model and both models, and the job's node says
// so in its log. (It used to join, fail its model fetch with a message
// about a malformed model id, and train alone.)
func TestRunRefusesAnotherModel(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	common := []string{"--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0", "--job", "models",
		"--barrier", "pssp:1:2", "--time-scale", "0.02", "--log-level", "warn"}
	a := startNode(t, bin, common...)
	b := startNode(t, bin, append(common, "--model", "logreg", "--bootstrap", a.Addr)...)
	select {
	case err := <-b.Done:
		b.Done <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("pspnode run --model logreg in a linreg job ended with %v, want exit code 2; stderr:\n%s", err, b.Stderr)
		}
		msg := b.Stderr.String()
		for _, want := range []string{"--model logreg", "model mismatch", "0x1f8601fc", "0xf42a5c89"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the error does not say %q:\n%s", want, msg)
			}
		}
	case <-time.After(30 * time.Second):
		st, _ := getStatus(b)
		t.Fatalf("pspnode run --model logreg still runs in a linreg job after 30 s, at step %d; stderr:\n%s", st.Step, b.Stderr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(a.Stderr.String(), "runs another model") {
		if time.Now().After(deadline) {
			t.Fatalf("the job's node did not log the other model; stderr:\n%s", a.Stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The first node of a job, stopped and started again with its original
// command (no --bootstrap), rejoins the job through the peers it knew
// (kept beside its identity file): it takes the job's step, model and
// lineage instead of starting the job again from step 0, and the others
// go on without waiting for it. (It used to start again from step 0 with
// a fresh model; when the others met it they quarantined its reports,
// then waited for it to catch up.)
func TestRestartedFirstNodeRejoins(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	identity := filepath.Join(t.TempDir(), "a.key")
	common := []string{"--http", "127.0.0.1:0", "--job", "restart",
		"--barrier", "pssp:2:2", "--time-scale", "0.02", "--log-level", "warn"}
	first := append([]string{"--identity", identity, "--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port)}, common...)
	a := startNode(t, bin, first...)
	others := append([]string{"--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", a.Addr}, common...)
	b := startNode(t, bin, others...)
	c := startNode(t, bin, others...)

	type lineage struct {
		Step    int64  `json:"step"`
		Lineage string `json:"lineage"`
	}
	stat := func(p *proc) lineage {
		t.Helper()
		var s lineage
		if err := p.GetJSON("/status", &s); err != nil {
			t.Fatalf("status of %s: %v\nstderr:\n%s", p.ID, err, p.Stderr)
		}
		return s
	}
	low := func() int64 { return min(stat(b).Step, stat(c).Step) }
	waitUntil := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("the job reaches step 200", 90*time.Second, func() bool { return low() >= 200 })
	job := stat(b).Lineage

	if err := a.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-a.Done; err != nil {
		t.Fatalf("the first node exited with %v after SIGTERM; stderr:\n%s", err, a.Stderr)
	}
	a.Done <- nil
	if _, err := os.Stat(identity + ".peers"); err != nil {
		t.Errorf("no peers file beside the identity: %v", err)
	}
	at := low()
	a = startNode(t, bin, first...)
	// Its first step is the job's, not 1: alone it makes about 25 steps a
	// second.
	var got lineage
	waitUntil("the restarted node takes a step", 30*time.Second, func() bool { got = stat(a); return got.Step > 0 })
	if got.Step < at-5 {
		t.Errorf("the restarted first node is at step %d, the job was at %d when it restarted", got.Step, at)
	}
	if job == "" || got.Lineage != job {
		t.Errorf("the restarted first node's lineage is %q, the job's %q", got.Lineage, job)
	}
	base := low()
	waitUntil("the job goes on", 30*time.Second, func() bool { return low() >= base+100 && stat(a).Step >= base+100 })
}
