package node

import (
	"testing"

	"github.com/pspnode/pspnode/internal/builtin"
	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/exchange"
)

// A node that joins a running job adopts the job's step, its model, and
// the learning-rate schedule's position at that step: its trainer must not
// start again at LR0 (which, scaled by 1/N̂ like its peers' rates, made its
// first updates many times theirs).
func TestJoinAdoptsStepModelAndSchedule(t *testing.T) {
	// Under either exchange a joiner fetches the model: averaging alone
	// would take many rounds to pull a fresh model to the job's.
	for _, ex := range []exchange.Spec{{}, {Kind: exchange.Epidemic, S: 2}} {
		t.Run(ex.String(), func(t *testing.T) { testJoinAdopts(t, ex) })
	}
}

func testJoinAdopts(t *testing.T, ex exchange.Spec) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 2, "pssp:1:1", 0, memHosts(t, mn), func(c *nodeSetup) { c.Exchange.Spec = ex })
		running, joiner := nodes[0], nodes[1]
		running.step.Store(100)
		params := running.model.Params()
		params[0] = 0.25 // a model the joiner cannot have by chance
		if err := running.model.SetParams(params); err != nil {
			t.Fatal(err)
		}

		joiner.join(t.Context())

		if got := joiner.Step(); got != 100 {
			t.Fatalf("joiner at step %d, want the job's 100", got)
		}
		if got := joiner.model.(*builtin.ModelTask).SGD().Steps(); got != 100 {
			t.Errorf("joiner's schedule at step %d, want 100", got)
		}
		if g := joiner.Gossip(); (g == nil) != (ex.Kind == exchange.Epidemic) {
			t.Errorf("exchange %s: gossip topic joined: %v", ex, g != nil)
		} else if g != nil && g.LocalStep() != 100 {
			t.Errorf("joiner's gossip validator at step %d, want 100", g.LocalStep())
		}
		if got := joiner.model.Params()[0]; got != 0.25 {
			t.Errorf("joiner's first parameter %v, want the fetched 0.25", got)
		}
	})
}
