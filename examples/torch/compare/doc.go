// Command compare runs one PyTorch model under torch DDP and under pspnode
// trainers, side by side on this machine, and writes a table and figures.
//
// The same model (examples/torch/mnist.py: an MLP on the MNIST files the
// repository ships), data split, batch size, learning rate and task time
// (a sleep of (Exp(1)+1)·X s per step, a share of workers slowed by a
// factor) run under
//
//   - ddp: torch.distributed DDP with the gloo backend on localhost, one
//     process per rank (gradients averaged every step: every rank waits
//     for the slowest);
//   - a pspnode barrier, with an optional exchange (pssp:2:4,
//     asp/epidemic:2, ...): pspnode trainers, one `pspnode run --trainer`
//     daemon each.
//
// Workers start together (--start-at), evaluate on the 2 000 held-out
// images every second (under DDP rank 0 alone: the ranks hold the same
// parameters, and an evaluation stalls every rank), and run for a fixed
// time. Reported per run: the time until half the workers (DDP: rank 0)
// have reached the target accuracy, steps per
// second per worker, the workers' mean final accuracy, and bytes sent per
// worker per step (what the worker's network process wrote to its
// sockets: the DDP rank, or the pspnode daemon; /proc/PID/io).
//
//	make build && go run ./examples/torch/compare --out results/ddp
package main
