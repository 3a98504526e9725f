package wire

import (
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestInboundLimiter(t *testing.T) {
	a, b, c := peer.ID("a"), peer.ID("b"), peer.ID("c")
	tests := []struct {
		name     string
		per, all int
		ops      []struct {
			p       peer.ID
			acquire bool // false: release
			want    bool
		}
	}{
		{"per-peer cap", 2, 10, []struct {
			p       peer.ID
			acquire bool
			want    bool
		}{{a, true, true}, {a, true, true}, {a, true, false}, {b, true, true}, {a, false, true}, {a, true, true}}},
		{"total cap", 2, 3, []struct {
			p       peer.ID
			acquire bool
			want    bool
		}{{a, true, true}, {a, true, true}, {b, true, true}, {c, true, false}, {b, false, true}, {c, true, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewInbound(tt.per, tt.all)
			for i, op := range tt.ops {
				if !op.acquire {
					l.Release(op.p)
					continue
				}
				if got := l.Acquire(op.p); got != op.want {
					t.Fatalf("op %d: acquire(%s) = %v, want %v", i, op.p, got, op.want)
				}
			}
		})
	}
}
