#!/usr/bin/python3
"""One worker of a DiLoCo matrix cell (examples/diloco/matrix.py starts
them): a task of tasks.py under pspnode.DiLoCo (its own daemon, on
loopback) or under the same outer step after a gloo all-reduce.

After each outer step it evaluates θ_outer on the task's held-out set and
records (seconds, outer step, loss, accuracy, peers merged, the daemon's
lr_scale); with --dump it also keeps θ_outer and θ_i (the inner-trained
parameters before the exchange) of every outer step, to measure how far
apart the workers' models are. The JSON summary (--out) holds the curve,
the bytes the daemon (or the gloo rank) wrote, CPU seconds and peak RSS.
"""

import argparse
import copy
import datetime
import json
import logging
import os
import resource
import signal
import sys
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))

import charlm  # noqa: E402
import tasks  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", choices=["diloco", "allreduce"], required=True)
    ap.add_argument("--task", choices=tasks.TASKS, default="cnn")
    ap.add_argument("--inner", choices=tasks.INNERS, default="sgd")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--H", type=int, default=20)
    ap.add_argument("--steps", type=int, default=400, help="inner steps")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--diloco-args", default="{}", help="more pspnode.DiLoCo keyword arguments, as JSON")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--job", default="matrix")
    ap.add_argument("--bootstrap", default="")
    ap.add_argument("--daemon-args", default="")
    ap.add_argument("--bin", default="")
    ap.add_argument("--addr-file", default="")
    ap.add_argument("--ready-file", default="")
    ap.add_argument("--go-file", default="")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds each inner step sleeps beside its compute")
    ap.add_argument("--dump", default="", help="an .npz of θ_outer and θ_i at every outer step")
    ap.add_argument("--out", default="")
    ap.add_argument("--done-dir", default="", help="after its steps the worker writes DIR/wRANK.done and (under "
                    "pspnode.DiLoCo) goes on training, unrecorded, until every worker's is there: a worker's last "
                    "rounds merge its peers' models as the others do, not the models of peers already gone")
    ap.add_argument("--log", default="warning")
    a = ap.parse_args()
    logging.basicConfig(level=a.log.upper(), format=f"w{a.rank} %(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    task = tasks.make(a.task, a.rank, a.world, a.seed)
    torch.manual_seed(0)
    model = task.model()
    inner = task.inner(a.inner, model.parameters())
    net_pid, opt, dl = "self", None, None
    if a.system == "allreduce":
        import torch.distributed as dist
        host, port = a.master.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=a.rank, world_size=a.world,
                                timeout=datetime.timedelta(seconds=300))
        opt = charlm.AllReduceDiLoCo(inner, model, a.H, a.outer_lr, a.outer_momentum, lambda: False)
        outer_params = opt.outer_params
    else:
        import pspnode
        kw = json.loads(a.diloco_args)
        if a.bin:
            kw["pspnode_bin"] = a.bin
        http = f"127.0.0.1:{free_port()}"  # its /metrics: what the exchange itself sent
        opt = dl = pspnode.DiLoCo(inner, model=model, H=a.H, outer_lr=a.outer_lr, outer_momentum=a.outer_momentum,
                                  job=a.job, bootstrap=[a.bootstrap] if a.bootstrap else [],
                                  listen=["/ip4/127.0.0.1/tcp/0"], start_timeout=120,
                                  daemon_args=["--nat-traversal=false", "--log-level", "warn", "--http", http]
                                  + a.daemon_args.split(), **kw)
        outer_params = dl.outer_parameters()
        net_pid = dl.daemon.proc.pid
        if a.addr_file:
            charlm.write_file(a.addr_file, [x for x in dl.daemon.addrs if "/127.0.0.1/tcp/" in x][0])
    if a.ready_file:
        open(a.ready_file, "w").close()
    while a.go_file and not os.path.exists(a.go_file) and not stop["now"]:
        time.sleep(0.02)
    frags = dl.fragments if dl is not None else 1
    if a.dump and frags > 1:
        sys.exit("--dump keeps θ_i at the end of each round: not with fragments")
    # With fragments the model is never all θ_outer: it is evaluated on a
    # copy that is (every H inner steps, after the round's last fragment).
    evaluated = model if frags == 1 else copy.deepcopy(model)
    w0 = charlm.wchar(net_pid)
    link = LinkSampler(net_pid)
    t0 = time.time()
    curve, dumps_outer, dumps_inner = [], [], []
    loss0, acc0 = task.evaluate(model)
    curve.append([0.0, 0, loss0, acc0, 0, 1.0])
    if a.dump:
        dumps_outer.append(tasks.flat(outer_params))
    step = 0
    while step < a.steps and not stop["now"]:
        x, y = task.next()
        opt.zero_grad()
        task.loss(model, x, y).backward()
        if a.dump and (opt.inner_step_count + 1) == a.H:
            inner.step()  # the round's last inner step, by hand, so that θ_i can be kept
            dumps_inner.append(tasks.flat(model.parameters()))
            _outer_only(opt)
        else:
            opt.step()
        step += 1
        if a.sleep:
            time.sleep(a.sleep)
        if opt.inner_step_count == 0 and opt.outer_step_count % frags == 0:  # an outer step (of every fragment)
            if frags > 1:
                with torch.no_grad():
                    for p, o in zip(evaluated.parameters(), outer_params):
                        p.copy_(o)
            loss, acc = task.evaluate(evaluated)
            merged = dl.last_merged if dl is not None else a.world - 1
            scale = dl.lr_scale if dl is not None else 1 / a.world
            curve.append([round(time.time() - t0, 3), opt.outer_step_count, loss, acc, merged, scale])
            if dl is not None:
                dl.report(loss, acc)
            if a.dump:
                dumps_outer.append(tasks.flat(outer_params))
    elapsed = time.time() - t0
    written = charlm.wchar(net_pid) - w0
    peaks = link.stop()
    cpu = time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    extra = {}
    if dl is not None:
        dcpu, dpeak = charlm.proc_usage(net_pid)
        cpu, peak = cpu + dcpu, peak + dpeak
        extra = {"merged_total": dl.merged_total, "outer_steps": dl.outer_step_count, "compression": dl.compression,
                 "exchange": dl.exchange, "fragments": dl.fragments,
                 "exchange_sent_bytes": metric(http, "psp_exchange_sent_bytes_total")}
        try:
            st = dl.client.status()
            extra.update(updates_received=st.node.updates_received, models_averaged=st.node.models_averaged)
        except Exception as e:  # the summary matters more
            logging.warning("status: %s", e)
    summary = {"system": a.system, "task": a.task, "inner": a.inner, "rank": a.rank, "world": a.world, "H": a.H,
               "steps": step, "samples": step * task.batch, "elapsed_s": elapsed, "curve": curve,
               "final_loss": curve[-1][2], "final_acc": curve[-1][3], "bytes_written": written, "cpu_s": cpu,
               "peak_rss": peak, "params": sum(p.numel() for p in model.parameters()), **peaks, **extra}
    if a.dump:
        np.savez_compressed(a.dump, outer=np.stack(dumps_outer),
                            inner=np.stack(dumps_inner) if dumps_inner else np.zeros((0, 0), np.float32))
    if a.out:
        charlm.write_file(a.out, json.dumps(summary))
    if a.done_dir:
        open(os.path.join(a.done_dir, f"w{a.rank}.done"), "w").close()
        done = [os.path.join(a.done_dir, f"w{r}.done") for r in range(a.world)]
        while dl is not None and not stop["now"] and not all(os.path.exists(d) for d in done):
            x, y = task.next()
            opt.zero_grad()
            task.loss(model, x, y).backward()
            opt.step()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if dl is not None:
        dl.close()
    else:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(http, name):
    """A counter of the daemon's /metrics (0 when it cannot be read)."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError as e:
        logging.warning("metrics: %s", e)
    return 0.0


class LinkSampler:
    """Samples what a process (the daemon, or this one for gloo) has
    written (/proc/PID/io wchar) every 10 ms, in a thread, until stop():
    then the most it wrote in any 0.1 s and any 1 s window, as bytes per
    second (peak_Bps_100ms, peak_Bps_1s)."""

    def __init__(self, pid, every=0.01):
        self.pid, self.every, self.samples = pid, every, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(self.every):
            self.samples.append((time.monotonic(), charlm.wchar(self.pid)))

    def stop(self):
        self.done.set()
        self.thread.join()
        out = {}
        for name, w in (("peak_Bps_100ms", 0.1), ("peak_Bps_1s", 1.0)):
            best, j = 0, 0
            for t, b in self.samples:
                while self.samples[j][0] < t - w:
                    j += 1
                best = max(best, b - self.samples[j][1])
            out[name] = best / w
        return out


def _outer_only(opt):
    """The outer step of a round whose last inner step was taken by hand:
    the optimizer's step without its inner step."""
    step = opt.inner.step
    opt.inner.step = lambda closure=None: None
    try:
        opt.step()
    finally:
        opt.inner.step = step


if __name__ == "__main__":
    main()
