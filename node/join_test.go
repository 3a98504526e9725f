package node

import (
	"context"
	"testing"
	"time"

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

// A joiner whose answers split into camps (two or more far from the
// median) asks every peer it can draw and waits the quorum wait before
// taking the lower median; one dissenter alone is a single liar, and the
// join settles at once; a join whose context ends returns within a poll.
func TestContestedJoin(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		honest, liars, joiners int           // joiners: peers still at step 0
		ctxAfter               time.Duration // 0: none
		wantStep               int64
		atLeast, below         time.Duration
	}{
		{"two liars far ahead: contested, the whole wait", 4, 2, 0, 0, 200, joinQuorumWait, joinQuorumWait + 3*time.Second},
		{"one liar: settled at once", 5, 1, 0, 0, 200, 0, joinQuorumPoll},
		{"other joiners at step 0 are no camp: settled at once", 5, 0, 3, 0, 200, 0, joinQuorumPoll},
		{"contested, the context ends", 4, 2, 0, 2 * time.Second, -1, 2 * time.Second, 2*time.Second + joinQuorumPoll + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				mn := memnet.New(0)
				t.Cleanup(func() { _ = mn.Close() })
				n := tc.honest + tc.liars + tc.joiners + 1
				nodes := buildTestNodesWith(t, n, "pssp:1:1", 0, memHosts(t, mn), nil)
				for i, nd := range nodes[:tc.honest+tc.liars] {
					nd.step.Store(200)
					if i >= tc.honest {
						nd.cfg.faults.StepLie = func(int64) int64 { return 1 << 40 }
					}
				}
				joiner := nodes[n-1]
				if !waitFor(30*time.Second, func() bool { return len(joiner.ov.Peers()) == n-1 }) {
					t.Fatalf("the joiner knows %d peers, want %d", len(joiner.ov.Peers()), n-1)
				}
				ctx := t.Context()
				if tc.ctxAfter > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.ctxAfter)
					defer cancel()
				}
				start := time.Now()
				v := joiner.jobState(ctx, 0, false, nil)
				took := time.Since(start)
				if took < tc.atLeast || took >= tc.below {
					t.Errorf("the join took %v, want [%v, %v)", took, tc.atLeast, tc.below)
				}
				if tc.wantStep >= 0 && v.adopt != tc.wantStep {
					t.Errorf("adopted step %d from %d answers, want %d", v.adopt, v.observed, tc.wantStep)
				}
			})
		})
	}
}
