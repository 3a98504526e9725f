#!/usr/bin/python3
"""A small character-level transformer language model (or, with --task,
an MNIST model), trained as one worker of a job under one of:

  diloco     pspnode.DiLoCo: H inner AdamW steps, then an outer Nesterov
             step on the pseudo-gradient averaged by a pspnode daemon (the
             barrier, e.g. pSSP, counts outer steps)
  allreduce  the same DiLoCo outer step after a blocking gloo all-reduce of
             the pseudo-gradients (what prime and OpenDiLoCo do)
  ddp        torch DDP (gloo): gradients all-reduced at every step
  psp        pspnode.Optimizer: a pspnode exchange at every step
  local      alone (for tuning)

    # rank 1 of 4 under DiLoCo/pSSP, its daemon started by the optimizer
    /usr/bin/python3 examples/diloco/charlm.py --system diloco --rank 1 --world 4 \\
        --bootstrap /ip4/127.0.0.1/tcp/4001/p2p/12D3Koo... --out w1.json

The text is the licence texts every Debian system has in
/usr/share/common-licenses (the base-files package, which is essential):
about 240 000 characters of English, the same bytes on every machine
(their SHA-256 goes into the summary). It is cut into blocks of 1 024
characters, every tenth held out. Each worker draws its own random
windows of the rest (seed, rank). Every worker builds the model from one
seed, as DDP broadcasts rank 0's parameters.

A step sleeps --sleep seconds beside its compute (an accelerator's time;
--slow multiplies it by --slow-factor, and the runner gives a slow worker
a smaller CPU quota too). The worker evaluates on 32 held-out windows every
--eval-every steps (under DiLoCo: its θ_outer after each outer step) and
writes a JSON summary (--out): its curve, the bytes its network process
wrote (/proc/PID/io wchar of the pspnode daemon, or of this process for
gloo), CPU seconds and peak memory of the trainer and its daemon.
"""

import argparse
import datetime
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "python"))

LICENSES = "/usr/share/common-licenses"
CORPUS = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2", "GPL-3", "LGPL-2",
          "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]
BLOCK, HOLD_OUT = 1024, 10
STOP_EVERY = 20  # DDP's ranks vote on stopping every this many steps

log = logging.getLogger("charlm")


def load_corpus(directory=LICENSES):
    """The training and held-out text, the vocabulary and the corpus's
    SHA-256."""
    missing = [f for f in CORPUS if not os.path.isfile(os.path.join(directory, f))]
    if missing:
        raise SystemExit(f"charlm: {directory} lacks {', '.join(missing)}: the corpus is Debian's licence texts "
                         "(package base-files); pass --corpus DIR holding those files")
    text = "\n".join(open(os.path.join(directory, f), encoding="utf-8", errors="replace").read() for f in CORPUS)
    digest = hashlib.sha256(text.encode()).hexdigest()
    vocab = sorted(set(text))
    idx = {c: i for i, c in enumerate(vocab)}
    ids = np.array([idx[c] for c in text], dtype=np.int64)
    blocks = [ids[i:i + BLOCK] for i in range(0, len(ids), BLOCK)]
    train = np.concatenate([b for i, b in enumerate(blocks) if i % HOLD_OUT != HOLD_OUT - 1])
    held = np.concatenate([b for i, b in enumerate(blocks) if i % HOLD_OUT == HOLD_OUT - 1])
    return train, held, vocab, digest


class CharLM(nn.Module):
    """Embedding and learnt positions, pre-norm transformer blocks with a
    causal mask, a final norm and a linear head."""

    def __init__(self, vocab, d=32, layers=2, heads=4, context=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), 1), persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.emb(x) + self.pos[:t]
        return self.head(self.norm(self.blocks(h, mask=self.mask[:t, :t])))


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class Windows:
    """Random windows of the training text, this worker's own stream."""

    def __init__(self, text, context, batch, seed):
        self.text, self.context, self.batch = torch.from_numpy(text), context, batch
        self.rng = np.random.default_rng(seed)

    def next(self):
        starts = self.rng.integers(0, len(self.text) - self.context - 1, self.batch)
        w = torch.stack([self.text[s:s + self.context + 1] for s in starts])
        return w[:, :-1], w[:, 1:]


