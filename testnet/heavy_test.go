//go:build !race

package testnet

import (
	"math"
	"testing"
	"time"

	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/plan"
)

// The whole-testnet runs in this file take minutes under the race detector
// (whose bubbles run with one P, see vclock.Test), so they are built only
// without it; make test runs them in its second pass. The race pass covers
// the same code through the smaller runs of the other test files
// (TestChurnOnSchedule, TestHostileRoles, TestRealClockReportsOverload).

// TestSmallTestnet runs 20 real nodes (in-memory transport, real DHT,
// GossipSub and engine) under pSSP and checks that all advance, that no
// node stalls, that the spread respects the sample-level bound, and that a
// churn script with crashes leaves no stalled node.
func TestSmallTestnet(t *testing.T) {
	cfg := smallConfig(12 * time.Second)
	cfg.Script = []plan.Event{{At: 4 * time.Second, Action: plan.Crash, Fraction: 0.2}, {At: 6 * time.Second, Action: plan.Join, Count: 2}}
	res := runLogged(t, cfg)
	if res.Crashed != 4 || res.Joined != 2 || res.LiveNodes != 18 {
		t.Errorf("churn script not applied: crashed %d joined %d live %d", res.Crashed, res.Joined, res.LiveNodes)
	}
	if res.Steps.Min < 10 {
		t.Errorf("some node made little progress: %+v", res.Steps)
	}
	if res.StalledNodes != 0 {
		t.Errorf("%d nodes stalled", res.StalledNodes)
	}
	// pSSP(5, 2) is a sample-level bound: a node passes only if its 5
	// sampled peers are within 2 steps. Over 18 nodes the global spread
	// can exceed s+1 by a few steps, but not by much.
	if spread := res.Steps.Max - res.Steps.Min; spread > 10 {
		t.Errorf("step spread %v too wide for pssp:5:2", spread)
	}
	// Honest nodes refuse no model whose bytes came (at most 1 % of those
	// received), and decline at their offer only models that came sooner
	// than the exchange's sender spacing allows ("rate") or before the
	// receiver's first step ("no_model").
	declined := res.Updates.DeclinedByReason["rate"] + res.Updates.DeclinedByReason["no_model"]
	if res.Updates.Received == 0 || res.Updates.Rejected*100 > res.Updates.Received || declined != res.Updates.Declined {
		t.Errorf("updates: %+v", res.Updates)
	}
	if res.Accuracy == nil || res.Accuracy.Metric != "r2" || !(res.Accuracy.Final > 0.9) {
		t.Errorf("synthetic linreg did not train: %+v", res.Accuracy)
	}
	if res.Sampling.Draws == 0 {
		t.Error("no samples counted")
	}
	// Every node holds connections to its pool and mesh, and the pool
	// rotates, so each opens some connections during training.
	if res.Connections.HeldMean < 1 || !(res.Connections.OpenedPerNodeMin > 0) {
		t.Errorf("connections not counted: %+v", res.Connections)
	}
	// The report carries its cost, in the run's own figures.
	if c := res.Cost; c == nil || !(c.CPUS > 0) || !(c.PaperNodeSPerCPUS > 0) || !(c.RSSBytesPerNode > 0) ||
		c.ConnectionsHeldPerNode != res.Connections.HeldMean || c.ConnectionsOpenedPerNode != res.Connections.OpenedPerNodeMin {
		t.Errorf("cost: %+v", c)
	}
}

// TestHostileTestnet runs 20 real nodes of which some lie about their step,
// poison their updates or flood one node, and checks the defences: no
// invalid update reaches an honest model, the large-norm ones are refused,
// stuck reports are screened, the flood is capped, and the honest nodes
// advance and train.
func TestHostileTestnet(t *testing.T) {
	cfg := smallConfig(10 * time.Second)
	cfg.Exchange = exchange.Spec{} // gossip: the poison is counted on its topic
	cfg.Roles = []plan.RoleShare{{Role: plan.LiarZero, Fraction: 0.1}, {Role: plan.PoisonNaN, Fraction: 0.05}, {Role: plan.PoisonNorm, Fraction: 0.05}, {Role: plan.Flooder, Fraction: 0.05}}
	res := runLogged(t, cfg)
	h := res.Hostile
	if h == nil || h.HonestNodes != 15 {
		t.Fatalf("hostile report: %+v", h)
	}
	if h.PoisonApplied != 0 {
		t.Errorf("%d invalid poisoned updates reached honest models", h.PoisonApplied)
	}
	if res.Updates.Rejected == 0 {
		t.Error("no poisoned update was rejected by validation")
	}
	if h.NormPoisonDelivered == 0 || res.Defences.UpdatesNormRefused < h.NormPoisonDelivered {
		t.Errorf("large-norm poison: %d delivered, %d refused", h.NormPoisonDelivered, res.Defences.UpdatesNormRefused)
	}
	if res.Defences.ReportsScreened == 0 {
		t.Error("no step report of the zero-liars was screened")
	}
	if h.Target == nil || h.Target.StreamsRefused == 0 {
		t.Errorf("flood not capped: %+v", h.Target)
	}
	if res.Steps.Min < 10 || res.StalledNodes != 0 {
		t.Errorf("honest nodes: steps %+v, %d stalled", res.Steps, res.StalledNodes)
	}
	if res.Accuracy == nil || !(res.Accuracy.Final > 0.9) {
		t.Errorf("honest nodes did not train: %+v", res.Accuracy)
	}
}

