package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/psp"
)

// vecModel is a model of its parameters alone.
type vecModel struct {
	mu sync.Mutex
	p  []float64
}

func (m *vecModel) NumParams() int               { return len(m.p) }
func (m *vecModel) ModelID() uint32              { return 5 }
func (m *vecModel) Apply([]float32, int64) error { return nil }
func (m *vecModel) Params() []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.p)
}
func (m *vecModel) SetParams(p []float64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.p, p)
	return nil
}

// servedModel serves value(i) at every index, and records the blocks it
// served whole; with stallAt >= 0 it gives nothing from that block on.
type servedModel struct {
	shape   wire.ModelShape
	stallAt int
	mul     float32 // serves value(i) × mul (0: × 1)
	// gate, if set, holds every block until it is closed; asked, if set,
	// is called once, when the model is first asked for.
	gate      <-chan struct{}
	asked     func()
	askedOnce sync.Once
	mu        sync.Mutex
	served    []int
}

func value(i int) float32 { return float32(i%1013) - 500 }

func (m *servedModel) ModelHead() (psp.Step, wire.ModelShape, bool) { return 9, m.shape, true }
func (m *servedModel) ReadModel(ctx context.Context, lo, hi int, dst []float32) error {
	b := lo / wire.ExchangeBlock
	if m.asked != nil {
		m.askedOnce.Do(m.asked)
	}
	if m.gate != nil {
		select {
		case <-m.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if m.stallAt >= 0 && b >= m.stallAt {
		<-ctx.Done() // a peer that stalls: the joiner's deadline ends it
		return ctx.Err()
	}
	mul := m.mul
	if mul == 0 {
		mul = 1
	}
	for i := range dst {
		dst[i] = value(lo+i) * mul
	}
	m.mu.Lock()
	m.served = append(m.served, b)
	m.mu.Unlock()
	return nil
}

// A joiner fetches a model of several blocks from several peers at once;
// a peer that stalls in the middle of its range is left after a block's
// deadline, and the rest of its range comes from another peer, from the
// block it stopped at (no block is fetched twice); a peer of another model
// is held out and does not count as a failure.
func TestFetchModelFromSeveralPeers(t *testing.T) {
	saved := [2]int{fetchPeers, fetchRange}
	t.Cleanup(func() { fetchPeers, fetchRange = saved[0], saved[1] })
	fetchPeers, fetchRange = 3, 2
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		n := 5*wire.ExchangeBlock + 7 // six blocks: three ranges
		shape := wire.ModelShape{ID: 5, N: n}
		mk := memHosts(t, mn)
		serve := func(m *servedModel) host.Host {
			h := mk()
			t.Cleanup(func() { _ = h.Close() })
			sv := &wire.ModelServer{Life: t.Context(), Timeout: time.Hour, Source: m, Log: slog.New(slog.DiscardHandler)}
			h.SetStreamHandler(wire.ModelProtocol("fetchtest"), sv.Serve)
			return h
		}
		// a and b serve once each of the three peers of the model has a
		// range: the ranges are shared however the workers are scheduled
		// (a quick peer could otherwise take them all before another
		// asks).
		gate := make(chan struct{})
		var askedMu sync.Mutex
		toAsk := 3
		asked := func() {
			askedMu.Lock()
			defer askedMu.Unlock()
			if toAsk--; toAsk == 0 {
				close(gate)
			}
		}
		stall := &servedModel{shape: shape, stallAt: 1, asked: asked}
		other := &servedModel{shape: wire.ModelShape{ID: 6, N: n}, stallAt: -1}
		a := &servedModel{shape: shape, stallAt: -1, gate: gate, asked: asked}
		b := &servedModel{shape: shape, stallAt: -1, gate: gate, asked: asked}
		hosts := []host.Host{serve(stall), serve(other), serve(a), serve(b)}
		cfg := DefaultConfig()
		cfg.Job, cfg.Listen = "fetchtest", []string{"/ip4/127.0.0.1/tcp/0"}
		cfg.Check.QueryTimeout = time.Second // a block's deadline is 10 × that: the fetch lasts past a progress line
		c, err := New(context.Background(), cfg, WithHost(mk()), WithTask(&vecTask{vecModel{p: make([]float64, n)}}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		var peers []peer.ID
		for _, h := range hosts {
			if err := c.h.Connect(t.Context(), peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}); err != nil {
				t.Fatal(err)
			}
			peers = append(peers, h.ID())
		}
		dst := make([]float32, n)
		var lines []string
		ctx := withFetchProgress(t.Context(), func(l string) { lines = append(lines, l) })
		f, mms, err := c.mp.fetch(ctx, peers, dst)
		if err != nil {
			t.Fatal(err)
		}
		for i, x := range dst {
			if x != value(i) {
				t.Fatalf("value %d is %v, want %v", i, x, value(i))
			}
		}
		if len(mms) != 1 || mms[0].PeerModel != 6 {
			t.Errorf("mismatches %v, want the peer of model 6", mms)
		}
		if f.step != 9 || f.peers < 2 {
			t.Errorf("fetched %+v: want step 9 from at least two peers", f)
		}
		if len(lines) == 0 || !strings.Contains(lines[0], "fetching the job's model") {
			t.Errorf("progress %q: want a line every %v of a long fetch", lines, fetchProgressEvery)
		}
		var all []int
		for _, m := range []*servedModel{stall, a, b} {
			all = append(all, m.served...)
		}
		slices.Sort(all)
		if !slices.Equal(all, []int{0, 1, 2, 3, 4, 5}) {
			t.Errorf("blocks served %v: want each of the six once (the stalled range resumed where it stopped)", all)
		}
		// Every peer failing: the error says how much is missing.
		_, _, err = c.mp.fetch(t.Context(), peers[:1], make([]float32, n))
		if err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("a fetch from a stalling peer alone: %v", err)
		}
	})
}

