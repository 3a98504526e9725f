// Package barrier is a node's barrier: psp.Checker's policy (what to ask,
// hedging, early exit, what a failed query or a silent check means, when
// to check again) with the I/O around it. The Checker is pure and shared
// with the simulator; this package carries out what it says: draws from
// the overlay's sampler, step queries (internal/wire's Asker), timers,
// and the wake of progress reports.
//
// A Barrier is built from its node's parts (Parts): the overlay, the
// census (population estimate), the isolation record, the lineage and
// model identity (Kin), the start-up milestones, and the node itself
// behind Node, for the realignment a failed check may call for and the
// node's events. It keeps what it learns of the peers:
//
//	barrier.go   the Barrier, Wait and the check loop (drive): draws, queries, timers, progress wakes
//	observe.go   judging one answer (a leaving peer, another model or lineage, psp.Screen), late answers (Drain), what a check tells the overlay in one call
//	progress.go  the peers' known steps without asking (internal/progress): vouched answers, promised notices, and waking the peers this node held back
//	pace.go      each peer's pace as the checks saw it (psp.Pace), for other goroutines (PeerPace)
//	timing.go    the timing rules (psp.BarrierTiming) in durations: re-check, wake, hedge, query timeout
//
// Wait is called by the node's stepping goroutine only; Poke, Progress,
// PushProgress, NoteAsker, DropPeer, PeerPace and Waiting are safe from
// any goroutine.
package barrier
