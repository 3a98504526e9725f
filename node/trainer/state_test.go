package trainer

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
		name      string
		exchange  string
		kind      string // the joiner's
		stateStep int64  // the peer's state's (the job is at step 6)
		want      bool
		stated    int // times the peer's trainer is asked
	}{
		{"gossip", "gossip", "test.State/1", 6, true, 1},
		{"epidemic", "epidemic:1", "test.State/1", 6, true, 1},
		{"another kind", "gossip", "test.Other/1", 6, false, 0},
		{"no kind", "gossip", "", 6, false, 0},
		// A state far from the job's step is refused (a peer serving
		// its outer state of step 1 while the job was at 37 killed a
		// joiner at its first outer step).
		{"far behind the job", "gossip", "test.State/1", 6 - stateStepSlack - 1, false, 1},
		{"far ahead of the job", "gossip", "test.State/1", 6 + stateStepSlack + 1, false, 1},
		{"within the slack", "gossip", "test.State/1", 6 + stateStepSlack, true, 1},
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
			state := &pb.TrainerState{Kind: "test.State/1", Step: tc.stateStep, Data: []byte("outer parameters and momentum")}
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
				if stated != tc.stated {
					t.Fatalf("the peer's trainer was asked for its state %d times by a joiner of kind %q, want %d", stated, tc.kind, tc.stated)
				}
				return
			}
			if w.State == nil {
				t.Fatal("no state in the joiner's Welcome")
			}
			if w.State.Kind != state.Kind || w.State.Step != tc.stateStep || !bytes.Equal(w.State.Data, state.Data) {
				t.Fatalf("state %v, want %v", w.State, state)
			}
			if !strings.Contains(w.StateSource, a.node.ID().String()) {
				t.Fatalf("state source %q does not name the peer %s", w.StateSource, a.node.ID())
			}
			if stated != tc.stated {
				t.Fatalf("the peer's trainer was asked for its state %d times, want %d", stated, tc.stated)
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

// A daemon serves its trainer's state only to peers of the job, and
// within a byte budget per peer per minute: a member that asks again and
// again gets statePeerBudget states' worth (here a small state: one
// request per stateMinCharge), the rest are refused without asking the
// trainer, and a host that never took part in the job gets nothing.
func TestStateServedWithinLimits(t *testing.T) {
	a := startDaemon(t, "statelimits", nil, "asp", nil)
	b := startDaemon(t, "statelimits", a, "asp", nil)
	peersKnow(t, a, b)
	params := fill(20, 0.5)
	ha := hello("m", 9, 20, 0)
	ha.StateKind = "test.State/1"
	ta, err := connect(t, a.addr, ha, func() (int64, []float32) { return 1, params })
	if err != nil {
		t.Fatal(err)
	}
	ta.mu.Lock()
	ta.state = func() *pb.TrainerState {
		return &pb.TrainerState{Kind: "test.State/1", Step: 1, Data: []byte("small state")}
	}
	ta.mu.Unlock()
	if _, err := ta.step(context.Background(), 1, params); err != nil {
		t.Fatal(err)
	}
	stated := func() int {
		ta.mu.Lock()
		defer ta.mu.Unlock()
		return ta.stated
	}

	// A host that is not one of the job's peers.
	stranger, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stranger.Connect(ctx, peer.AddrInfo{ID: a.node.ID(), Addrs: a.node.Addrs()}); err != nil {
		t.Fatal(err)
	}
	if ok := askRaw(ctx, stranger, a.node.ID(), a.srv.stateProto); ok {
		t.Fatal("a host that is not of the job got the trainer's state")
	}
	if n := stated(); n != 0 {
		t.Fatalf("the trainer was asked %d times for a stranger", n)
	}

	want := int(statePeerBudget * stateChunk / stateMinCharge)
	ok := 0
	busy := func() float64 { return testutil.ToFloat64(a.srv.stm.served.WithLabelValues("busy")) }
	for i := 0; i < want+8; i++ {
		was := busy()
		if _, err := b.srv.askState(ctx, a.node.ID(), "test.State/1", 0, stateChunk); err == nil {
			ok++
		} else if busy() > was {
			// The last request's handler had not let go of its slot
			// (one stream per peer): ask again.
			i--
		}
	}
	if ok != want {
		t.Errorf("a peer got %d answers in a minute, want its budget's %d", ok, want)
	}
	if n := stated(); n != want {
		t.Errorf("the trainer was asked %d times, want %d (requests beyond the budget are refused before)", n, want)
	}
	if got := testutil.ToFloat64(a.srv.stm.served.WithLabelValues("budget")); got != 8 {
		t.Errorf("%v refusals for the budget counted, want 8", got)
	}
	if got := testutil.ToFloat64(a.srv.stm.served.WithLabelValues("stranger")); got != 1 {
		t.Errorf("%v refusals of strangers counted, want 1", got)
	}
}

// askRaw asks p for a state over proto from h and reports whether it
// answered.
func askRaw(ctx context.Context, h host.Host, p peer.ID, proto protocol.ID) bool {
	st, err := h.NewStream(ctx, p, proto)
	if err != nil {
		return false
	}
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := st.Write(appendStateRequest(nil, "test.State/1", 0, 1024)); err != nil {
		return false
	}
	_ = st.CloseWrite()
	b, _ := io.ReadAll(st)
	return len(b) > 0
}

// The budget counts per peer and in all, by the minute.
func TestStateLimitsBudget(t *testing.T) {
	l := newStateLimits()
	now := time.Unix(1000, 0)
	p, q := peer.ID("p"), peer.ID("q")
	l.sized(10 << 20) // a state of 10 MiB: a peer may take 20 MiB a minute, all 80
	if !l.take(p, 20<<20, now) || l.take(p, 1, now) {
		t.Fatal("a peer's budget is not twice the state")
	}
	l.settle(p, 2<<20, 1<<20) // took 2 MiB, sent 1
	if !l.take(p, 1<<20, now) || l.take(p, 1, now) {
		t.Fatal("what a request did not send was not given back")
	}
	l.settle(q, 0, 79<<20) // sent beyond what it took: counts in all
	if l.take(q, 1<<20+1, now) {
		t.Fatal("bytes sent beyond the charge were not counted")
	}
	l.settle(q, 79<<20, 0)
	for i := range 3 {
		if !l.take(peer.ID(rune('a'+i)), 20<<20, now) {
			t.Fatalf("peer %d refused within the total", i)
		}
	}
	if l.take(q, 1, now) {
		t.Fatal("the total budget was exceeded")
	}
	if !l.take(q, 20<<20, now.Add(time.Minute)) {
		t.Fatal("the budget did not renew after a minute")
	}
}

// A joiner prefers a state two peers agree on: beside two honest peers
// whose states have the same size, a peer serving another state (of the
// same step, as a liar that read the job's would) is not taken, whichever
// of the three the joiner asks first.
func TestJoinerPrefersAgreedState(t *testing.T) {
	a := startDaemon(t, "agree", nil, "asp", nil)
	c := startDaemon(t, "agree", a, "asp", nil)
	d := startDaemon(t, "agree", a, "asp", nil)
	b := startDaemon(t, "agree", a, "asp", nil)
	peersKnow(t, a, b, c, d)
	params := fill(20, 0.5)
	honest := []byte("outer parameters and momentum")
	lie := []byte("outer parameters of -3e38, and momentum of as much")
	for _, x := range []struct {
		d    *daemon
		data []byte
	}{{a, honest}, {c, honest}, {d, lie}} {
		h := hello("m", 9, 20, 0)
		h.StateKind = "test.State/1"
		tr, err := connect(t, x.d.addr, h, func() (int64, []float32) { return 4, params })
		if err != nil {
			t.Fatal(err)
		}
		data := x.data
		tr.mu.Lock()
		tr.state = func() *pb.TrainerState { return &pb.TrainerState{Kind: "test.State/1", Step: 4, Data: data} }
		tr.mu.Unlock()
		for s := tr.welcome.Step + 1; s <= 4; s++ {
			if _, err := tr.step(context.Background(), s, params); err != nil {
				t.Fatal(err)
			}
		}
	}
	hb := hello("m", 9, 20, 0)
	hb.StateKind = "test.State/1"
	tb, err := connect(t, b.addr, hb, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := tb.welcome
	if w.State == nil || !bytes.Equal(w.State.Data, honest) {
		t.Fatalf("the joiner took state %q from %s, want the two honest peers' %q", w.State.GetData(), w.StateSource, honest)
	}
	if !strings.Contains(w.StateSource, "agree") {
		t.Errorf("state source %q does not say peers agreed", w.StateSource)
	}
}
