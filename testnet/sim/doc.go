// Package sim is a deterministic discrete-event simulator of N pspnode nodes
// whose barriers are run by the same psp code a real node runs: each node's
// psp.Checker (the nodes' barrier policy: what to ask, early exit, hedging,
// what a check that hears from no peer means, when to check again) decides
// with its psp.Decider. The simulator draws the samples and answers every
// query at once with the peer's step; it models neither round trips nor
// failed queries, so its checks never hedge or replace a peer.
//
// # Model
//
// Time is simulated seconds. Each node repeats: compute an iteration, then
// ask its barrier whether it may start the next. A task takes
// (Exp(1)+1) × straggle factor × time scale seconds (the PSP paper's time
// model); a fixed fraction of nodes, chosen by the seed, are stragglers with
// one factor. Each node draws its task times from its own random stream, so
// runs that differ only in the barrier see the same task times (common
// random numbers), and a run is fully determined by its Config.
//
// Fidelity mode (the default) is the paper's simulator: at every completion
// event, every waiting node is re-evaluated with a fresh sample. Poll mode,
// for very large N, has each waiting node re-check every PollInterval
// seconds instead. Timed mode has each waiting node re-check when its
// Checker says (psp.BarrierTiming from its mean task time and the live
// population), and wakes it as a real node's peers do: a peer that held it
// back tells it when it reaches its threshold, and a query from a peer at
// or behind it wakes it.
//
// What a barrier observes:
//   - probabilistic barriers (pbsp, pssp, pdssp) sample β live nodes
//     uniformly without replacement (psp.SampleOthers); departed nodes are
//     never sampled, as the overlay drops dead peers and a real node
//     replaces a sampled peer that times out;
//   - global barriers (bsp, ssp) see every node in the global view, an
//     oracle of true global state offered as the paper's baseline. A node
//     that leaves gracefully is removed from the view; a node that crashes
//     stays in it with its last step, since a view without a failure
//     detector cannot tell dead from slow — so global barriers stall under
//     crash churn, which is the point PSP makes;
//   - dssp runs the reference's server-based controller (psp.DSSPController)
//     over the global view, with the same crash rule; pdssp runs one
//     psp.PDSSPDecider per node over its sample, with each sampled peer
//     reporting its recent time per step.
//
// Churn: leaves and joins are Poisson processes with rates given as
// fractions of the initial population per minute. A joiner adopts the
// median step of up to JoinSample live nodes (rounded down) and starts
// computing at once: it neither holds back nodes near the median nor trains
// from scratch. The real node uses the same rule.
//
// Recorded: final steps of live nodes, per-node steps every RecordEvery
// seconds, barrier waiting times, and the update sequence lag γ_t of the
// reference chapter: updates form the actual sequence in completion order;
// the true sequence is the same updates stably sorted by step (all step-1
// updates, then all step-2 updates, …, as BSP would order them);
// γ_t = |t − τ(t)| / P, where τ(t) is update t's index in the true sequence
// and P the initial population, i.e. the lag in steps. The empirical lag
// CDF F(r) (the fraction of nodes within r steps behind a completing node,
// estimated from 16 random live nodes per completion) is recorded too, so
// psp.Bound(F(r), β, r, T) can be set beside the measured lag.
package sim
