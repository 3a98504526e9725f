package trainer

import (
	"slices"
	"testing"
)

// Peers' updates are summed for the trainer's pull with the steps they
// were made at, for their staleness; an update whose step is not known
// (-1: one held before the node's first step) is summed but tells none.
func TestApplySumsUpdatesAndKnownSteps(t *testing.T) {
	m := NewRemoteModel()
	if _, err := m.fix("m", 1, 2, false); err != nil {
		t.Fatal(err)
	}
	m.begin(&session{}, nil)
	for _, u := range []struct {
		v    []float32
		step int64
	}{{[]float32{1, 2}, 5}, {[]float32{1, 1}, -1}} {
		if err := m.Apply(u.v, u.step); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Apply([]float32{1}, 6); err == nil {
		t.Error("an update of the wrong length was taken")
	}
	dst := make([]float32, 2)
	k, steps := m.pull(dst)
	if k != 2 || !slices.Equal(dst, []float32{2, 3}) || !slices.Equal(steps, []int64{5}) {
		t.Errorf("pulled %d updates %v of steps %v, want 2 [2 3] of steps [5]", k, dst, steps)
	}
}
