package e2e

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/model"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

// Nodes on the in-memory network (memnet) run in a synctest bubble
// (vclock.Test): time there advances only when every goroutine of the
// bubble is blocked, so the tests' timeouts and step times do not depend
// on how busy the machine is.

// memNodes starts n nodes on a fresh in-memory network, each
// bootstrapped from the first, training synthetic linear regression (a
// shard each) with a short synthetic task time (scale), exchanged by
// gossip; edit, if not nil, changes each configuration first. Call it
// inside a bubble; the nodes and the network close when the test ends.
func memNodes(t *testing.T, n int, barrier string, scale float64, edit func(*node.Config)) []*node.Node {
	t.Helper()
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	return memNodesOn(t, mn, n, barrier, scale, edit)
}

// memNodesOn is memNodes on the network mn, which other hosts of the test
// share.
func memNodesOn(t *testing.T, mn *memnet.Net, n int, barrier string, scale float64, edit func(*node.Config)) []*node.Node {
	t.Helper()
	return memNodesWith(t, mn, n, barrier, scale, func(_ int, c *node.Config) []node.Option {
		if edit != nil {
			edit(c)
		}
		return nil
	})
}

// memNodesWith is memNodesOn whose edit also gives node i options of its
// own (after the host and the task).
func memNodesWith(t *testing.T, mn *memnet.Net, n int, barrier string, scale float64, edit func(i int, c *node.Config) []node.Option) []*node.Node {
	t.Helper()
	data, err := model.Open("synthetic:regression")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*node.Node
	var boot []string
	for i := range n {
		task, err := builtin.New(builtin.Spec{Model: "linreg", Shard: i, Shards: n, SGD: model.DefaultSGDConfig(),
			Time: builtin.TimeModel{Scale: scale, Factor: 1}, Seed: uint64(i + 1), InitSeed: 1}, data)
		if err != nil {
			t.Fatal(err)
		}
		cfg := node.DefaultConfig()
		cfg.Job, cfg.Bootstrap, cfg.Barrier = "nodetest", boot, psp.MustParse(barrier)
		cfg.Exchange.Spec = exchange.Spec{} // gossip
		cfg.Check.QueryTimeout, cfg.EvalEvery, cfg.Seed = 500*time.Millisecond, 5, uint64(i+1)
		cfg.WaitPeers, cfg.StartTimeout = n-1, 10*time.Second
		extra := edit(i, &cfg)
		h, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		opts := []node.Option{node.WithHost(h), node.WithTask(task)}
		if cfg.Driven { // a driven node's program steps: it takes the model alone
			opts[1] = node.WithModel(task)
		}
		nd, err := node.New(context.Background(), cfg, append(opts, extra...)...)
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

// runAll runs every node's Run(ctx) in a goroutine. The returned wait
// blocks until every Run has returned and reports their errors on t.
func runAll(t *testing.T, ctx context.Context, nodes []*node.Node) (wait func()) {
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

// runOne runs nd in a goroutine; its Run's result comes on the channel.
func runOne(ctx context.Context, nd *node.Node) <-chan error {
	done := make(chan error, 1)
	go func() { done <- nd.Run(ctx) }()
	return done
}

// minStep is the lowest step among nodes.
func minStep(nodes []*node.Node) int64 {
	lo := int64(1 << 62)
	for _, nd := range nodes {
		lo = min(lo, nd.Step())
	}
	return lo
}

// metric reads one series of a registry: the family name, and a label's
// value if label is not "" (NaN if absent).
func metric(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == value
			}
			if !match {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return math.NaN()
}
