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
	// invalid barrier spec "ssp:04": parameter S: "04" has a leading zero (grammar: asp | bsp | ssp:S | pbsp:B | pssp:B:S | dssp:SL:SU | pdssp:B:SL:SU (B = sample size β, S = staleness, SL..SU = DSSP staleness range))
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
