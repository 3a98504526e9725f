package overlay

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

func TestPoolWire(t *testing.T) {
	body := func(frame []byte) []byte {
		b, err := readPoolFrame(bytes.NewReader(frame))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, op := range []byte{poolOpJoin, poolOpLeave} {
		got, seq, err := decodePoolRequest(body(encodePoolRequest(op, 1<<40+3)))
		if err != nil || got != op || seq != 1<<40+3 {
			t.Errorf("request op %d: got %d, seq %d, %v", op, got, seq, err)
		}
	}
	for _, d := range []int{0, 1, 64, 1 << 20} {
		got, err := decodePoolReply(body(encodePoolReply(d)))
		if err != nil || got != d {
			t.Errorf("reply in-degree %d: got %d, %v", d, got, err)
		}
	}
	if got, _ := decodePoolReply(body(encodePoolReply(-3))); got != 0 {
		t.Errorf("negative in-degree encoded as %d, want 0", got)
	}

	bad := []struct {
		name string
		raw  []byte // a whole frame
		req  bool   // decode as a request (else as a reply)
	}{
		{"empty", nil, true},
		{"truncated length", []byte{0x80}, true},
		{"oversized frame", append([]byte{0xff, 0x7f}, make([]byte, 40)...), true},
		{"truncated body", []byte{2, poolVersion}, true},
		{"short request", frame([]byte{poolVersion, poolOpJoin, 0, 0, 0}), true},
		{"long request", frame(append(encodePoolRequest(poolOpJoin, 1)[1:], 0)), true},
		{"request version", frame([]byte{9, poolOpJoin, 0, 0, 0, 0, 0, 0, 0, 1}), true},
		{"unknown op", frame([]byte{poolVersion, 7, 0, 0, 0, 0, 0, 0, 0, 1}), true},
		{"short reply", frame([]byte{poolVersion, 0, 0, 1}), false},
		{"reply version", frame([]byte{2, 0, 0, 0, 0, 1}), false},
	}
	for _, c := range bad {
		b, err := readPoolFrame(bytes.NewReader(c.raw))
		if err == nil {
			if c.req {
				_, _, err = decodePoolRequest(b)
			} else {
				_, err = decodePoolReply(b)
			}
		}
		if !errors.Is(err, ErrPoolWire) {
			t.Errorf("%s: err = %v, want ErrPoolWire", c.name, err)
		}
	}
}

// FuzzPoolMessages feeds arbitrary bytes to the pool protocol's decoders:
// network input must give an error, never a panic or a large allocation.
func FuzzPoolMessages(f *testing.F) {
	f.Add(encodePoolRequest(poolOpJoin, 7))
	f.Add(encodePoolReply(64))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := readPoolFrame(bytes.NewReader(raw))
		if err != nil {
			return
		}
		if len(b) > maxPoolFrame {
			t.Fatalf("frame of %d bytes passed the cap", len(b))
		}
		if op, _, err := decodePoolRequest(b); err == nil && op != poolOpJoin && op != poolOpLeave {
			t.Fatalf("decoded unknown op %d", op)
		}
		if d, err := decodePoolReply(b); err == nil && d < 0 {
			t.Fatalf("negative in-degree %d", d)
		}
	})
}

// TestInDegreeCounts runs 24 in-memory overlays with pools of 6 and checks
// that every node's in-degree (how many pools hold it, from the joins and
// leaves it received) equals the truth read off every pool, that pool
// members carry the in-degree they were told, and that the counts follow
// rotations (a leave and a join) and a departure (the connection closes).
func TestInDegreeCounts(t *testing.T) { bubble(t, testInDegreeCounts) }

func testInDegreeCounts(t *testing.T) {
	const n = 24
	_, nodes := memOverlays(t, n, "indegree", 100, 200, func(_ int, cfg *Config) {
		cfg.PoolSize = 6
		cfg.RotateInterval = time.Hour // rotations are made by hand below
	})
	gone := map[peer.ID]bool{}
	// consistent reports whether each live node's in-degree equals the
	// number of live pools holding it with a completed join.
	consistent := func() bool {
		truth := map[peer.ID]int{}
		for _, o := range nodes {
			if gone[o.h.ID()] {
				continue
			}
			o.mu.Lock()
			for _, m := range o.pool {
				if !m.joined || !m.verified {
					o.mu.Unlock()
					return false // a join is still under way
				}
				truth[m.id]++
			}
			o.mu.Unlock()
		}
		for _, o := range nodes {
			if gone[o.h.ID()] {
				continue
			}
			if got := o.Status().InDegree; got != truth[o.h.ID()] {
				return false
			}
		}
		return true
	}
	eventually(t, 20*time.Second, "in-degrees to match the pools", consistent)

	// Members carry an in-degree at least 1 (our own join counts).
	for _, o := range nodes {
		o.mu.Lock()
		for _, m := range o.pool {
			if m.inDegree < 1 {
				t.Errorf("pool member with in-degree %d after its join", m.inDegree)
			}
		}
		o.mu.Unlock()
	}

	for _, o := range nodes {
		o.mu.Lock()
		for range 3 {
			o.rotateLocked()
		}
		o.mu.Unlock()
	}
	eventually(t, 20*time.Second, "in-degrees to follow rotations", consistent)

	for _, o := range nodes[n-4:] {
		gone[o.h.ID()] = true
		_ = o.Close()
		_ = o.h.Close()
	}
	eventually(t, 20*time.Second, "in-degrees to follow departures", consistent)
}
