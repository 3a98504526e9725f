package node

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt")
	in := Checkpoint{Job: "j", Step: 42, ModelID: 7, Params: []float64{1, -2, 3.5}}
	if err := WriteCheckpoint(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadCheckpoint(path)
	if err != nil || out.Job != "j" || out.Step != 42 || out.ModelID != 7 || len(out.Params) != 3 || out.Params[2] != 3.5 {
		t.Fatalf("read back %+v, %v", out, err)
	}
	// Overwrite atomically: the new content replaces the old.
	in.Step = 43
	if err := WriteCheckpoint(path, in); err != nil {
		t.Fatal(err)
	}
	if out, _ := ReadCheckpoint(path); out.Step != 43 {
		t.Errorf("step %d after overwrite", out.Step)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".checkpoint-*")); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

func TestCheckpointCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt")
	if err := WriteCheckpoint(path, Checkpoint{Job: "j", Step: 1, ModelID: 1, Params: []float64{1, 2, 3, 4}}); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	flip := append([]byte(nil), good...)
	flip[len(flip)/2] ^= 0x40
	for name, b := range map[string][]byte{
		"truncated": good[:len(good)-5],
		"flipped":   flip,
		"empty":     {},
		"magic":     append([]byte("XXXXXXXX"), good[8:]...),
	} {
		if _, err := ParseCheckpoint(b); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: want ErrCheckpoint, got %v", name, err)
		}
	}
	if _, err := ReadCheckpoint(filepath.Join(t.TempDir(), "missing")); err == nil || errors.Is(err, ErrCheckpoint) {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzCheckpoint(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "c")
	_ = WriteCheckpoint(path, Checkpoint{Job: "fuzz", Step: 3, ModelID: 9, Params: []float64{0.5, 1}})
	seed, _ := os.ReadFile(path)
	f.Add(seed)
	f.Add([]byte("PSPCKPT1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCheckpoint(b)
		if err == nil && (c.Step < 0 || len(c.Params) > maxCheckpointParams) {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// A node stopped at step 12 writes a checkpoint; a node started from it
// resumes at step 12 with that model and with its learning-rate schedule
// at step 12 (not at LR0 again). A corrupt checkpoint is ignored.
func TestNodeResumesFromCheckpoint(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodes(t, 2, "asp", 0.001, memHosts(t, mn))
		path := filepath.Join(t.TempDir(), "n0.ckpt")
		nd := nodes[0]
		nd.cfg.Checkpoint, nd.cfg.CheckpointEvery, nd.cfg.MaxSteps = path, 5, 12
		nd.cfg.JoinFetch = false
		if err := nd.Run(t.Context()); err != nil {
			t.Fatal(err)
		}
		c, err := ReadCheckpoint(path)
		if err != nil || c.Step != 12 || c.Job != "nodetest" || len(c.Params) != nd.task.NumParams() {
			t.Fatalf("checkpoint after stop: %+v, %v", c, err)
		}
		other := nodes[1]
		other.cfg.Checkpoint, other.cfg.MaxSteps, other.cfg.JoinFetch = path, 12, false
		other.resume()
		if other.Step() != 12 {
			t.Errorf("resumed at step %d, want 12", other.Step())
		}
		if got := other.task.(*ModelTask).Trainer().Steps(); got != 12 {
			t.Errorf("resumed schedule at step %d, want 12", got)
		}
		got := other.task.Params()
		for i := range got {
			if got[i] != c.Params[i] {
				t.Fatalf("param %d not restored", i)
			}
		}
		// A corrupt checkpoint is ignored, not loaded.
		if err := os.WriteFile(path, []byte("PSPCKPT1 garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		other.step.Store(3)
		other.resume()
		if other.Step() != 3 {
			t.Errorf("a corrupt checkpoint changed the step to %d", other.Step())
		}
	})
}
