package trainer

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"

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
	for _, tc := range []struct {
		name string
		in   []byte
		kind string
		ok   bool
	}{
		{"good", append([]byte{stateVersion, 4}, "k/11"...), "k/11", true},
		{"another version", append([]byte{2, 4}, "k/11"...), "", false},
		{"empty kind", []byte{stateVersion, 0}, "", false},
		{"kind too long", append([]byte{stateVersion, 0x81, 0x02}, bytes.Repeat([]byte("k"), 257)...), "", false},
		{"short", append([]byte{stateVersion, 9}, "k/1"...), "", false},
		{"nothing", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, err := readStateRequest(bufio.NewReader(bytes.NewReader(tc.in)))
			if (err == nil) != tc.ok || kind != tc.kind {
				t.Fatalf("readStateRequest = %q, %v; want %q, ok %v", kind, err, tc.kind, tc.ok)
			}
		})
	}
}
