package builtin

import (
	"math"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/model"
)

// DataFor maps the --data flag to a data spec for model.Open: "mnist" (no
// directory) is passed through, and model.Open reads it as the MNIST set
// built into the binary (model's TestOpen and TestEmbeddedMNIST load it);
// "synthetic" depends on the model.
func TestDataFor(t *testing.T) {
	for _, tc := range []struct{ model, data, want string }{
		{"logreg", "mnist", "mnist"},
		{"mlp", "mnist:/data/mnist", "mnist:/data/mnist"},
		{"linreg", "synthetic", "synthetic:regression"},
		{"logreg", "synthetic", "synthetic"},
	} {
		if got := DataFor(tc.model, tc.data); got != tc.want {
			t.Errorf("DataFor(%s, %s) = %q, want %q", tc.model, tc.data, got, tc.want)
		}
	}
}

// New builds a model task that steps on its shard, and refuses a
// model that does not fit the data.
func TestNewTask(t *testing.T) {
	data, err := model.Open(DataFor("logreg", "synthetic"))
	if err != nil {
		t.Fatal(err)
	}
	task, err := New(Spec{Model: "logreg", Shard: 1, Shards: 4, SGD: model.DefaultSGDConfig(), Seed: 1, InitSeed: 2}, data)
	if err != nil {
		t.Fatal(err)
	}
	want := (data.Train.Dim + 1) * data.Train.Classes
	if task.NumParams() != want {
		t.Errorf("logreg has %d parameters, want %d", task.NumParams(), want)
	}
	upd, err := task.Step(t.Context())
	if err != nil || len(upd) != want {
		t.Fatalf("step: %d values, %v", len(upd), err)
	}
	if _, err := New(Spec{Model: "linreg", Shards: 1, SGD: model.DefaultSGDConfig()}, data); err == nil {
		t.Error("linreg accepted classification data")
	}
}

// New refuses a time model that is not a finite number >= 0, naming it.
func TestNewRefusesBadTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		tm   TimeModel
	}{
		{"NaN scale", TimeModel{Scale: math.NaN()}},
		{"infinite scale", TimeModel{Scale: math.Inf(1)}},
		{"negative factor", TimeModel{Scale: 1, Factor: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Spec{Model: "none", Time: tc.tm}, model.Data{})
			if err == nil || !strings.Contains(err.Error(), "time model") {
				t.Errorf("err %v, want one naming the time model", err)
			}
		})
	}
	if _, err := New(Spec{Model: "none", Time: TimeModel{Scale: 0.5, Factor: 2}}, model.Data{}); err != nil {
		t.Errorf("a good time model refused: %v", err)
	}
}