def held_out(text, context, n=32):
    starts = np.linspace(0, len(text) - context - 2, n).astype(np.int64)
    w = torch.stack([torch.from_numpy(text[s:s + context + 1]) for s in starts])
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def evaluate_loss(model, data):
    return float(loss_of(model, *data))


def write_file(path, text):
    """Writes text to path whole (through a temporary file and a rename),
    so that a reader polling for it never sees part of it."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def wchar(pid="self"):
    """What a process has written to files and sockets (/proc/PID/io)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_usage(pid):
    """CPU seconds and peak resident bytes of a running process."""
    cpu, peak = 0.0, 0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return cpu, peak


class AllReduceDiLoCo:
    """DiLoCo with a blocking all-reduce: every H inner steps the workers'
    pseudo-gradients θ_outer − θ_i are summed by gloo and divided by the
    world size, and the outer SGD (Nesterov) takes the mean as θ_outer's
    gradient: the same outer step as pspnode.DiLoCo's."""

    def __init__(self, inner, model, H, outer_lr, outer_momentum, stop_wanted):
        import torch.distributed as dist
        self.dist, self.inner, self.H = dist, inner, H
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.outer_params = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(self.outer_params, lr=outer_lr, momentum=outer_momentum, nesterov=True)
        self.inner_step_count = self.outer_step_count = 0
        self.world = dist.get_world_size()
        self.stop_wanted, self.stop = stop_wanted, False

    def zero_grad(self):
        self.inner.zero_grad()

    def step(self):
        self.inner.step()
        self.inner_step_count += 1
        if self.inner_step_count < self.H:
            return
        with torch.no_grad():
            # The last value is a vote to stop, so that the ranks agree on
            # when to stop at no extra round trip.
            flat = torch.cat([(o - p).reshape(-1) for o, p in zip(self.outer_params, self.params)] +
                             [torch.tensor([1.0 if self.stop_wanted() else 0.0])])
            self.dist.all_reduce(flat)  # blocks until every worker has taken its H steps
            self.stop = bool(flat[-1] > 0)
            flat = flat[:-1] / self.world
            off = 0
            for o in self.outer_params:
                o.grad = flat[off:off + o.numel()].view_as(o).clone()
                off += o.numel()
            self.outer.step()
            for p, o in zip(self.params, self.outer_params):
                p.copy_(o)
        self.inner_step_count = 0
        self.outer_step_count += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", choices=["diloco", "allreduce", "ddp", "psp", "local"], required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1:29500", help="gloo's rendezvous (allreduce, ddp): rank 0's HOST:PORT")
    ap.add_argument("--job", default="charlm")
    ap.add_argument("--bootstrap", default="", help="a peer's multiaddr (diloco, psp; none for rank 0)")
    ap.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="the daemon's listen multiaddr")
    ap.add_argument("--addr-file", default="", help="write the daemon's first listen address here (rank 0)")
    ap.add_argument("--compression", choices=["none", "bf16", "int8", "int4"], default=None,
                    help="pspnode.DiLoCo's compression (default: its own, int8 under epidemic)")
    ap.add_argument("--daemon-args", default="--barrier pssp:2:4 --exchange epidemic:1",
                    help="more `pspnode run` flags for the daemon (diloco, psp)")
    ap.add_argument("--bin", default=os.path.join(REPO, "bin", "pspnode"))
    ap.add_argument("--task", choices=["charlm", "cnn", "mlp"], default="charlm",
                    help="the model: this file's character model, or an MNIST model of examples/diloco/tasks.py (the "
                         "5 994-parameter CNN or the 784-64-10 MLP on the repository's t10k images, each worker its "
                         "DistributedSampler shard; --batch images a step)")
    ap.add_argument("--corpus", default=LICENSES)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per worker per step")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW's rate (the inner optimizer's under DiLoCo)")
    ap.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up of the AdamW rate")
    ap.add_argument("--H", type=int, default=100, help="inner steps per outer step (diloco, allreduce)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--merge-wait", type=float, default=1.0, help="pspnode.DiLoCo's merge_wait (seconds)")
    ap.add_argument("--steps", type=int, default=800, help="steps to take (inner steps under DiLoCo)")
    ap.add_argument("--deadline", type=float, default=0, help="stop after this many seconds of training (0: none)")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds each step sleeps beside its compute")
    ap.add_argument("--slow", action="store_true", help="this worker is slow: --sleep × --slow-factor")
    ap.add_argument("--slow-factor", type=float, default=4.0)
    ap.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (default H; DiLoCo: every outer step)")
    ap.add_argument("--seed", type=int, default=1, help="the data streams' seed")
    ap.add_argument("--init-seed", type=int, default=0)
    ap.add_argument("--start-at", type=float, default=0, help="a Unix time: the first step waits for it")
    ap.add_argument("--ready-file", default="", help="written once the worker is connected (its daemon joined, or gloo's group)")
    ap.add_argument("--go-file", default="", help="the first step waits until this file exists")
    ap.add_argument("--out", default="", help="the JSON summary")
    ap.add_argument("--progress-file", default="", help="write the steps taken here after each evaluation")
    ap.add_argument("--log", default="warning")
    a = ap.parse_args()
    logging.basicConfig(level=a.log.upper(), format=f"w{a.rank} %(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(1)

    torch.manual_seed(a.init_seed)
    if a.task == "charlm":
        train_text, held_text, vocab, digest = load_corpus(a.corpus)
        model = CharLM(len(vocab), a.d, a.layers, context=a.context)
        data = Windows(train_text, a.context, a.batch, seed=1000 * a.seed + a.rank)
        val = held_out(held_text, a.context)
        loss_fn, evaluate = loss_of, evaluate_loss
    else:
        import tasks  # the MNIST models and shards of the DiLoCo matrix
        data = tasks.MNISTTask(a.task, a.rank, a.world, a.seed)
        data.batch = a.batch
        model, vocab, digest, val = data.model(), [], "", None
        loss_fn = data.loss

        def evaluate(m, _):
            return data.evaluate(m)[0]
    n_params = sum(p.numel() for p in model.parameters())
    inner = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: min(1.0, (s + 1) / max(1, a.warmup)))
    eval_every = a.eval_every or a.H

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    net_pid, opt, daemon_opt = None, inner, None
    if a.system in ("ddp", "allreduce"):
        import torch.distributed as dist
        host, port = a.master.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=600))
        if a.system == "ddp":
            # The causal mask is the only buffer, and constant: no broadcast
            # (which would also make rank 0's evaluations collectives).
            model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        else:
            opt = AllReduceDiLoCo(inner, model, a.H, a.outer_lr, a.outer_momentum, lambda: past_deadline())
        net_pid = "self"
    elif a.system in ("diloco", "psp"):
        import pspnode
        kw = dict(job=a.job, bootstrap=[a.bootstrap] if a.bootstrap else [], listen=[a.listen],
                  daemon_args=["--nat-traversal=false", "--log-level", "warn"] + a.daemon_args.split(),
                  pspnode_bin=a.bin, start_timeout=120)
        if a.system == "diloco":
            opt = daemon_opt = pspnode.DiLoCo(inner, model=model, H=a.H, outer_lr=a.outer_lr,
                                              outer_momentum=a.outer_momentum, merge_wait=a.merge_wait,
                                              compression=a.compression, **kw)
        else:
            opt = daemon_opt = pspnode.Optimizer(inner, model=model, **kw)
        net_pid = daemon_opt.daemon.proc.pid
        if a.addr_file:
            write_file(a.addr_file, [x for x in daemon_opt.daemon.addrs if "/tcp/" in x][0])

    def past_deadline():
        return bool(a.deadline) and time.time() - t0 > a.deadline

    sleep = a.sleep * (a.slow_factor if a.slow else 1.0)
    if a.ready_file:
        open(a.ready_file, "w").close()
    while a.go_file and not os.path.exists(a.go_file) and not stop["now"]:
        time.sleep(0.05)
    if a.start_at:
        time.sleep(max(0.0, a.start_at - time.time()))
    w0 = wchar(net_pid) if net_pid is not None else 0
    t0 = time.time()
    curve, step, evaluating = [], 0, a.system != "ddp" or a.rank == 0

    plain = model.module if a.system == "ddp" else model  # evaluations make no collective call

    def record():
        if evaluating:
            curve.append([round(time.time() - t0, 3), step, evaluate(plain, val)])
        if a.progress_file:
            with open(a.progress_file + ".tmp", "w") as f:
                f.write(f"{step} {getattr(opt, 'outer_step_count', 0)}")
            os.replace(a.progress_file + ".tmp", a.progress_file)

    record()
    gloo = a.system in ("ddp", "allreduce")
    while step < a.steps and not stop["now"] and not (not gloo and past_deadline()):
        x, y = data.next()
        opt.zero_grad()
        loss_fn(model, x, y).backward()
        opt.step()
        sched.step()
        step += 1
        if sleep:
            time.sleep(sleep)
        if a.system in ("diloco", "allreduce"):
            if opt.inner_step_count == 0:  # an outer step: the model holds θ_outer
                record()
                if daemon_opt is not None and curve:
                    daemon_opt.report(curve[-1][2])
        elif step % eval_every == 0:
            record()
        if a.system == "allreduce" and opt.stop:
            break
        if a.system == "ddp" and step % STOP_EVERY == 0:
            # The ranks agree to stop (the deadline), else one would wait
            # in an all-reduce its peers never make.
            vote = torch.tensor([1.0 if past_deadline() else 0.0])
            torch.distributed.all_reduce(vote)
            if vote.item() > 0:
                break
    elapsed = time.time() - t0
    written = (wchar(net_pid) - w0) if net_pid is not None else 0

    final_model = model.module if a.system == "ddp" else model
    if a.system == "diloco":  # θ_outer, not the round's inner-trained parameters
        with torch.no_grad():
            for p, o in zip(final_model.parameters(), daemon_opt.outer_parameters()):
                p.copy_(o)
    elif a.system == "allreduce":
        with torch.no_grad():
            for p, o in zip(final_model.parameters(), opt.outer_params):
                p.copy_(o)
    final = evaluate(final_model, val)
    cpu = time.process_time()
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    daemon_cpu = daemon_peak = 0
    extra = {}
    if daemon_opt is not None:
        daemon_cpu, daemon_peak = proc_usage(net_pid)
        try:
            st = daemon_opt.client.status()
            extra = {"daemon_out_bytes": st.node.out_bytes, "daemon_in_bytes": st.node.in_bytes,
                     "barrier_wait_s": st.node.barrier_wait_s, "models_averaged": st.node.models_averaged,
                     "updates_sent": st.node.updates_sent, "updates_received": st.node.updates_received}
        except Exception as e:  # the summary matters more than these
            log.warning("status: %s", e)
    summary = {"system": a.system, "rank": a.rank, "world": a.world, "slow": a.slow, "steps": step,
               "samples": step * a.batch, "elapsed_s": elapsed, "curve": curve, "final_loss": final,
               "bytes_written": written, "cpu_s": cpu + daemon_cpu, "trainer_cpu_s": cpu, "daemon_cpu_s": daemon_cpu,
               "peak_rss": peak + daemon_peak, "params": n_params, "corpus_sha256": digest, "vocab": len(vocab),
               "outer_steps": getattr(opt, "outer_step_count", 0), "H": a.H,
               "started_from": getattr(daemon_opt, "started_from", ""),
               "merged_total": getattr(daemon_opt, "merged_total", 0), **extra}
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the runner's stop may come while this worker closes
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(summary, f)
        os.replace(a.out + ".tmp", a.out)
    print(f"w{a.rank} {a.system}: {step} steps in {elapsed:.1f} s, final held-out loss {final:.4f}, "
          f"{written / max(1, step * a.batch):.0f} bytes/sample, {n_params} parameters", file=sys.stderr)
    if daemon_opt is not None:
        daemon_opt.close()
    if a.system in ("ddp", "allreduce"):
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
