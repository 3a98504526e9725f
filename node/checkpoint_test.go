package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/checkpoint"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

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
		c, err := checkpoint.Read(path)
		if err != nil || c.Step != 12 || c.Job != "nodetest" || len(c.Params) != nd.model.NumParams() {
			t.Fatalf("checkpoint after stop: %+v, %v", c, err)
		}
		other := nodes[1]
		other.cfg.Checkpoint, other.cfg.MaxSteps, other.cfg.JoinFetch = path, 12, false
		other.resume()
		if other.Step() != 12 {
			t.Errorf("resumed at step %d, want 12", other.Step())
		}
		if got := other.model.(*builtin.ModelTask).SGD().Steps(); got != 12 {
			t.Errorf("resumed schedule at step %d, want 12", got)
		}
		got := other.model.Params()
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
