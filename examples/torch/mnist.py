#!/usr/bin/python3
"""A small PyTorch model on MNIST (an MLP, or a small CNN), trained as one
worker of a pspnode job, as one rank of torch DDP, or alone: the same
model, data, batch, learning rate and task time in each, so that they can
be compared.

    # a pspnode worker (its daemon: pspnode run --trainer unix:/tmp/a.sock ...)
    /usr/bin/python3 examples/torch/mnist.py --daemon unix:/tmp/a.sock --shard 0 --shards 3

    # a DDP rank (gloo on localhost), e.g. rank 1 of 4
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /usr/bin/python3 examples/torch/mnist.py \\
        --ddp --rank 1 --world 4 --shard 1 --shards 4

The data are the MNIST files the repository ships (model/mnist: the
official test set, 10 000 images), split as pspnode's built-in models split
them: the first 8 000 images train, the last 2 000 are held out. Worker i of
n trains on every n-th training image from i.

--model mlp is 784 → --hidden → 10 (101 770 parameters at 128); --model
cnn is two strided 5×5 convolutions (8 and 16 channels) and a linear layer
(5 994 parameters), more compute per parameter; train it with
--momentum 0.9. --model wide is 784 → --hidden → --hidden → 10 with
--hidden 2048 unless given (5 824 522 parameters, 23 MB: a model whose
exchange costs more than its compute). Every worker builds the model from the same seed
(--init-seed), as DDP broadcasts rank 0's parameters. --time-scale X adds the PSP paper's task
time to every step, a sleep of (Exp(1)+1)·X seconds, times --slow-factor
for a slow worker. The worker evaluates on the held-out images every
--eval-every seconds (0: only at the end) and writes a CSV line per
evaluation (--out).

A harness that starts many workers at once gives each --ready-file and
--go-file: a worker writes its ready file once set up (DDP: after the
ranks met), then waits for the go file, which holds the Unix time at which
every worker starts. --stop-file ends training once the file exists (DDP
ranks agree on it every --ddp-stop-every steps, with one all-reduce).
"""

import argparse
import gzip
import json
import logging
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

