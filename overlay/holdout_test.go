package overlay

import (
	"slices"
	"testing"
)

// A peer held out leaves the known population and samples, and no sign of
// life brings it back (MarkDead's would), nor a report of its estimate,
// until Readmit.
func TestHoldOut(t *testing.T) {
	o := bareOverlay(t, DefaultConfig())
	ps := synthPeers(t, 7, 5)
	for _, p := range ps {
		o.MarkAlive(p)
	}
	out := ps[2]
	o.HoldOut(out)
	if !o.HeldOut(out) || o.HeldOutCount() != 1 {
		t.Fatalf("HeldOut %v, count %d", o.HeldOut(out), o.HeldOutCount())
	}
	check := func(when string, want int, in bool) {
		t.Helper()
		if got := o.PeerCount(); got != want {
			t.Errorf("%s: %d peers, want %d", when, got, want)
		}
		if got := slices.Contains(o.Peers(), out); got != in {
			t.Errorf("%s: the held-out peer among Peers: %v", when, got)
		}
	}
	check("held out", 4, false)
	o.MarkAlive(out)
	o.ObserveEstimate(out, 1000)
	check("held out, then alive", 4, false)
	if _, ok := o.reports[out]; ok {
		t.Error("a held-out peer's estimate was kept")
	}
	if !o.held.routingFilter(nil, ps[0]) || o.held.routingFilter(nil, out) {
		t.Error("the routing-table filter does not follow the set")
	}
	if !o.Readmit(out) || o.Readmit(out) {
		t.Error("Readmit reports whether the peer was held out")
	}
	o.MarkAlive(out)
	check("readmitted, then alive", 5, true)
}
