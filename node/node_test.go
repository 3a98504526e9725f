package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/internal/memnet"

	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/psp"
)

// testNodes starts n nodes on 127.0.0.1, each bootstrapped from the first,
// running a synthetic linear-regression task with a short synthetic task
// time.
func testNodes(t *testing.T, n int, barrier string, scale float64) []*Node {
	t.Helper()
	return buildTestNodes(t, n, barrier, scale, nil)
}

// buildTestNodes is testNodes with hosts from mk (nil: TCP on 127.0.0.1).
func buildTestNodes(t testing.TB, n int, barrier string, scale float64, mk func() host.Host) []*Node {
	t.Helper()
	data, err := model.Open("synthetic:regression")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*Node
	var boot []string
	for i := range n {
		m, err := model.New("linreg", data.Train.Dim, 0)
		if err != nil {
			t.Fatal(err)
		}
		shard, err := model.ShardOf(data.Train, i, n)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := model.NewTrainer(m, shard, m.Init(rand.New(rand.NewPCG(1, 1))), model.DefaultSGDConfig())
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Job = "nodetest"
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		if mk != nil {
			cfg.Host = mk()
		}
		cfg.Bootstrap = boot
		cfg.Barrier = psp.MustParse(barrier)
		cfg.QueryTimeout = 500 * time.Millisecond
		cfg.Task = NewModelTask(tr, data.Test, TimeModel{Scale: scale, Factor: 1}, uint64(i+1))
		cfg.EvalEvery = 5
		cfg.WaitPeers = n - 1
		cfg.StartTimeout = 10 * time.Second
		nd, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		nodes = append(nodes, nd)
		if i == 0 {
			boot = []string{nd.Addrs()[0].String()}
		}
	}
	return nodes
}

func runAll(ctx context.Context, nodes []*Node) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Go(func() {
			if err := nd.Run(ctx); err != nil {
				panic(fmt.Sprintf("node %s: %v", nd.ID(), err))
			}
		})
	}
	return &wg
}

func TestNodesTrainAndRespectBarrier(t *testing.T) {
	nodes := testNodes(t, 4, "pssp:2:1", 0.01)
	ctx, cancel := context.WithCancel(context.Background())
	wg := runAll(ctx, nodes)
	defer func() { cancel(); wg.Wait() }()

	deadline := time.Now().Add(20 * time.Second)
	maxSpread := int64(0)
	for time.Now().Before(deadline) {
		lo, hi := int64(1<<62), int64(0)
		for _, nd := range nodes {
			s := nd.Step()
			lo, hi = min(lo, s), max(hi, s)
		}
		maxSpread = max(maxSpread, hi-lo)
		if lo >= 40 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, nd := range nodes {
		st := nd.Status()
		if st.Step < 40 {
			t.Errorf("node %s reached only step %d", st.PeerID, st.Step)
		}
		if st.UpdatesReceived == 0 {
			t.Errorf("node %s received no updates", st.PeerID)
		}
		// Each node dialled or was dialled by its 3 peers at least once.
		if st.ConnectedPeers < 1 || st.ConnectionsOpened < 3 {
			t.Errorf("node %s: %d connected, %d opened", st.PeerID, st.ConnectedPeers, st.ConnectionsOpened)
		}
	}
	// pSSP(β=2, s=1) with β = 2 of 3 others: a node passes only if both
	// sampled peers are within 1 step, so the spread stays small. The
	// sample-level bound is not global, but with 4 nodes a spread beyond
	// s+3 would mean the barrier is not being applied.
	if maxSpread > 4 {
		t.Errorf("step spread reached %d under pssp:2:1", maxSpread)
	}
	for _, nd := range nodes {
		if st := nd.Status(); st.Loss == nil {
			t.Errorf("node %s never evaluated", st.PeerID)
		}
	}
	// The gauges read at scrape time: three peers, in the routing table,
	// and an estimate of about four nodes.
	for _, nd := range nodes {
		got := map[string]float64{}
		mfs, err := nd.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
				got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if got["psp_connected_peers"] < 1 || got["psp_routing_table_size"] < 1 ||
			!(got["psp_population_estimate"] >= 2 && got["psp_population_estimate"] <= 8) {
			t.Errorf("node %s: gauges %v", nd.ID(), got)
		}
	}
	// Sampler pools (64) hold every other node of four, and each node
	// reports how many pools hold it.
	deadline = time.Now().Add(5 * time.Second)
	for _, nd := range nodes {
		for nd.Status().PoolInDegree != len(nodes)-1 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if st := nd.Status(); st.PoolInDegree != len(nodes)-1 || st.PoolRefused != 0 {
			t.Errorf("node %s: pool in-degree %d (want %d), %d pool requests refused", st.PeerID, st.PoolInDegree, len(nodes)-1, st.PoolRefused)
		}
	}
}

func TestCrashDoesNotStallOthers(t *testing.T) {
	nodes := testNodes(t, 4, "pssp:3:1", 0.01)
	ctx, cancel := context.WithCancel(context.Background())
	victimCtx, kill := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, nd := range nodes {
		c := ctx
		if i == 3 {
			c = victimCtx
		}
		wg.Go(func() { _ = nd.Run(c) })
	}
	defer func() { cancel(); wg.Wait() }()
	waitStep := func(nodes []*Node, step int64, within time.Duration) bool {
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			ok := true
			for _, nd := range nodes {
				ok = ok && nd.Step() >= step
			}
			if ok {
				return true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	}
	if !waitStep(nodes, 10, 20*time.Second) {
		t.Fatal("nodes did not start training")
	}
	// Crash: stop the loop and close the host without any leave note.
	kill()
	_ = nodes[3].Host().Close()
	crashed := nodes[3].Step()
	survivors := nodes[:3]
	if !waitStep(survivors, crashed+20, 20*time.Second) {
		for _, nd := range survivors {
			t.Logf("%s at %d (waiting %v)", nd.ID(), nd.Step(), nd.Waiting())
		}
		t.Fatalf("survivors stalled after a crash at step %d", crashed)
	}
}

// A peer that accepts a step query and never answers must not hold the
// asker past its query timeout, even on a transport without deadlines
// (mocknet's SetDeadline does nothing).
func TestQueryTimeoutWithSilentPeer(t *testing.T) {
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	nodes := buildTestNodes(t, 2, "asp", 0.001, memHosts(t, mn))
	a, b := nodes[0], nodes[1]
	// b swallows step queries.
	b.Host().SetStreamHandler(b.stepID, func(s network.Stream) {
		time.Sleep(5 * time.Second)
		_ = s.Reset()
	})
	a.cfg.QueryTimeout = 200 * time.Millisecond
	start := time.Now()
	_, err := a.queryStep(context.Background(), b.ID(), StepRequest{})
	if err == nil {
		t.Fatal("a silent peer's query succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("query took %v with a 200 ms timeout", d)
	}
}

// memHosts returns a host factory for buildTestNodes on an in-memory network.
func memHosts(t testing.TB, mn *memnet.Net) func() host.Host {
	return func() host.Host {
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
}