IMPORTED = time.time()  # when the imports (torch's) were done, for the start-up figures

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "python"))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist(directory):
    x = read_idx(os.path.join(directory, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255.0
    y = read_idx(os.path.join(directory, "t10k-labels-idx1-ubyte.gz")).astype(np.int64)
    x = x.reshape(len(x), -1)
    return (torch.from_numpy(x[:8000]), torch.from_numpy(y[:8000]),
            torch.from_numpy(x[8000:]), torch.from_numpy(y[8000:]))


class CNN(nn.Module):
    """Two strided 5×5 convolutions (1 → 8 → 16 channels, 28 → 12 → 4
    pixels) and a linear layer to 10 classes, ReLU."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, stride=2)
        self.conv2 = nn.Conv2d(8, 16, 5, stride=2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


class MLP(nn.Module):
    """784 → hidden → 10, ReLU."""

    def __init__(self, hidden=128):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Wide(nn.Module):
    """784 → width → width → 10, ReLU: millions of parameters, few FLOPs each."""

    def __init__(self, width=2048):
        super().__init__()
        self.fc1 = nn.Linear(784, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def written():
    """Bytes this process has written to files and sockets (/proc/self/io
    wchar; for DDP ranks, gloo's sends). 0 where /proc is missing."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_delay():
    """Seconds this thread has waited on a run queue for a CPU (Linux
    /proc/thread-self/schedstat; 0 where it is missing): what a busy
    machine costs the training loop."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def evaluate(model, x, y):
    with torch.no_grad():
        out = model(x)
        return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemon", help="the pspnode daemon's trainer address (unix:PATH or tcp:127.0.0.1:PORT)")
    ap.add_argument("--ddp", action="store_true", help="run as a torch DDP rank (gloo) instead")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--shard", type=int, default=0, help="this worker's shard of the training images")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--data", default=os.path.join(REPO, "model", "mnist"))
    ap.add_argument("--model", choices=["mlp", "cnn", "wide"], default="mlp")
    ap.add_argument("--hidden", type=int, default=0, help="--model mlp: hidden units (default 128); --model wide: "
                    "the width of both hidden layers (default 2048)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0, help="SGD momentum")
    ap.add_argument("--init-seed", type=int, default=1, help="the model's initialisation: the same on every worker")
    ap.add_argument("--seed", type=int, default=None, help="batch order and task times (default: from the shard)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--target", type=float, default=0, help="stop once a held-out evaluation reaches this accuracy (0: never)")
    ap.add_argument("--time-scale", type=float, default=0, help="add a sleep of (Exp(1)+1)·X s to every step")
    ap.add_argument("--slow-factor", type=float, default=1, help="multiply the sleep (a slow worker)")
    ap.add_argument("--eval-every", type=float, default=1.0,
                    help="evaluate every this many seconds (0: only once, at the end)")
    ap.add_argument("--out", help="CSV of evaluations: time_s,step,loss,accuracy")
    ap.add_argument("--summary", help="write a JSON summary here at the end")
    ap.add_argument("--start-at", type=float, default=0,
                    help="after setting up, wait until this Unix time to start training (so that workers start together)")
    ap.add_argument("--ready-file", help="write this file once set up (a harness waits for every worker's)")
    ap.add_argument("--go-file", help="once set up, wait for this file, which holds the Unix time to start training at")
    ap.add_argument("--stop-file", help="stop training once this file exists")
    ap.add_argument("--no-shm", action="store_true", help="pspnode: tensors through the socket, not shared memory")
    ap.add_argument("--log", default="info")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)

    xtr, ytr, xte, yte = load_mnist(a.data)
    loaded = time.time()
    xtr, ytr = xtr[a.shard::a.shards], ytr[a.shard::a.shards]
    torch.manual_seed(a.init_seed)
    if a.model == "cnn":
        model, model_name = CNN(), "mnist-cnn"
    elif a.model == "wide":
        width = a.hidden or 2048
        model, model_name = Wide(width), f"mnist-wide-{width}"
    else:
        model, model_name = MLP(a.hidden or 128), f"mnist-mlp-{a.hidden or 128}"
    rng = random.Random(a.seed if a.seed is not None else 1000 + a.shard)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))

    # --- the single-process loop, plus the lines marked for pspnode ----------
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    if a.ddp and a.target:
        ap.error("--target stops one rank only; with --ddp the others would wait for it forever (use --duration or --steps)")
    if a.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
        net = DDP(model)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
        # The ranks must stop at the same step: a rank that steps on alone
        # waits for the others' gradients forever. Each rank's wish to stop
        # rides in the gradients' all-reduce as one more number, so the
        # ranks agree after every step at no cost in round trips (a
        # separate all-reduce would cost one more per step, a lot on a
        # wide-area link).
        stopping = {"wish": 0.0, "agreed": False}

        def allreduce_with_stop(state, bucket):
            buf = bucket.buffer()
            t = torch.cat([buf, torch.tensor([state["wish"]], dtype=buf.dtype)])
            fut = dist.all_reduce(t, async_op=True).get_future()

            def averaged(f):
                out = f.value()[0]
                state["agreed"] = state["agreed"] or out[-1].item() > 0
                return out[:-1].div_(a.world)
            return fut.then(averaged)

        net.register_comm_hook(stopping, allreduce_with_stop)
    else:
        net = model
    if a.daemon:
        import pspnode                                                # pspnode
        try:
            opt = pspnode.Optimizer(opt, a.daemon, model=model,       # pspnode
                                    model_name=model_name, shared_memory=not a.no_shm)
        except pspnode.DaemonError as e:
            print(f"mnist.py: {e}", file=sys.stderr)
            sys.exit(2)

    set_up = time.time()
    if a.ready_file:
        with open(a.ready_file, "w") as f:
            f.write(f"{set_up:.3f}\n")
    if a.go_file:
        while True:
            try:
                with open(a.go_file) as f:
                    a.start_at = float(f.read())
                break
            except (OSError, ValueError):  # not there yet, or being written
                time.sleep(0.01)
    late = 0.0
    if a.start_at:
        late = time.time() - a.start_at
        if late > 0:
            logging.warning("set-up ended %.1f s after the start time: starting at once", late)
        else:
            time.sleep(-late)
    wchar0 = written()
    out = open(a.out, "w") if a.out else None
    if out:
        out.write("time_s,step,loss,accuracy\n")
    start = time.monotonic()
    if a.start_at:
        # Every worker's clock starts at --start-at, so that a worker whose
        # set-up ended late still ends with the others.
        start -= max(0.0, time.time() - a.start_at)
    next_eval, steps, sleeping, best, first_step = 0.0, 0, 0.0, 0.0, 0.0
    step0 = getattr(opt, "step_count", 0)
    # Where the process's CPU goes: the training thread's CPU by phase
    # (thread_time: the batch's forward and backward, the optimizer's step,
    # the evaluations), the wall time of the optimizer's step, and the
    # process's CPU (its other threads: gloo's, gRPC's).
    phase = {"compute": 0.0, "step": 0.0, "eval": 0.0}
    step_wall, eval_wall, evals, cpu0, thr0, rq0 = 0.0, 0.0, 0, time.process_time(), time.thread_time(), run_delay()
    while True:
        now = time.monotonic() - start
        # A DDP rank's parameters are every rank's after each step, so rank 0
        # alone evaluates (as a DDP user does): an evaluation on every rank
        # would stall all of them once per rank.
        if a.eval_every > 0 and now >= next_eval and not (a.ddp and a.rank != 0):
            c0, w0 = time.thread_time(), time.perf_counter()
            loss, acc = evaluate(model, xte, yte)
            phase["eval"] += time.thread_time() - c0
            eval_wall += time.perf_counter() - w0
            evals += 1
            best = max(best, acc)
            if out:
                out.write(f"{now:.3f},{step0 + steps},{loss:.5f},{acc:.5f}\n")
                out.flush()
            if a.daemon:
                opt.report(loss, acc)
            next_eval = now + a.eval_every
            if a.target and acc >= a.target:
                break
        stop = bool((a.steps and steps >= a.steps) or (a.duration and now >= a.duration)
                    or (a.stop_file and os.path.exists(a.stop_file)))
        if a.ddp:
            if stopping["agreed"]:  # every rank learnt it from the same all-reduce
                break
            stopping["wish"] = 1.0 if stop else 0.0
        elif stop:
            break
        c0 = time.thread_time()
        idx = torch.randint(len(xtr), (a.batch,), generator=gen)
        opt.zero_grad()
        loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
        c1 = time.thread_time()
        if a.time_scale > 0:
            d = (rng.expovariate(1.0) + 1.0) * a.time_scale * a.slow_factor
            time.sleep(d)
            sleeping += d
        c2 = time.thread_time()
        loss.backward()
        c3, w3 = time.thread_time(), time.perf_counter()
        opt.step()
        c4 = time.thread_time()
        if steps == 0:
            first_step = time.time()
        step_wall += time.perf_counter() - w3
        phase["compute"] += (c1 - c0) + (c3 - c2)
        phase["step"] += c4 - c3
        steps += 1
    cpu = time.process_time() - cpu0
    main_cpu = time.thread_time() - thr0
    runq = run_delay() - rq0
    elapsed = time.monotonic() - start
    loss, acc = evaluate(model, xte, yte)
    if out:
        out.write(f"{elapsed:.3f},{step0 + steps},{loss:.5f},{acc:.5f}\n")
        out.close()
    summary = {"steps": steps, "elapsed_s": elapsed, "final_accuracy": acc, "final_loss": loss,
               "best_accuracy": best, "sleep_s": sleeping, "first_step": step0,
               "bytes_written": written() - wchar0, "start_late_s": max(0.0, late),
               "model": model_name, "parameters": sum(p.numel() for p in model.parameters()),
               "cpu_s": cpu, "cpu_main_s": main_cpu, "cpu_compute_s": phase["compute"], "cpu_step_s": phase["step"],
               "cpu_eval_s": phase["eval"], "evaluations": evals, "step_wall_s": step_wall, "eval_wall_s": eval_wall,
               "run_queue_s": runq, "imported_unix": IMPORTED, "loaded_unix": loaded,
               "set_up_unix": set_up, "first_step_unix": first_step}
    if a.daemon:
        summary["population"] = opt.population
        opt.close()
    if a.ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump(summary, f)
    logging.info("done: %s", summary)


if __name__ == "__main__":
    main()
