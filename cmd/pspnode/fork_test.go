package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// These tests run the README's commands as a user would, on 127.0.0.1.

// A node started with another --model than the job it joins exits 2 with
// a message that names --model and both models, and the job's node says
// so in its log. (It used to join, fail its model fetch with a message
// about a malformed model id, and train alone.)
func TestRunRefusesAnotherModel(t *testing.T) {
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
