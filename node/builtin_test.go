package node

import (
	"testing"

	"github.com/pspnode/pspnode/model"
)

// --data mnist needs no directory: it is the MNIST set built into the
// binary, on which a logistic-regression task trains.
func TestBuiltinTaskOnEmbeddedMNIST(t *testing.T) {
	if got := DataFor("logreg", "mnist"); got != "mnist" {
		t.Fatalf("DataFor(logreg, mnist) = %q", got)
	}
	if got := DataFor("linreg", "synthetic"); got != "synthetic:regression" {
		t.Errorf("DataFor(linreg, synthetic) = %q", got)
	}
	data, err := model.Open(DataFor("logreg", "mnist"))
	if err != nil {
		t.Fatal(err)
	}
	task, err := NewTask(TaskSpec{Model: "logreg", Shard: 1, Shards: 4, SGD: model.DefaultSGDConfig(), Seed: 1, InitSeed: 2}, data)
	if err != nil {
		t.Fatal(err)
	}
	if task.NumParams() != 7850 {
		t.Errorf("logreg on MNIST has %d parameters, want 7850", task.NumParams())
	}
	upd, err := task.Step(t.Context())
	if err != nil || len(upd) != 7850 {
		t.Fatalf("step: %d values, %v", len(upd), err)
	}
	if _, err := NewTask(TaskSpec{Model: "linreg", Shards: 1, SGD: model.DefaultSGDConfig()}, data); err == nil {
		t.Error("linreg accepted MNIST classification data")
	}
}
