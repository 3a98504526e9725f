#!/usr/bin/python3
"""What a step costs a PyTorch trainer beyond its own compute, with pspnode.

Two `pspnode run --trainer` daemons on this machine (pSSP(1, 4)), and two
trainers of a model of --params float32 parameters (a Linear layer): the
measured one and a peer, which step at the same pace, so that every step of
the measured trainer publishes an update and merges one from the peer.
Each step computes a small forward and backward pass and then sleeps
--compute seconds (the rest of its compute: the daemon publishes the last
update meanwhile, on the machine's other core).

The figure is the time pspnode.Optimizer.step() takes beyond the wrapped
optimizer's own step: under the epidemic exchange (the daemon's default),
with shared memory, the daemon's Step call alone (the parameters live in
shared memory: the daemon checks the model, takes it and averages the
peer's into it in place); under gossip also the snapshot of the
parameters, the delta written into shared memory and the merge of the
peer's update. Also reported: the Step call alone, how many steps merged an
update or waited at the barrier, the daemon's CPU per step, and the peak
resident memory of the measured trainer's process and of its daemon. Times
are also given in memory passes: the time of a torch copy_ of the
parameters into a warm buffer, measured in the same process after the
steps (the pass is this machine's floor for touching the model once).

    make build && /usr/bin/python3 examples/torch/bench_bridge.py --bin bin/pspnode
    /usr/bin/python3 examples/torch/bench_bridge.py --bin bin/pspnode --params 10000000 --steps 40 --warmup 5 --compute 0.1
    /usr/bin/python3 examples/torch/bench_bridge.py --bin bin/pspnode --exchange gossip   # every delta to every peer
    /usr/bin/python3 examples/torch/bench_bridge.py --bin bin/pspnode --no-shm   # through the socket
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "clients", "python"))


def start_daemon(binary, tmp, name, boot=None, barrier="pssp:1:4", exchange="epidemic:4"):
    sock = os.path.join(tmp, name + ".sock")
    args = [binary, "run", "--job", "bench-bridge", "--listen", "/ip4/127.0.0.1/tcp/0", "--trainer", "unix:" + sock,
            "--barrier", barrier, "--exchange", exchange, "--nat-traversal=false", "--log-level", "warn"]
    if boot:
        args += ["--bootstrap", boot]
    args += os.environ.get("PSPNODE_BENCH_ARGS", "").split()  # e.g. --http 127.0.0.1:0 --pprof, to profile
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    addr = None
    for line in p.stdout:
        if line.startswith("listening: ") and addr is None:
            addr = line.split(" ", 1)[1].strip()
        if line.startswith("http: "):
            print(f"{name}: {line.strip()}", file=sys.stderr, flush=True)
            break
        if line.startswith("trainer: ") and "--http" not in args:
            break
    return p, addr, "unix:" + sock


def cpu_seconds(pid):
    """user + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid="self"):
    """A process's peak resident set (VmHWM, Linux), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def linear(a):
    """The bench's model: a Linear layer of about --params parameters, and
    its SGD."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(1)
    n_in = 1000
    n_out = max(1, a.params // (n_in + 1))
    model = torch.nn.Linear(n_in, n_out)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), n_in, n_out


def plain(a):
    """The same loop with the plain optimizer alone (no pspnode): its peak
    resident memory is what the model's own training takes."""
    import torch
    model, opt, n_in, n_out = linear(a)
    x, y = torch.randn(8, n_in), torch.randn(8, n_out)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {"plain_peak_rss_mib": peak_rss_mib()}


