// Package psp holds pspnode's barrier semantics: steps, the classic barriers
// (ASP, BSP, SSP), the probabilistic barriers pBSP and pSSP and their pace
// rule, the DSSP controllers (server-based and decentralised), uniform
// sampling without replacement, the convergence bound of the PSP paper and
// the barrier spec grammar.
//
// # Model
//
// A node's step c is the number of iterations it has completed. After it
// completes iteration c it asks its barrier whether it may start iteration
// c+1. A barrier looks at the steps of other nodes:
//
//   - ASP passes always.
//   - BSP passes iff every other node has step >= c.
//   - SSP(s) passes iff every other node has step >= c-s.
//   - pBSP(β) draws β peers uniformly at random without replacement and
//     passes iff every sampled step >= c.
//   - pSSP(β, s) passes iff every sampled step >= c-s.
//   - DSSP(S_L, S_U) and pDSSP(β, S_L, S_U) let the staleness vary within
//     [S_L, S_U], granting extra steps when that is predicted to cut waiting.
//
// A node that must wait asks again later with a fresh sample.
//
// The pace rule (Pace, CheckConfig.Pace) refines pBSP and pSSP for jobs
// of machines of different speeds: a check learns each peer's seconds per
// step from successive observations, and a peer behind the threshold that
// steps more than Factor times slower than the node, or would need more
// than Horizon of the node's steps to reach the threshold, is excused, not
// waited for. Its zero value is the paper's barriers.
//
// # Running a barrier
//
// Deciding one check is a Decider's job; running a barrier is a
// Checker's: what to ask (β drawn peers, or every known peer that may
// lag), hedging slow peers and replacing failed ones, ending a check at the
// first answer that fails it, what a check that hears from no peer means
// (Isolated), and when to check again (BarrierTiming). A Checker is a pure
// machine in the manner of etcd's raft.RawNode: the caller does all I/O,
// feeding it events and doing what Ready says. The node drives it with its
// sampler, step queries and timers; the simulator with its population,
// answering every query at once.
//
// Population is the rule by which a node guesses its job's size, which
// scales its learning rate: the weighted lower median of its own estimate
// and its peers' reports, each reporter weighed by how long it has been
// reporting, so that a minority of liars, or a crowd of fresh identities,
// cannot move it far; BoundRate bounds how fast it changes.
//
// # Adding a barrier kind
//
// A kind is one entry of the kinds table (kinds.go) and its Kind constant
// beside it: its name, its parameters (Params: the name:p1:p2 grammar,
// each parameter setting a Spec field), which peers a check asks (Scope),
// whether its staleness is dynamic, whether the pace rule applies, whether
// the simulator runs a server-based baseline of it, and its help line.
// Parse, String, Validate, the Spec predicates, SampleSize,
// BaseStaleness, NewDecider, the Checker, the simulator (testnet/sim) and
// the CLI's help texts and errors all read the table; TestKindsTable
// checks a new entry against what they assume. A kind with semantics the
// table cannot say (a new Decider, a new Spec field) adds a field to
// KindInfo, read where the semantics live, rather than a switch on Kind.
//
// The package is pure: no I/O, no clocks, no goroutines. Time, where a
// controller needs it, is passed in by the caller as seconds on the caller's
// own clock, and randomness comes from a *rand.Rand the caller owns, so the
// discrete-event simulator (testnet/sim) and the real node (node) run exactly
// the same decisions and the same barrier policy, and a barrier bug shows
// up first in a fast deterministic test.
package psp
