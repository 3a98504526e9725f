// Package builtin holds the tasks pspnode run and the testnet build
// themselves (node.Task implementations): a model trained on a shard of a
// dataset (ModelTask), or no model, where a step only takes the PSP
// paper's synthetic time (SleepTask); and the helpers that pick them from
// the command line's words (Spec, New, DataFor, SeedOf).
package builtin

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/pspnode/pspnode/internal/task"
	"github.com/pspnode/pspnode/model"
)

// Spec describes a built-in task: a model trained on a shard of a
// dataset, or no model ("none": the step is only the time model's delay).
type Spec struct {
	// Model is none, linreg, logreg, mlp or mlp:H.
	Model string
	// Shard is the node's shard index in [0, Shards). Use model.ShardIndex
	// of the peer ID when there is no coordinator to assign indices.
	Shard, Shards int
	// SGD is the optimiser's configuration.
	SGD model.SGDConfig
	// Time is the paper's synthetic task time added to each step.
	Time TimeModel
	// Seed seeds the task's random stream (mini-batches, delays). The
	// initial parameters are the same on every node of a job (seeded by
	// the job's name, InitSeed), so that additive updates agree.
	Seed, InitSeed uint64
}

// DataFor returns the data spec (for model.Open) a model trains on, given
// the --data flag: "synthetic" means synthetic regression data for linreg
// and synthetic classification data otherwise; "mnist" is the MNIST test set
// built into the binary (model.EmbeddedMNIST: 8000 training and 2000
// held-out images, nothing to download); "mnist:DIR" reads IDX files from
// DIR. Other specs pass through unchanged.
func DataFor(modelName, data string) string {
	if data == "synthetic" && modelName == "linreg" {
		return "synthetic:regression"
	}
	return data
}

// New builds a built-in task on already-loaded data, so that a testnet
// of many nodes loads its dataset once.
func New(spec Spec, data model.Data) (task.Task, error) {
	if err := spec.Time.validate(); err != nil {
		return nil, err
	}
	if spec.Model == "" || spec.Model == "none" {
		return NewSleepTask(spec.Time, spec.Seed), nil
	}
	if data.Train == nil {
		return nil, fmt.Errorf("task %s: no training data", spec.Model)
	}
	m, err := model.New(spec.Model, data.Train.Dim, data.Train.Classes)
	if err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	if spec.Model == "linreg" && data.Train.Classes > 1 {
		return nil, fmt.Errorf("task: linreg needs regression data (synthetic:regression), got %s", data.Train.Name)
	}
	if spec.Model != "linreg" && data.Train.Classes < 2 {
		return nil, fmt.Errorf("task: %s needs classification data, got %s", spec.Model, data.Train.Name)
	}
	shards := max(spec.Shards, 1)
	shard, err := model.ShardOf(data.Train, spec.Shard, shards)
	if err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	init := m.Init(rand.New(rand.NewPCG(spec.InitSeed, 0x1217)))
	tr, err := model.NewSGD(m, shard, init, spec.SGD)
	if err != nil {
		return nil, fmt.Errorf("task: %w", err)
	}
	return NewModelTask(tr, data.Test, spec.Time, spec.Seed), nil
}

// SeedOf derives a 64-bit seed from a string (a peer ID, a job name).
func SeedOf(s string) uint64 {
	h := sha256.Sum256([]byte(s))
	return binary.BigEndian.Uint64(h[:8])
}