// The same flags and seed give the same step figures within 1.5 %. The
// links have a latency spread: with zero-latency links many events share
// one virtual instant, Go runs the goroutines ready then in an order of its
// choosing, and at 20 nodes two runs drifted up to 1.3 % apart (1 run in
// about 4); with 1-5 ms links, over 1 % in 1 run of 24 (1.2 %).
func TestReproducible(t *testing.T) {
	cfg := tinyConfig(20, 30*time.Second)
	cfg.Barrier = psp.MustParse("pbsp:4")
	cfg.Latency = plan.Latency{Min: time.Millisecond, Max: 5 * time.Millisecond}
	a, b := runLogged(t, cfg), runLogged(t, cfg)
	if d := math.Abs(a.Steps.Mean-b.Steps.Mean) / a.Steps.Mean; d > 0.015 {
		t.Errorf("mean steps %.2f then %.2f with the same seed: %.1f %% apart", a.Steps.Mean, b.Steps.Mean, 100*d)
	}
}

// TestVirtualClockFeatures runs the testnet features that the other tests
// leave out on the virtual clock at once: stragglers, a partition that
// heals, lossy links with a latency spread, a bandwidth limit, and a real
// model on the built-in MNIST set.
func TestVirtualClockFeatures(t *testing.T) {
	cfg := plan.DefaultConfig()
	cfg.Nodes, cfg.Duration, cfg.TimeScale = 16, 40*time.Second, 0.1
	cfg.Barrier = psp.MustParse("pssp:4:2")
	cfg.Model, cfg.Data = "logreg", "mnist"
	cfg.Stragglers, cfg.StraggleFactor = 0.25, 3
	cfg.Latency = plan.Latency{Min: 5 * time.Millisecond, Max: 40 * time.Millisecond}
	cfg.Bandwidth = 10e6 // 10 MB/s: a 31 KB update takes 3 ms of each link it crosses
	cfg.Loss = 0.02
	cfg.EvalEvery = 5 * time.Second
	cfg.StallWindow = 5 * time.Second
	cfg.Script = []plan.Event{{At: 5 * time.Second, Action: plan.Partition, Fraction: 0.5}, {At: 10 * time.Second, Action: plan.Heal}}
	res := runLogged(t, cfg)
	if res.FastSteps == nil || !(res.FastSteps.Mean > res.StragglerSteps.Mean) {
		t.Errorf("stragglers not slower: fast %+v, stragglers %+v", res.FastSteps, res.StragglerSteps)
	}
	if res.StalledNodes != 0 || res.Steps.Min < 40 {
		t.Errorf("steps %+v, %d stalled", res.Steps, res.StalledNodes)
	}
	// 5-40 ms one way: a step query's round trip takes at least 10 ms of
	// virtual time, more when it queues behind updates on a node's link.
	if rtt := res.SampleRTTMs.P50; rtt < 10 || rtt > 1000 {
		t.Errorf("step query round trip p50 %.1f ms: the links' latency and bandwidth take 10 ms to 1 s", rtt)
	}
	// The halves found each other again: the estimates are back.
	if e := res.Population.MedianRelError; !(e < 0.1) {
		t.Errorf("population error median %.2f 30 s after the partition healed", e)
	}
	if res.Accuracy == nil || !(res.Accuracy.Final > 0.8) {
		t.Errorf("MNIST logistic regression did not train: %+v", res.Accuracy)
	}
}

// TestSybilZoneEstimate runs 60 nodes of which 9 have keys ground into one
// victim's zone of the ID space. The victim's zone (a quarter of the ID
// space at 60 nodes: its first bucket is the only full one) holds about 13
// of the 51 honest nodes plus the 9 Sybils, so its zone-density estimator
// reads far high; the estimate the node uses fuses it with random-key
// lookups and peers' reports and stays within 25 %. Both halves can fail:
// a zone estimator the Sybils did not reach, or a fusion that follows it.
func TestSybilZoneEstimate(t *testing.T) {
	cfg := tinyConfig(60, 12*time.Second)
	cfg.Roles = []plan.RoleShare{{Role: plan.SybilZone, Fraction: 0.15}}
	cfg.SybilVictims, cfg.SybilPrefix = 1, 10
	res := runLogged(t, cfg)
	f := res.Hostile.SybilFigures
	if f == nil || f.Victims != 1 {
		t.Fatalf("sybil figures %+v", f)
	}
	if f.VictimZoneError < 0.3 {
		t.Errorf("the victim's zone estimator read %.0f %% off: the Sybils did not crowd its zone", 100*f.VictimZoneError)
	}
	if f.VictimError > 0.25 {
		t.Errorf("the victim's estimate read %.0f %% off (zone alone %.0f %%): want at most 25 %%", 100*f.VictimError, 100*f.VictimZoneError)
	}
	// Samples stay uniform over identities: the Sybils are about their
	// share of the honest nodes' draws (9 of 59 others), at most twice.
	if f.SampleShare > 2*f.IDShare {
		t.Errorf("Sybils are %.1f %% of honest draws, %.1f %% of identities", 100*f.SampleShare, 100*f.IDShare)
	}
}
