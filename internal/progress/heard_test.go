package progress

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// A peer heard from counts for hold; one that left, or was forgotten, no
// more; a leave is dated.
func TestHeard(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const hold = time.Minute
	for _, tc := range []struct {
		name string
		do   func(h *Heard)
		at   time.Duration // when Lately asks, after t0
		want bool
	}{
		{"none", func(*Heard) {}, 0, false},
		{"heard", func(h *Heard) { h.Note(t0, hold, "a") }, hold - time.Second, true},
		{"heard too long ago", func(h *Heard) { h.Note(t0, hold, "a") }, hold + time.Second, false},
		{"left", func(h *Heard) { h.Note(t0, hold, "a"); h.Left("a", t0) }, 0, false},
		{"forgotten", func(h *Heard) { h.Note(t0, hold, "a", "b"); h.Forget("a"); h.Forget("b") }, 0, false},
		{"one of two left", func(h *Heard) { h.Note(t0, hold, "a", "b"); h.Left("a", t0) }, 0, true},
	} {
		var h Heard
		tc.do(&h)
		if got := h.Lately(t0.Add(tc.at), hold); got != tc.want {
			t.Errorf("%s: Lately %v, want %v", tc.name, got, tc.want)
		}
	}
	var h Heard
	if !h.LastLeave().IsZero() {
		t.Error("a leave before any")
	}
	h.Left(peer.ID("a"), t0)
	if !h.LastLeave().Equal(t0) {
		t.Errorf("last leave %v, want %v", h.LastLeave(), t0)
	}
}

// Note says which peers are new: not heard lately, or never.
func TestHeardNoteFresh(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const hold = time.Minute
	var h Heard
	if got := h.Note(t0, hold, "a", "b"); len(got) != 2 {
		t.Errorf("first note: fresh %v, want a and b", got)
	}
	if got := h.Note(t0.Add(time.Second), hold, "a", "c"); len(got) != 1 || got[0] != "c" {
		t.Errorf("second note: fresh %v, want c", got)
	}
	if got := h.Note(t0.Add(2*hold), hold, "b"); len(got) != 1 {
		t.Errorf("a peer unheard for longer than hold: fresh %v, want b", got)
	}
}
