package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/pspnode/pspnode/internal/vclock"
)

// A node alone counts itself: its population is 1, not 0 (or NaN), in
// /status, in /metrics and for its learning rate.
func TestPopulationAloneIsOne(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nd := memNodes(t, 1, "pssp:2:1", 0.01, nil)[0]
		if st := nd.Status(); st.PopulationEstimate != 1 {
			t.Errorf("/status population_estimate of a node alone = %v, want 1", st.PopulationEstimate)
		}
		if g := metric(t, nd.Registry(), "psp_population_estimate", "", ""); g != 1 {
			t.Errorf("psp_population_estimate of a node alone = %v, want 1", g)
		}
		if p := nd.Population(); p != 1 {
			t.Errorf("population() of a node alone = %v, want 1", p)
		}
	})
}

// In a small job, peers told that a node leaves count it out at once: four
// remain, and they say 4 within two seconds, not 4.4 ten seconds later
// (their lookups and their peers' reports still held the leaver).
func TestPopulationAfterLeave(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 5, "pssp:2:1", 0.1, nil)
		ctx, cancel := context.WithCancel(t.Context())
		stay := nodes[:4]
		wait := runAll(t, ctx, stay)
		done := runOne(ctx, nodes[4])
		defer func() { cancel(); wait() }()
		if !waitFor(30*time.Second, func() bool {
			for _, nd := range nodes {
				if nd.Step() < 10 || nd.Population() != 5 {
					return false
				}
			}
			return true
		}) {
			for _, nd := range nodes {
				t.Logf("%s: step %d, population %.2f", nd.ID().ShortString(), nd.Step(), nd.Population())
			}
			t.Fatal("the five nodes did not train and agree on 5")
		}
		if err := nodes[4].Leave(300 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		<-done
		left := time.Now()
		for time.Since(left) < 10*time.Second {
			time.Sleep(500 * time.Millisecond)
			if time.Since(left) < 2*time.Second {
				continue
			}
			for _, nd := range stay {
				if p, st := nd.Population(), nd.Status().PopulationEstimate; p != 4 || st != 4 {
					t.Fatalf("%v after the leave, %s counts %.2f (status %.2f), want 4", time.Since(left), nd.ID().ShortString(), p, st)
				}
			}
		}
	})
}