def trainer(a):
    import torch
    import pspnode
    model, inner, n_in, n_out = linear(a)
    # The process before pspnode: Python, torch, grpc and the model.
    import grpc  # noqa: F401 (its memory counts in the baseline)
    base_rss = peak_rss_mib()
    opt = pspnode.Optimizer(inner, a.daemon, model=model, model_name="bench-linear", shared_memory=not a.no_shm,
                            connect_timeout=60)
    inner_t, rpc_t = [], []
    step0 = inner.step

    def timed_inner(*args, **kw):
        t = time.perf_counter()
        r = step0(*args, **kw)
        inner_t.append(time.perf_counter() - t)
        return r
    inner.step = timed_inner
    rpc0 = opt.client.step
    replies = []

    def timed_rpc(*args, **kw):
        t = time.perf_counter()
        r = rpc0(*args, **kw)
        rpc_t.append(time.perf_counter() - t)
        replies.append(r)
        return r
    opt.client.step = timed_rpc
    x, y = torch.randn(8, n_in), torch.randn(8, n_out)
    over, waited = [], []
    for i in range(a.steps + a.warmup):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        time.sleep(a.compute)
        t = time.perf_counter()
        opt.step()
        total = time.perf_counter() - t
        if i >= a.warmup:
            over.append(total - inner_t[-1])
            waited.append(total - inner_t[-1] - replies[-1].barrier.waited_s)
    peak_rss = peak_rss_mib()  # before the pass's buffer below
    in_region, shared = opt._in_region, opt.client.shared
    opt.close()
    # One memory pass: a copy_ of the parameters into a warm buffer.
    buf = [torch.empty_like(p) for p in model.parameters()]
    passes = []
    for _ in range(21):
        t = time.perf_counter()
        with torch.no_grad():
            for b, p in zip(buf, model.parameters()):
                b.copy_(p)
        passes.append(time.perf_counter() - t)
    pass_s = statistics.median(passes[1:])
    res = {
        "params": opt.num_params, "shared_memory": shared, "params_in_shared_memory": in_region,
        "steps": a.steps, "compute_s": a.compute,
        "overhead_ms": {q: 1e3 * pct(over, p) for q, p in (("p50", .5), ("p90", .9), ("p99", .99))},
        "overhead_beyond_wait_ms": {q: 1e3 * pct(waited, p) for q, p in (("p50", .5), ("p90", .9), ("p99", .99))},
        "step_call_ms": {q: 1e3 * pct(rpc_t[a.warmup:], p) for q, p in (("p50", .5), ("p90", .9), ("p99", .99))},
        "inner_step_ms_p50": 1e3 * statistics.median(inner_t[a.warmup:]),
        "pass_ms": 1e3 * pass_s,
        "merged_share": sum(1 for r in replies[a.warmup:] if r.merged) / max(1, len(replies) - a.warmup),
        "barrier_waited_share": sum(1 for r in replies[a.warmup:] if r.barrier.checks > 1) / max(1, len(replies) - a.warmup),
        "trainer_peak_rss_mib": peak_rss, "trainer_base_rss_mib": base_rss,
        "model_mib": 4 * opt.num_params / 2**20,
    }
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "bin", "pspnode"), help="the pspnode binary")
    ap.add_argument("--params", type=int, default=1_000_000, help="model size (a Linear layer of about this many)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--compute", type=float, default=0.03, help="seconds of compute per step besides the small pass")
    ap.add_argument("--no-shm", action="store_true", help="tensors through the socket")
    ap.add_argument("--barrier", default="pssp:1:4", help="the daemons' barrier (asp: no peer is asked)")
    ap.add_argument("--exchange", default="epidemic:4", help="the daemons' exchange (the daemon's default: epidemic:4)")
    ap.add_argument("--no-peer", action="store_true",
                    help="one trainer and its daemon alone: the bridge's own cost, without a peer's updates to receive")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--daemon", help=argparse.SUPPRESS)  # the trainers' own
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)  # the loop without pspnode
    a = ap.parse_args()
    if a.daemon:
        print(json.dumps(trainer(a)))
        return
    if a.plain:
        print(json.dumps(plain(a)))
        return
    tmp = tempfile.mkdtemp(prefix="pspnode-bench-")
    pa, addr, sa = start_daemon(a.bin, tmp, "a", barrier=a.barrier, exchange=a.exchange)
    daemons = [pa]
    base = [sys.executable, os.path.abspath(__file__), "--params", str(a.params), "--steps", str(a.steps + 40),
            "--warmup", str(a.warmup), "--compute", str(a.compute)] + (["--no-shm"] if a.no_shm else [])
    try:
        peer = None
        if not a.no_peer:
            pb, _, sb = start_daemon(a.bin, tmp, "b", boot=addr, barrier=a.barrier, exchange=a.exchange)
            daemons.append(pb)
            peer = subprocess.Popen(base + ["--daemon", sb], stdout=subprocess.DEVNULL)
        cpu0 = cpu_seconds(pa.pid)
        out = subprocess.run(base[:5] + [str(a.steps)] + base[6:] + ["--daemon", sa], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        pl = subprocess.run(base[:4] + ["--plain"], capture_output=True, text=True, check=True)
        res.update(json.loads(pl.stdout.strip().splitlines()[-1]))
        res["daemon_cpu_ms_per_step"] = 1e3 * (cpu_seconds(pa.pid) - cpu0) / (a.steps + a.warmup)
        res["daemon_peak_rss_mib"] = peak_rss_mib(pa.pid)
        if peer is not None:
            peer.wait(timeout=600)
    finally:
        for p in daemons:
            p.kill()
            p.wait()
    res["barrier"], res["exchange"], res["peer"] = a.barrier, a.exchange, not a.no_peer
    if a.json:
        print(json.dumps(res))
        return
    print(f"{res['params']} float32 parameters, shared memory {'on' if res['shared_memory'] else 'off'}, "
          f"barrier {a.barrier}, exchange {a.exchange}, {'a peer stepping alike' if not a.no_peer else 'no peer'}, "
          f"{res['steps']} steps, {1e3 * res['compute_s']:.0f} ms of compute each")
    o, c, ps = res["overhead_ms"], res["step_call_ms"], res["pass_ms"]
    print(f"  optimizer.step() beyond the wrapped step: p50 {o['p50']:.2f} ms ({o['p50'] / ps:.1f} passes), "
          f"p90 {o['p90']:.2f}, p99 {o['p99']:.2f}")
    w = res["overhead_beyond_wait_ms"]
    print(f"  the same without the barrier's wait:       p50 {w['p50']:.2f} ms ({w['p50'] / ps:.1f} passes), "
          f"p90 {w['p90']:.2f}, p99 {w['p99']:.2f}")
    print(f"  of which the daemon's Step call:           p50 {c['p50']:.2f} ms, p90 {c['p90']:.2f}, p99 {c['p99']:.2f}")
    print(f"  one memory pass (copy_ of the parameters into a warm buffer): {ps:.2f} ms"
          f"{'; the parameters lived in shared memory' if res['params_in_shared_memory'] else ''}")
    print(f"  steps that merged a peer's update: {100 * res['merged_share']:.0f} %; "
          f"that waited at the barrier: {100 * res['barrier_waited_share']:.0f} %")
    print(f"  the measured trainer's daemon: {res['daemon_cpu_ms_per_step']:.1f} CPU-ms per step "
          f"({res['daemon_cpu_ms_per_step'] / ps:.1f} passes), peak RSS {res['daemon_peak_rss_mib']:.0f} MiB "
          f"({res['daemon_peak_rss_mib'] / res['model_mib']:.1f} × the model's {res['model_mib']:.0f} MiB)")
    print(f"  the measured trainer's process: peak RSS {res['trainer_peak_rss_mib']:.0f} MiB "
          f"({res['trainer_base_rss_mib']:.0f} before pspnode, with the model; the same loop without pspnode: "
          f"{res['plain_peak_rss_mib']:.0f}, so pspnode adds {res['trainer_peak_rss_mib'] - res['plain_peak_rss_mib']:.0f} MiB, "
          f"{(res['trainer_peak_rss_mib'] - res['plain_peak_rss_mib']) / res['model_mib']:.2f} × the model)")


if __name__ == "__main__":
    main()
