package plan

import (
	"fmt"
	"math"
	"time"

	"github.com/pspnode/pspnode/psp"
)

// Estimate is what a run is expected to cost, told before it starts so that
// a researcher can size a large or long experiment, and so that one that
// would take the machine's memory is refused (Config.Force runs it anyway).
//
// It is a rough model, fitted to runs of this testnet (mem transport, the
// default connection limits; TestEstimateFitsMeasuredRuns holds the CPU
// within 1.6× of them, and the memory at or above them, within 1.7×) and
// good to about a factor of two:
//
//   - memory: about 2.5 MiB per node plus up to 5.5 MiB more as the
//     nodes meet their peers (a node's memory is libp2p's and the
//     overlay's state per peer met, its connections' state, and its step
//     streams, in about equal parts), at the testnet's default collector
//     target and scaled to Config.GCPercent (gcFactor); under gossip
//     with a model, every node holds the job's recent updates in flight, so
//     memory grows with N² × the update's size; under epidemic:S a node
//     holds S+4 copies of its model;
//   - CPU: the nodes' barrier checks and background work (DHT, overlay,
//     GossipSub heartbeats), about N × (0.0006 + 0.0000105 × min(N, 500))
//     CPU-seconds per paper second (the run's clock over the time scale: a
//     step takes as many checks and messages at any scale) under pBSP and
//     BSP, whose waiting nodes re-check often, and 0.4 of that under the
//     other barriers; plus joining, about N × 0.00038 × min(N, 500)
//     CPU-seconds (a node dials and identifies about min(N, 500) peers in
//     its first minute); plus, under gossip with a model, about 100 µs +
//     18 ns per byte for each copy of an update a node takes in;
//   - wall: the CPU over the machine's cores, at the share a testnet gets
//     (about 1.6 of 2 cores).
type Estimate struct {
	Params   int     // model parameters (0 without a model)
	RSSBytes float64 // peak resident memory of this process
	CPUS     float64 // CPU seconds of the run
	WallS    float64 // wall seconds, on this machine's cores
}

// EstimateRun returns cfg's estimate for a model of params parameters.
func EstimateRun(cfg Config, params, cores int) Estimate {
	n := float64(cfg.Nodes)
	// The clock's seconds the run lasts: warm-up (at most Config.Warmup,
	// usually a fraction) and training.
	runS := cfg.Duration.Seconds() + 0.3*cfg.Warmup.Seconds()
	e := Estimate{Params: params}
	const mib = 1 << 20
	e.RSSBytes = 150*mib + n*(2.5*mib+5.5*mib*math.Min(1, n/200))*gcFactor(cfg.GCPercent, cfg.Nodes)
	paperS := runS
	if cfg.TimeScale > 0 {
		paperS = runS / cfg.TimeScale
	}
	perPaperS := 0.0006 + 0.0000105*math.Min(n, 500)
	if k := cfg.Barrier.Kind; k != psp.PBSP && k != psp.BSP {
		perPaperS *= 0.4
	}
	e.CPUS = n*paperS*perPaperS + n*0.00038*math.Min(n, 500)
	if params > 0 {
		update := float64(4 * params) // dense32; the encodings only shrink it
		if cfg.Exchange.S > 0 {
			e.RSSBytes += n * float64(cfg.Exchange.S+4) * 8 * float64(params)
			// Each node takes in S models a step.
			steps := runS / math.Max(stepTimeS(cfg), 1e-3)
			e.CPUS += n * steps * float64(cfg.Exchange.S) * (100e-6 + 18e-9*update)
		} else {
			const inFlight = 25 // bytes in flight per node pair per update byte, fitted
			e.RSSBytes += n * n * (update + 2048) * inFlight
			steps := runS / math.Max(stepTimeS(cfg), 1e-3)
			const amplification = 3.6 // copies a node takes in of each update (measured at 100 nodes)
			e.CPUS += n * n * steps * amplification * (100e-6 + 18e-9*update)
		}
	}
	e.WallS = e.CPUS / math.Max(1, 0.8*float64(cores))
	return e
}

// stepTimeS is the mean time of a step on the run's clock: the paper's
// task time (Exp(1)+1) s, 2 s on average, times the time scale (the real
// clock with no time scale: unknown, taken as 1 s).
func stepTimeS(cfg Config) float64 {
	if cfg.TimeScale <= 0 {
		return 1
	}
	return 2 * cfg.TimeScale
}

// DefaultGCPercent is the collector target pspnode testnet sets for a
// testnet of nodes nodes: hundreds of nodes share one heap, and Go's
// default (100) made collection about 30 % of a saturated 2-core
// testnet's CPU; 200 cut that for a third more memory. Above 500 nodes
// memory is the tighter limit, and Go's default stays.
func DefaultGCPercent(nodes int) int {
	if nodes <= 500 {
		return 200
	}
	return 100
}

// gcFactor scales the estimate's memory per node, fitted at
// DefaultGCPercent, to the collector target gcPercent (0: the default).
// A node's share of the RSS is about its live heap × (1 + gcPercent/100)
// plus 0.7 of it more (stacks, and what the runtime keeps): at 1000
// nodes of pSSP(10, 4), 5.0 MiB at 100 and 4.0 at 50, for 1.85 MiB live.
func gcFactor(gcPercent, nodes int) float64 {
	def := DefaultGCPercent(nodes)
	if gcPercent <= 0 {
		gcPercent = def
	}
	share := func(p int) float64 { return 1 + float64(p)/100 + 0.7 }
	return share(gcPercent) / share(def)
}

// String renders the estimate for a progress line.
func (e Estimate) String() string {
	return fmt.Sprintf("about %s of wall time (%.0f CPU-seconds) and %.1f GiB of memory",
		time.Duration(e.WallS*float64(time.Second)).Round(time.Second), e.CPUS, e.RSSBytes/(1<<30))
}

// ErrTooLarge is returned by Run when the estimate's memory exceeds what
// the machine has available and Config.Force is not set.
type ErrTooLarge struct {
	Estimate  Estimate
	Available float64 // bytes
}

func (e *ErrTooLarge) Error() string {
	return fmt.Sprintf("the run would need %.1f GiB of memory by its estimate, and this machine has %.1f GiB available: "+
		"use fewer nodes, a smaller model, --exchange epidemic:S (memory constant in N), "+
		"--gc-percent 50 (about a fifth less memory for a third more CPU at 1000 nodes), or --force to run it anyway",
		e.Estimate.RSSBytes/(1<<30), e.Available/(1<<30))
}
