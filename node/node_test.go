package node

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

// Most node tests run in a synctest bubble on the in-memory network
// (memNodes): time there advances only when every goroutine of the bubble
// is blocked, so a test's timeouts and step times do not depend on how
// busy the machine is, and the bubble fails the test if anything the test
// started is still running when it returns.
// memNodes starts n nodes on a fresh in-memory network, each bootstrapped
// from the first, running a synthetic linear-regression task with a short
// synthetic task time (scale). Call it inside a synctest bubble; the nodes
// and the network close when the test ends.
func memNodes(t *testing.T, n int, barrier string, scale float64) []*Node {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	return buildTestNodes(t, n, barrier, scale, memHosts(t, mn))
}

// buildTestNodes starts n nodes with hosts from mk (nil: TCP on 127.0.0.1),
// each bootstrapped from the first, running a synthetic linear-regression
// task with the synthetic task time scale.
func buildTestNodes(t testing.TB, n int, barrier string, scale float64, mk func() host.Host) []*Node {
	t.Helper()
	return buildTestNodesWith(t, n, barrier, scale, mk, nil)
}

// nodeSetup is what buildTestNodesWith's edit may change: a node's
// configuration, and options New takes after the host and the task (so a
// WithTask there, or a WithModel for a driven node, replaces the
// linear-regression task).
type nodeSetup struct {
	Config
	opts []Option
}

// buildTestNodesWith is buildTestNodes with each node's configuration
// passed through edit (if not nil) before the node is built.
func buildTestNodesWith(t testing.TB, n int, barrier string, scale float64, mk func() host.Host, edit func(*nodeSetup)) []*Node {
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
		tr, err := model.NewSGD(m, shard, m.Init(rand.New(rand.NewPCG(1, 1))), model.DefaultSGDConfig())
		if err != nil {
			t.Fatal(err)
		}
		s := nodeSetup{Config: DefaultConfig()}
		cfg := &s.Config
		// Gossip: the tests of this harness check its deltas; those of
		// the epidemic exchange set it in edit.
		cfg.Exchange.Spec = exchange.Spec{}
		cfg.Job = "nodetest"
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
		var opts []Option
		if mk != nil {
			opts = append(opts, WithHost(mk()))
		}
		cfg.Bootstrap = boot
		cfg.Barrier = psp.MustParse(barrier)
		cfg.Check.QueryTimeout = 500 * time.Millisecond
		task := builtin.NewModelTask(tr, data.Test, builtin.TimeModel{Scale: scale, Factor: 1}, uint64(i+1))
		cfg.EvalEvery = 5
		cfg.WaitPeers = n - 1
		cfg.StartTimeout = 10 * time.Second
		cfg.Seed = uint64(i + 1)
		if edit != nil {
			edit(&s)
		}
		if s.Config.Driven { // a driven node's program steps: it takes the model alone
			opts = append(opts, WithModel(task))
		} else {
			opts = append(opts, WithTask(task))
		}
		nd, err := New(context.Background(), s.Config, append(opts, s.opts...)...)
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

// runAll runs every node's Run(ctx) in a goroutine. The returned wait
// blocks until every Run has returned and reports their errors on t (the
// test goroutine's, so a failing node fails the test, not the binary);
// calls after the first return at once.
func runAll(t *testing.T, ctx context.Context, nodes []*Node) (wait func()) {
	errs := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Go(func() {
			if err := nd.Run(ctx); err != nil {
				errs <- fmt.Errorf("node %s: %w", nd.ID(), err)
			}
		})
	}
	return sync.OnceFunc(func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// waitFor polls cond every 20 ms until it holds or within passes (on the
// bubble's clock inside a bubble); it reports whether cond held.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// minStep is the lowest step among nodes.
func minStep(nodes []*Node) int64 {
	lo := int64(1 << 62)
	for _, nd := range nodes {
		lo = min(lo, nd.Step())
	}
	return lo
}

// A peer that accepts a step query and never answers must not hold the
// asker past its query timeout, even on a transport without deadlines
// (mocknet's SetDeadline does nothing).
func TestQueryTimeoutWithSilentPeer(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 2, "asp", 0.001, memHosts(t, mn), func(c *nodeSetup) { c.Check.QueryTimeout = 200 * time.Millisecond })
		a, b := nodes[0], nodes[1]
		// b reads step queries (either version) and never answers.
		silent := func(s network.Stream) {
			_, _ = io.Copy(io.Discard, s) // until the asker gives up and resets it
			_ = s.Reset()
		}
		b.Host().SetStreamHandler(wire.StepProtocol(b.cfg.Job), silent)
		b.Host().SetStreamHandler(b.stepExtID, silent)
		start := time.Now()
		_, err := a.queryStep(t.Context(), b.ID(), wire.StepRequest{})
		if err == nil {
			t.Fatal("a silent peer's query succeeded")
		}
		if d := time.Since(start); d != a.cfg.Check.QueryTimeout {
			t.Errorf("query took %v with a %v timeout", d, a.cfg.Check.QueryTimeout)
		}
	})
}

// Real hosts: New builds a libp2p host listening on TCP (with the
// connection and resource managers), the second node joins through the
// first, and each answers the other's step queries. Real sockets cannot
// live in a bubble, so this test runs on real time and waits on conditions.
func TestTCPNodesAnswerEachOther(t *testing.T) {
	nodes := buildTestNodes(t, 2, "asp", 0, nil)
	a, b := nodes[0], nodes[1]
	b.step.Store(7)
	for _, nd := range nodes {
		addrs := nd.Status().Addrs
		if len(addrs) == 0 || !strings.HasPrefix(addrs[0], "/ip4/127.0.0.1/tcp/") {
			t.Errorf("node %s listens on %v, want 127.0.0.1 TCP", nd.ID(), addrs)
		}
	}
	var r wire.StepReply
	var err error
	answered := waitFor(30*time.Second, func() bool {
		r, err = a.queryStep(t.Context(), b.ID(), wire.StepRequest{Step: 1})
		return err == nil
	})
	if !answered {
		t.Fatalf("no answer to a step query over TCP: %v", err)
	}
	if r.Step != 7 {
		t.Errorf("b answered step %d, want 7", r.Step)
	}
	if _, err := b.queryStep(t.Context(), a.ID(), wire.StepRequest{Step: 7}); err != nil {
		t.Errorf("a did not answer b: %v", err)
	}
	// A host the node built counts its streams' bytes too.
	if !waitFor(5*time.Second, func() bool { return b.Traffic().Class("step").InBytes > 0 && a.Traffic().Class("step").OutBytes > 0 }) {
		t.Errorf("step traffic not counted: a %+v, b %+v", a.Traffic().ByProtocol, b.Traffic().ByProtocol)
	}
}
