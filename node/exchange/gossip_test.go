package exchange

import "testing"

// The norm bound: a received update is taken if its norm is within
// NormBound × the upper quartile of the node's own recent updates';
// before the node's first step updates are held, then judged.
func TestNormBound(t *testing.T) {
	b, node := testBase(t, 2, 1, 4)
	g := newGossip(b) // no topic: the norm bound alone
	// Before the node's first step, updates are held, then checked.
	if g.withinNorm([]float32{0.5}, "") || g.withinNorm([]float32{50}, "") {
		t.Fatal("accepted an update before the node has a reference norm")
	}
	g.noteOwnNorm(1)
	if node.model.applied != 1 {
		t.Fatalf("applied %d held updates, want 1 (the other is over the bound)", node.model.applied)
	}
	for _, nrm := range []float64{1, 2, 1, 100} { // upper quartile 2; one outlier of our own
		g.noteOwnNorm(nrm)
	}
	for _, tt := range []struct {
		in   []float32
		want bool
	}{
		{[]float32{3, 0}, true},
		{[]float32{0, -8}, true}, // exactly at the bound
		{[]float32{300, 400}, false},
		{[]float32{0, -8.01}, false},
	} {
		if got := g.withinNorm(tt.in, ""); got != tt.want {
			t.Errorf("withinNorm(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := counterValue(b.d.Counters.NormRefused); got != 3 {
		t.Errorf("refusal counter %v, want 3 (the held one over the bound and two others)", got)
	}
	b.cfg.NormBound = 0
	if !g.withinNorm([]float32{1e9}, "") {
		t.Error("NormBound 0 should disable the check")
	}
}