// vecTask is vecModel as a task that does no work.
type vecTask struct{ vecModel }

func (*vecTask) Step(ctx context.Context) ([]float64, error) { return nil, ctx.Err() }
func (*vecTask) Done() bool                                  { return false }

// A peer that asks for the model again and again is sent at most
// wire.ModelPeerBudget models a minute: the model protocol's 9-byte
// request cannot make a node send without end. Another peer is still
// served.
func TestModelServedWithinBudget(t *testing.T) {
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	n := 2*wire.ExchangeBlock + 5
	shape := wire.ModelShape{ID: 5, N: n}
	mk := memHosts(t, mn)
	server, asker, other := mk(), mk(), mk()
	for _, h := range []host.Host{server, asker, other} {
		t.Cleanup(func() { _ = h.Close() })
	}
	over := prometheus.NewCounter(prometheus.CounterOpts{Name: "over"})
	sv := &wire.ModelServer{Life: t.Context(), Timeout: time.Minute, Source: &servedModel{shape: shape, stallAt: -1},
		Budget: wire.NewModelBudget(), Over: over, Log: slog.New(slog.DiscardHandler)}
	server.SetStreamHandler(wire.ModelProtocol("budgettest"), sv.Serve)
	dst := make([]float32, n)
	fetch := func(h host.Host) error {
		if err := h.Connect(t.Context(), peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}); err != nil {
			t.Fatal(err)
		}
		_, _, err := wire.FetchBlocks(t.Context(), h, server.ID(), "budgettest", shape, 0, wire.Blocks(n), dst, 1e9, time.Minute)
		return err
	}
	served := 0
	for range 2 * wire.ModelPeerBudget {
		if fetch(asker) != nil {
			break
		}
		served++
	}
	if served != wire.ModelPeerBudget || testutil.ToFloat64(over) != 1 {
		t.Errorf("one peer was sent %d whole models before a refusal (%v counted), want %d", served, testutil.ToFloat64(over), wire.ModelPeerBudget)
	}
	if err := fetch(other); err != nil {
		t.Errorf("another peer is refused too: %v", err)
	}
}
