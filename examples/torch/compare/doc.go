// Command compare runs one PyTorch model under torch DDP and under pspnode
// trainers, side by side, each worker in a network namespace of its own
// behind an emulated wide-area link, and writes tables and figures.
//
// The same model (examples/torch/mnist.py: an MLP, or a small CNN trained
// with momentum, on the MNIST files the repository ships), data split,
// batch size, learning rate and task time (a sleep of (Exp(1)+1)·X s per
// step) run under
//
//   - ddp: torch.distributed DDP with the gloo backend, one process per
//     rank (gradients averaged every step: every rank waits for the
//     slowest);
//   - default: pspnode trainers, each with its `pspnode run --trainer`
//     daemon on the daemon's own barrier and exchange; or BARRIER[/EXCHANGE]
//     (pssp:2:4, asp/gossip, ...) to pass --barrier and --exchange.
//
// Links (tiers.go, internal/netns): every worker's namespace has one
// interface, a TAP on a switch in this process that delays each frame by
// the sender's link delay plus the receiver's, and a tbf rate limit each
// way. The tiers: lan (0.2 ms round trip, 1 Gbit/s), region (20 ms,
// 1 Gbit/s), continent (70 ms, 400 Mbit/s), consumer (30 ms, 100 Mbit/s).
// Before the runs of a tier, two namespaces measure its round trip and
// rate with TCP, and links.md records them.
//
// A cell is a tier, a model and a slow mode: none, sleep (one worker's
// task time ×--slow-factor) or cpu (its processes in a cgroup with a CPU
// quota). --slow-workers N slows N workers so, each alike: the N from
// worker 1 + (seed − 1) mod (workers − 1) on, wrapping round; worker 0,
// which evaluates, never. Every cell runs each seed under each system. A run starts every
// process at once (no worker has a head start), starts training at one
// instant once every trainer is set up, and stops a few seconds after
// the target accuracy was reached, or at --max-duration.
//
// Evaluation is the same work in either system: worker 0 alone evaluates
// on the held-out images during training (DDP's rank 0, whose parameters
// are every rank's; pspnode's worker 0, whose model is what a user of that
// worker gets), every --eval-every, and its accuracy is the one that
// counts; every worker evaluates once at the end (the final accuracy is
// their mean). An evaluation of the MLP costs as much CPU as the forward
// and backward passes of about 25 training steps, so when every pspnode
// worker evaluated (--eval-workers all, where the median worker's
// accuracy counts) the evaluations were half of pspnode's CPU, four times
// DDP's evaluation work, on the machine that ran both.
//
// Per run: the time to the target from the go signal, and from the
// launch of the workers' processes the time until every worker had taken
// its first step and until the target (each trainer's summary says when
// it took its first step), steps per second per
// worker, final accuracy, CPU seconds of all worker processes (trainers
// and daemons apart; the trainers' compute, optimizer step and
// evaluations apart; until the target) and of the
// link emulation, bytes each worker's interface sent per step, peak RSS
// per worker, and for pspnode the daemons' update staleness (their
// psp_update_staleness_steps histogram; n/a where they do not serve it)
// and the lineage each daemon ended on (a run whose daemons ended on more
// than one is flagged). Per cell: the median over seeds and the range,
// the time over DDP's and, for a slow cell, over the same system's
// none-slow time (both paired by seed), and the median fast and slow
// worker's share of its training time at the barrier (pspnode; from the
// daemons' psp_barrier_wait_seconds kept beside the run).
//
// Needs Linux, root, iproute2 and /usr/bin/python3 with torch, grpc and
// numpy; it says what is missing. SIGINT stops the run in progress and
// removes its namespaces; --resume reuses finished runs.
//
//	make build && go run ./examples/torch/compare --out results/ddp
package main
