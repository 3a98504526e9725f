package psp_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/pspnode/pspnode/psp"
)

func ExampleParse() {
	sp, err := psp.Parse("pssp:10:4")
	if err != nil {
		panic(err)
	}
	fmt.Println(sp.Kind, sp.Beta, sp.Staleness, sp)
	fmt.Println(sp.SampleSize(200), sp.SampleSize(3))

	_, err = psp.Parse("PSSP:10:4")
	fmt.Println(err != nil)
	_, err = psp.Parse("dssp:5:3")
	fmt.Println(err != nil)
	// Output:
	// pssp 10 4 pssp:10:4
	// 10 3
	// true
	// true
}

func ExampleParse_error() {
	_, err := psp.Parse("ssp:04")
	fmt.Println(err)
	// Output:
	// invalid barrier spec "ssp:04": parameter S: "04" has a leading zero (grammar: asp | bsp | ssp:S | pbsp:B | pssp:B:S | dssp:SL:SU | pdssp:B:SL:SU (B = sample size β, or auto: a third of the other nodes, 1 to 10; S = staleness, SL..SU = DSSP staleness range))
}

// A node at step 10 checks a pSSP(3, 2) barrier: it samples three of the
// other nodes and may go on iff none of them is below step 8. Only node 4
// (step 7) is; a node that must wait asks again with a fresh sample.
func ExampleNewDecider() {
	steps := []psp.Step{10, 9, 12, 8, 7, 11, 10, 9} // node 0 is "us"
	sp := psp.MustParse("pssp:3:2")
	d := psp.NewDecider(sp)
	rng := rand.New(rand.NewPCG(1, 2))

	for try := range 3 {
		sample := psp.SampleOthers(rng, len(steps), 0, sp.SampleSize(len(steps)-1), nil)
		var obs []psp.Observation
		for _, j := range sample {
			obs = append(obs, psp.Observation{Peer: fmt.Sprint("node", j), Step: steps[j]})
		}
		dec := d.Decide(steps[0], 0, obs)
		fmt.Printf("try %d: sample %v pass=%v lagging=%d\n", try, sample, dec.Pass, dec.Lagging)
	}
	// Output:
	// try 0: sample [4 6 7] pass=false lagging=1
	// try 1: sample [4 2 1] pass=false lagging=1
	// try 2: sample [3 6 1] pass=true lagging=0
}

// The chapter's bound for F(r) = 0.5, β = 1, r = 4, T = 10000.
func ExampleBound() {
	b, err := psp.Bound(0.5, 1, 4, 10000)
	if err != nil {
		panic(err)
	}
	fmt.Printf("a=%.2f S=%.4f mean<=%.4f variance<%.4f\n", b.A, b.S, b.Mean, b.Variance)
	// Output:
	// a=0.50 S=0.6667 mean<=14.6667 variance<73.3333
}

// A Checker does no I/O: the caller feeds it events, does what Ready
// says (draw peers, ask them, call Tick at the wake time) and keeps the
// time. Here the peers answer at once from a table, as in the simulator.
func ExampleChecker() {
	steps := map[string]psp.Step{"a": 7, "b": 4, "c": 9, "d": 8}
	timing := psp.TimingConfig{PollShare: 1.0 / 64, GlobalPollShare: 0.25, PollMin: 1e-4, PollMax: 0.5, QueryTimeoutMin: 0.05, QueryTimeout: 1}
	c := psp.NewChecker(psp.CheckConfig{Spec: psp.MustParse("pbsp:2"), Replacements: 2, Timing: timing}, nil)
	draws := [][]string{{"a", "b"}, {"c", "d"}} // what the sampler draws, check by check
	now := 0.0
	c.Start(psp.CheckStart{Self: 7, Population: 4, Compute: 0.2, RTT: 0.001, Now: now})
	var asks []string // queries in flight
	for {
		rd := c.Ready()
		if rd.Pass {
			break
		}
		asks = append(asks, rd.Ask...)
		if rd.Done {
			fmt.Printf("%.4f s: wait (%d lagging); next check at %.4f s\n", now, rd.Decision.Lagging, rd.Wake)
			asks = asks[:0] // the answers still to come are no longer wanted
		}
		switch {
		case rd.Draw > 0:
			c.Drawn(draws[0], false, now)
			draws = draws[1:]
		case len(asks) > 0:
			p := asks[0]
			asks = asks[1:]
			c.Answer(p, psp.Observation{Peer: p, Step: steps[p]}, true, now)
		default:
			now = rd.Wake
			c.Tick(now)
		}
	}
	fmt.Printf("%.4f s: pass\n", now)
	// Output:
	// 0.0000 s: wait (1 lagging); next check at 0.0125 s
	// 0.0125 s: pass
}

// A node computes a step in 0.1 s. It has seen peer "old" reach a step
// every 0.4 s and peer "new" every 0.1 s. At its check (staleness 4, its
// step 40: threshold 36), "old" is at step 10, far below: its lag is its
// speed, and the node does not wait for it. "new" at step 35 is one step
// behind at the node's own pace: it holds the node, as under plain pSSP.
func ExamplePace() {
	p := psp.NewPace(psp.DefaultPaceConfig())
	p.SetCompute(0.1, 0)
	for s := range psp.Step(11) {
		p.Observe("old", s, 0.4*float64(s))
	}
	for s := range psp.Step(36) {
		p.Observe("new", s, 0.1*float64(s))
	}
	fmt.Println(p.Judge("old", 10, 36, 4.0), p.Judge("new", 35, 36, 3.5))
	fmt.Printf("%.1f s per step, %.0f of the node's steps\n", p.Interval("old", 4.0), p.Interval("old", 4.0)/p.Reference())
	// Output:
	// slow holds
	// 0.4 s per step, 4 of the node's steps
}

// A node of a job of five (it knows four peers) guesses the job's size
// from its own estimate and its peers' reports, each weighed by how long
// it has known them. Two liars reporting 1e9 beside two honest peers do
// not move it; two honest reports beside it set it.
func ExamplePopulation() {
	known := []psp.Report{{N: 5, Age: 120}, {N: 5, Age: 120}}
	liars := []psp.Report{{N: 1e9, Age: 120}, {N: 1e9, Age: 120}}
	fmt.Println(psp.Population(5, append(known, liars...), 4, 120))
	// A joiner's own estimate (its bootstrap peer and itself) weighs as
	// a new reporter's: its peers' reports carry it (to their lower
	// median, with its own vote below them).
	fmt.Println(psp.Population(2, []psp.Report{{N: 50}, {N: 52}, {N: 49}}, 1, 0))
	// Output:
	// 5
	// 49
}
