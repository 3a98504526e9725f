package node

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/status"
)

// lineageOf is the lineage each node is on.
func lineagesOf(nodes []*Node) map[lineage.Genesis]int {
	out := map[lineage.Genesis]int{}
	for _, nd := range nodes {
		out[nd.kin.lin.Own()]++
	}
	return out
}

// resetsOf sums the nodes' resets (psp_resets_total, every reason).
func resetsOf(nodes []*Node) float64 {
	var sum float64
	for _, nd := range nodes {
		for _, r := range status.ResetReasons {
			sum += status.CounterValue(nd.m.Resets.WithLabelValues(r))
		}
	}
	return sum
}

// A job of three that has trained together for 20 s meets twice as many
// nodes that claim the oldest lineage there can be (a genesis of the Unix
// epoch), and have trained together as long: none of the job's nodes
// leaves its lineage or resets. (Before, the lineage more of a sample was
// on took every node of the job at the first look, the older breaking a
// tie: so did three against three.)
func TestEstablishedJobKeepsItsLineage(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		var epoch lineage.Genesis
		epoch[len(epoch)-1] = 1
		job := buildTestNodes(t, 3, "pssp:2:1", 0.1, memHosts(t, mn))
		others := buildTestNodesWith(t, 6, "pssp:2:1", 0.1, memHosts(t, mn), func(c *nodeSetup) { c.Genesis = epoch })
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, append(append([]*Node(nil), job...), others...))
		defer func() { cancel(); wait() }()
		time.Sleep(20 * time.Second)
		g := job[0].kin.lin.Own()
		if l := lineagesOf(job); len(l) != 1 || g.IsZero() || g == epoch {
			t.Fatalf("the job's nodes are not on one lineage of their own: %v", l)
		}
		for _, nd := range job {
			for _, o := range others {
				if err := nd.Host().Connect(ctx, peer.AddrInfo{ID: o.ID(), Addrs: o.Host().Addrs()}); err != nil {
					t.Fatal(err)
				}
			}
		}
		at := minStep(job)
		time.Sleep(30 * time.Second)
		if l := lineagesOf(job); l[g] != len(job) {
			t.Errorf("30 s after meeting six nodes of another lineage, the job's three are on %v", l)
		}
		if r := resetsOf(job); r > 0 {
			t.Errorf("the job's nodes reset %v times", r)
		}
		if heard := status.CounterValue(job[0].kin.lin.Converged); heard > 0 {
			t.Errorf("a node of the job joined another lineage %v times", heard)
		}
		if minStep(job) < at+50 {
			t.Errorf("the job went from step %d to %d in 30 s", at, minStep(job))
		}
	})
}

// Nodes that start a job at the same moment may each find no peer with a
// lineage and start one of their own; they settle on one within seconds.
// (Here each is given a lineage of its own from the start.)
func TestSimultaneousLaunchConverges(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 6, "pssp:2:1", 0.01, memHosts(t, mn), func(c *nodeSetup) { c.Genesis = lineage.NewGenesis(time.Now()) })
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		defer func() { cancel(); wait() }()
		start := time.Now()
		one := func() bool {
			l := lineagesOf(nodes)
			_, none := l[lineage.Genesis{}]
			return len(l) == 1 && !none
		}
		if !waitFor(10*time.Second, one) {
			t.Fatalf("10 s after a launch of six, their lineages: %v", lineagesOf(nodes))
		}
		t.Logf("one lineage %v after the launch, %v resets", time.Since(start), resetsOf(nodes))
	})
}

// Resets are held to resetBurst, then one per resetEvery, and each one
// refused is counted; the refusals are said at most once per
// resetLogEvery.
func TestResetGate(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		var g resetGate
		now := time.Now()
		for i := range resetBurst {
			if !g.allows(now) {
				t.Fatalf("reset %d of a burst of %d refused", i+1, resetBurst)
			}
			g.take(now)
		}
		if g.allows(now) || g.allows(now.Add(resetEvery/2)) {
			t.Error("a reset beyond the burst allowed before resetEvery")
		}
		if !g.allows(now.Add(resetEvery)) {
			t.Error("no reset allowed resetEvery after a burst")
		}
		g.take(now.Add(resetEvery))
		if g.allows(now.Add(resetEvery)) {
			t.Error("two resets allowed resetEvery after a burst")
		}
		said := 0
		for i := range 100 {
			if say, _ := g.refuse(now.Add(time.Duration(i) * 100 * time.Millisecond)); say {
				said++
			}
		}
		if said != 1 || g.refused != 100 {
			t.Errorf("100 refusals in 10 s said %d times (want 1), counted %d", said, g.refused)
		}
		if say, count := g.refuse(now.Add(resetLogEvery)); !say || count != 100 {
			t.Errorf("the refusal after resetLogEvery: said %v, covering %d (want 100)", say, count)
		}
	})
}
