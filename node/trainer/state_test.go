package trainer

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// A joining trainer that names a kind of state gets, in its Welcome, the
// state a peer's trainer of that kind keeps beside its parameters, under
// either exchange; a trainer of another kind, or of none, gets none, and
// the peer's trainer is asked for its state only by a joiner of its kind.
func TestJoinerGetsPeerTrainerState(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exchange string
		kind     string // the joiner's
		want     bool
	}{
		{"gossip", "gossip", "test.State/1", true},
		{"epidemic", "epidemic:1", "test.State/1", true},
		{"another kind", "gossip", "test.Other/1", false},
		{"no kind", "gossip", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edit := func(c *node.Config, _ *Config) {
				x, err := exchange.Parse(tc.exchange)
				if err != nil {
					t.Fatal(err)
				}
				c.Exchange.Spec = x
			}
			a := startDaemon(t, "state", nil, "asp", edit)
			b := startDaemon(t, "state", a, "asp", edit)
			peersKnow(t, a, b)
			params := fill(20, 0.5)
			ha := hello("m", 9, 20, 0)
			ha.StateKind = "test.State/1"
			ta, err := connect(t, a.addr, ha, func() (int64, []float32) { return 6, params })
			if err != nil {
				t.Fatal(err)
			}
			state := &pb.TrainerState{Kind: "test.State/1", Step: 6, Data: []byte("outer parameters and momentum")}
			ta.mu.Lock()
			ta.state = func() *pb.TrainerState { return state }
			ta.mu.Unlock()
			ctx := context.Background()
			for s := int64(1); s <= 6; s++ {
				if _, err := ta.step(ctx, s, params); err != nil {
					t.Fatal(err)
				}
			}
			hb := hello("m", 9, 20, 0)
			hb.StateKind = tc.kind
			tb, err := connect(t, b.addr, hb, nil)
			if err != nil {
				t.Fatal(err)
			}
			w := tb.welcome
			if w.Step != 6 || !w.HasParams {
				t.Fatalf("welcome at step %d with params %v: the joiner should start from the job's", w.Step, w.HasParams)
			}
			ta.mu.Lock()
			stated := ta.stated
			ta.mu.Unlock()
			if !tc.want {
				if w.State != nil || w.StateSource != "" {
					t.Fatalf("a joiner of kind %q got state %v from %q", tc.kind, w.State, w.StateSource)
				}
				if stated != 0 {
					t.Fatalf("the peer's trainer was asked for its state %d times by a joiner of kind %q", stated, tc.kind)
				}
				return
			}
			if w.State == nil {
				t.Fatal("no state in the joiner's Welcome")
			}
			if w.State.Kind != state.Kind || w.State.Step != 6 || !bytes.Equal(w.State.Data, state.Data) {
				t.Fatalf("state %v, want %v", w.State, state)
			}
			if !strings.Contains(w.StateSource, a.node.ID().String()) {
				t.Fatalf("state source %q does not name the peer %s", w.StateSource, a.node.ID())
			}
			if stated != 1 {
				t.Fatalf("the peer's trainer was asked for its state %d times, want 1", stated)
			}
		})
	}
}

// A state request that is not one is refused without asking the trainer,
// and the answer to a good one is bounded by the asker.
func TestStateRequestParsing(t *testing.T) {
	good := appendStateRequest(nil, "k/11", 7, 9)
	for _, tc := range []struct {
		name string
		in   []byte
		kind string
		ok   bool
	}{
		{"good", good, "k/11", true},
		{"another version", append([]byte{1}, good[1:]...), "", false},
		{"empty kind", append([]byte{stateVersion, 0}, make([]byte, 12)...), "", false},
		{"kind too long", append([]byte{stateVersion, 0x81, 0x02}, bytes.Repeat([]byte("k"), 257+12)...), "", false},
		{"no range", good[:len(good)-1], "", false},
		{"nothing", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, off, n, err := readStateRequest(bufio.NewReader(bytes.NewReader(tc.in)))
			if (err == nil) != tc.ok || kind != tc.kind || tc.ok && (off != 7 || n != 9) {
				t.Fatalf("readStateRequest = %q %d %d, %v; want %q, ok %v", kind, off, n, err, tc.kind, tc.ok)
			}
		})
	}
}

// A state larger than a chunk moves in chunks: the joiner's Welcome holds
// the first, the rest follow on its stream in order, and the peer's
// trainer is asked for each range once.
func TestJoinerGetsLargeStateInChunks(t *testing.T) {
	a := startDaemon(t, "bigstate", nil, "asp", nil)
	b := startDaemon(t, "bigstate", a, "asp", nil)
	peersKnow(t, a, b)
	params := fill(20, 0.5)
	ha := hello("m", 9, 20, 0)
	ha.StateKind = "test.State/1"
	ta, err := connect(t, a.addr, ha, func() (int64, []float32) { return 3, params })
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 2*stateChunk+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ta.mu.Lock()
	ta.state = func() *pb.TrainerState { return &pb.TrainerState{Kind: "test.State/1", Step: 3, Data: data} }
	ta.mu.Unlock()
	for s := int64(1); s <= 3; s++ {
		if _, err := ta.step(context.Background(), s, params); err != nil {
			t.Fatal(err)
		}
	}
	hb := hello("m", 9, 20, 0)
	hb.StateKind = "test.State/1"
	tb, err := connect(t, b.addr, hb, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := tb.welcome
	if w.State == nil || w.State.TotalSize != uint64(len(data)) || len(w.State.Data) != stateChunk {
		t.Fatalf("welcome state %d bytes of %d", len(w.State.GetData()), w.State.GetTotalSize())
	}
	got := append([]byte(nil), w.State.Data...)
	waitFor(t, 10*time.Second, "the state's two other chunks", func() bool {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		return len(tb.chunks) == 2
	})
	tb.mu.Lock()
	for _, c := range tb.chunks {
		if c.Failed || c.Offset != uint64(len(got)) {
			t.Fatalf("chunk %+v after %d bytes", c, len(got))
		}
		got = append(got, c.Data...)
	}
	tb.mu.Unlock()
	if !bytes.Equal(got, data) {
		t.Fatal("the state came changed")
	}
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.stated != 3 {
		t.Errorf("the peer's trainer was asked %d times, want 3 (one per chunk)", ta.stated)
	}
}
