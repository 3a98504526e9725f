package wire

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestByteBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type take struct {
		p    peer.ID
		n    uint64
		at   time.Duration
		want bool
	}
	for _, tc := range []struct {
		name  string
		takes []take
	}{
		{"a peer's minute", []take{{"a", 200, 0, true}, {"a", 200, time.Second, true}, {"a", 1, 2 * time.Second, false}}},
		{"the next minute", []take{{"a", 400, 0, true}, {"a", 1, 59 * time.Second, false}, {"a", 400, time.Minute, true}}},
		{"all peers", []take{{"a", 400, 0, true}, {"b", 400, 0, true}, {"c", 300, 0, false}, {"c", 200, 0, true}}},
		{"too large at once", []take{{"a", 401, 0, false}, {"a", 400, 0, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewByteBudget(4, 10) // a unit of 100 bytes: 400 a peer, 1000 in all
			for i, tk := range tc.takes {
				if got := b.Take(tk.p, tk.n, 100, t0.Add(tk.at)); got != tk.want {
					t.Errorf("take %d (%d bytes of %s at %v): %v, want %v", i, tk.n, tk.p, tk.at, got, tk.want)
				}
			}
		})
	}
	// Settle gives back what a request did not send, and charges more.
	b := NewByteBudget(4, 10)
	if !b.Take("a", 400, 100, t0) {
		t.Fatal("first take refused")
	}
	b.Settle("a", 400, 100) // sent 100 of 400
	if !b.Take("a", 300, 100, t0) || b.Take("a", 1, 100, t0) {
		t.Error("settle did not give back the 300 bytes not sent")
	}
	var zero ByteBudget
	if zero.Take("a", 1, 100, t0) {
		t.Error("the zero budget served")
	}
}
