#!/usr/bin/python3
"""The DiLoCo matrix: pspnode.DiLoCo on every task, inner optimizer, H,
worker count, barrier and exchange, each cell run to its end on loopback
against DiLoCo over a gloo all-reduce with the same outer step.

    make diloco-matrix                       # every cell, seeds 1
    /usr/bin/python3 examples/diloco/matrix.py --tasks cnn --inners sgd \\
        --H 20 --workers 3 --barriers default --exchanges default --seeds 1,2,3
    ... --fragments 1,2,4                     # streaming DiLoCo's fragments, an axis

A cell passes when its final held-out loss (the median over its workers'
θ_outer) is within --loss-tol (2 %) of the all-reduce run's with the same
task, inner optimizer, H, workers and seed, its final accuracy within
--acc-tol (0.5 points) of it, and no worker's held-out accuracy ever falls
more than --drop-tol (0.02) below the best it had reached. The all-reduce
is the reference: a cell of a task it does not train is reported, not
judged. Results go to --out: cells.json (every run) and table.md.
"""

import argparse
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
BARRIERS = {"default": "", "bsp": "--barrier bsp", "pssp:2:4": "--barrier pssp:2:4"}
EXCHANGES = {"default": "", "epidemic:1": "--exchange epidemic:1", "gossip": "--exchange gossip"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cell(c, bin_path, work, timeout=900, dump=False, log=None):
    """Runs one cell (a dict: system, task, inner, H, workers, steps,
    barrier, exchange, seed, diloco_args) to its end: its workers' JSON
    summaries, in rank order. Raises RuntimeError when a worker fails."""
    os.makedirs(work, exist_ok=True)
    n = c["workers"]
    base = [PYTHON, os.path.join(HERE, "worker.py"), "--system", c["system"], "--task", c["task"], "--inner",
            c["inner"], "--H", str(c["H"]), "--steps", str(c["steps"]), "--world", str(n), "--seed", str(c["seed"]),
            "--go-file", os.path.join(work, "go"), "--done-dir", work]
    if c["system"] == "allreduce":
        base += ["--master", f"127.0.0.1:{free_port()}"]
    else:
        args = " ".join(x for x in (BARRIERS[c["barrier"]], EXCHANGES[c["exchange"]], c.get("daemon_args", "")) if x)
        base += ["--bin", bin_path, "--job", f"m{os.getpid()}-{int(time.time() * 1e3) % 10**8}",
                 "--daemon-args", args, "--diloco-args", json.dumps(c.get("diloco_args", {}))]
    if c.get("sleep"):
        base += ["--sleep", str(c["sleep"])]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    procs, logs = [], []
    addr_file = os.path.join(work, "addr")

    def start(rank, extra):
        lf = open(os.path.join(work, f"w{rank}.log"), "w")
        logs.append(lf)
        cmd = base + ["--rank", str(rank), "--out", os.path.join(work, f"w{rank}.json"),
                      "--ready-file", os.path.join(work, f"w{rank}.ready")] + extra
        if dump:
            cmd += ["--dump", os.path.join(work, f"w{rank}.npz")]
        procs.append(subprocess.Popen(["nice", "-n", "10"] + cmd, stdout=lf, stderr=subprocess.STDOUT, env=env))

    deadline = time.time() + timeout
    try:
        if c["system"] == "allreduce":
            for r in range(n):
                start(r, [])
        else:
            start(0, ["--addr-file", addr_file])
            while not os.path.exists(addr_file):
                _check(procs, work, deadline)
                time.sleep(0.05)
            boot = open(addr_file).read().strip()
            for r in range(1, n):
                start(r, ["--bootstrap", boot])
        while not all(os.path.exists(os.path.join(work, f"w{r}.ready")) for r in range(n)):
            _check(procs, work, deadline)
            time.sleep(0.05)
        open(os.path.join(work, "go"), "w").close()
        while any(p.poll() is None for p in procs):
            _check(procs, work, deadline)
            time.sleep(0.1)
        _check(procs, work, deadline)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for lf in logs:
            lf.close()
    return [json.load(open(os.path.join(work, f"w{r}.json"))) for r in range(n)]


def _check(procs, work, deadline):
    for r, p in enumerate(procs):
        if p.poll() not in (None, 0):
            tail = open(os.path.join(work, f"w{r}.log")).read()[-3000:]
            raise RuntimeError(f"worker {r} exited with {p.returncode}:\n{tail}")
    if time.time() > deadline:
        raise RuntimeError("the cell took longer than its timeout")


def judge(runs, ref, loss_tol, acc_tol, drop_tol, window=3):
    """The cell's figures and verdict against the all-reduce reference
    (runs and ref: the workers' summaries). Final loss and accuracy: each
    worker's mean over its last `window` outer steps' evaluations (one
    evaluation moves by about half a point of accuracy from one outer
    step to the next, all-reduce too), the median over the workers."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    tail = lambda r, i: sum(p[i] for p in r["curve"][-window:]) / len(r["curve"][-window:])  # noqa: E731
    loss, acc = med([tail(r, 2) for r in runs]), med([tail(r, 3) for r in runs])
    out = {"final_loss": loss, "final_acc": acc, "max_drop": max_drop(runs),
           "last_loss": med([r["final_loss"] for r in runs]), "last_acc": med([r["final_acc"] for r in runs]),
           "cpu_s": sum(r["cpu_s"] for r in runs), "peak_rss": max(r["peak_rss"] for r in runs),
           "bytes_per_sample": sum(r["bytes_written"] for r in runs) / max(1, sum(r["samples"] for r in runs)),
           "bytes_per_outer": sum(r["bytes_written"] for r in runs) / max(1, sum(r.get("outer_steps", 0) for r in runs)),
           "model_bytes_per_outer": sum(r.get("exchange_sent_bytes", 0) for r in runs)
           / max(1, sum(r.get("outer_steps", 0) for r in runs)),
           "peak_Bps_100ms": max(r.get("peak_Bps_100ms", 0) for r in runs),
           "peak_Bps_1s": max(r.get("peak_Bps_1s", 0) for r in runs),
           "merged": sum(r.get("merged_total", 0) for r in runs)}
    if ref is not None:
        rl, ra = med([tail(r, 2) for r in ref]), med([tail(r, 3) for r in ref])
        rd = max_drop(ref)
        out.update(ref_loss=rl, ref_acc=ra, ref_drop=rd, loss_rel=loss / rl - 1, acc_diff=acc - ra)
        why = []
        if loss > rl * (1 + loss_tol):
            why.append("loss")
        if acc < ra - acc_tol:
            why.append("acc")
        if out["max_drop"] > drop_tol:
            why.append("drop" if rd <= drop_tol else "drop(ref too)")
        out["fails"] = why
        out["pass"] = not why
    return out


def max_drop(runs):
    """The most any worker's held-out accuracy fell below the best it had
    reached."""
    drop = 0.0
    for r in runs:
        best = 0.0
        for p in r["curve"]:
            best = max(best, p[3])
            drop = max(drop, best - p[3])
    return drop


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "bin", "pspnode"))
    ap.add_argument("--out", default=os.path.join(REPO, "results", "diloco-matrix"))
    ap.add_argument("--tasks", default="cnn,mlp,charlm")
    ap.add_argument("--inners", default="sgd,adamw")
    ap.add_argument("--H", default="20,100")
    ap.add_argument("--workers", default="3,6")
    ap.add_argument("--barriers", default="default,bsp,pssp:2:4")
    ap.add_argument("--exchanges", default="epidemic:1,default,gossip")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--fragments", default="1", help="pspnode.DiLoCo's fragments (streaming DiLoCo), e.g. 1,2,4")
    ap.add_argument("--rounds", type=int, default=20, help="outer steps a run takes (its inner steps: rounds × H)")
    ap.add_argument("--diloco-args", default="{}", help="pspnode.DiLoCo keyword arguments, as JSON")
    ap.add_argument("--loss-tol", type=float, default=0.02)
    ap.add_argument("--acc-tol", type=float, default=0.005)
    ap.add_argument("--drop-tol", type=float, default=0.02)
    ap.add_argument("--window", type=int, default=3, help="final figures: the mean of the last WINDOW evaluations")
    ap.add_argument("--dump", action="store_true", help="keep θ_outer and θ_i of every outer step (worker .npz)")
    ap.add_argument("--resume", action="store_true", help="reuse the cells already in --out/cells.json")
    ap.add_argument("--table-only", action="store_true",
                    help="judge every cell of --out/cells.json against its reference and write table.md; run nothing")
    a = ap.parse_args()
    if a.table_only:
        cells = json.load(open(os.path.join(a.out, "cells.json")))
        rejudge(cells, a)
        write_table(cells, os.path.join(a.out, "table.md"))
        return
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "cells.json")
    done = json.load(open(path)) if a.resume and os.path.exists(path) else []
    # (what a run adds to its cell, wall_s and load too, is not the cell's key: --resume finds it)
    key = lambda c: json.dumps({k: c[k] for k in sorted(c) if k not in ("result", "runs", "wall_s", "load")})  # noqa: E731
    have = {key(c): c for c in done}
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    # (tasks.py's TASKS; importing it would import torch here)
    for flag, given, allowed in (("--tasks", a.tasks, ("cnn", "mlp", "charlm")), ("--inners", a.inners, ("sgd", "adamw"))):
        bad = [x for x in split(given) if x not in allowed]
        if bad:
            ap.error(f"{flag}: {', '.join(bad)} not one of {', '.join(allowed)}")
    work_root = tempfile.mkdtemp(prefix="diloco-matrix-")
    extra = json.loads(a.diloco_args)
    t_start, failed = time.time(), 0
    try:
        for task, inner, h, n, seed in itertools.product(split(a.tasks), split(a.inners), map(int, split(a.H)),
                                                         map(int, split(a.workers)), map(int, split(a.seeds))):
            common = {"task": task, "inner": inner, "H": h, "workers": n, "seed": seed, "steps": a.rounds * h}
            ref_cell = dict(common, system="allreduce", barrier="", exchange="", diloco_args={})
            cells = [ref_cell] + [dict(common, system="diloco", barrier=b, exchange=e,
                                       diloco_args=dict(extra, fragments=f) if f > 1 else extra)
                                  for b in split(a.barriers) for e in split(a.exchanges)
                                  for f in map(int, split(a.fragments))]
            ref = None
            for c in cells:
                k = key(c)
                if k in have:
                    runs = have[k]["runs"]
                else:
                    work = os.path.join(work_root, f"c{len(done)}")
                    t = time.time()
                    try:
                        runs = run_cell(c, a.bin, work, dump=a.dump)
                    except RuntimeError as e:
                        print(f"FAILED {k}: {e}", file=sys.stderr)
                        failed += 1
                        continue
                    if a.dump:
                        dd = os.path.join(a.out, "dumps", f"c{len(done)}")
                        os.makedirs(dd, exist_ok=True)
                        for f in os.listdir(work):
                            if f.endswith(".npz"):
                                shutil.copy(os.path.join(work, f), dd)
                    c["wall_s"] = round(time.time() - t, 1)
                    c["runs"] = runs
                    c["load"] = os.getloadavg()[0]
                    done.append(c)
                    have[k] = c
                    json.dump(done, open(path + ".tmp", "w"))
                    os.replace(path + ".tmp", path)
                if c["system"] == "allreduce":
                    ref = runs
                res = judge(runs, None if c["system"] == "allreduce" else ref, a.loss_tol, a.acc_tol, a.drop_tol,
                            a.window)
                have[k]["result"] = res
                name = "all-reduce" if c["system"] == "allreduce" else f"{c['barrier']}/{c['exchange']}"
                if c["diloco_args"].get("fragments", 1) > 1:
                    name += f"/F{c['diloco_args']['fragments']}"
                verdict = {True: "ok", False: "FAIL " + ",".join(res.get("fails", [])), None: "ref"}[res.get("pass")]
                vs = "" if "loss_rel" not in res else f"Δloss {res['loss_rel']:+.1%} Δacc {res['acc_diff']:+.3f} "
                print(f"{task} {inner} H={h} N={n} seed={seed} {name:22s} loss {res['final_loss']:.4f} "
                      f"acc {res['final_acc']:.4f} drop {res['max_drop']:.3f} {vs}{verdict} "
                      f"({c.get('wall_s', 0):.0f} s)", flush=True)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    json.dump(done, open(path, "w"))
    write_table(done, os.path.join(a.out, "table.md"))
    print(f"{len(done)} cells in {time.time() - t_start:.0f} s; {failed} failed to run", file=sys.stderr)


def rejudge(cells, a):
    """Judges every cell against the all-reduce run of its task, inner
    optimizer, H, workers and seed."""
    same = lambda c: (c["task"], c["inner"], c["H"], c["workers"], c["seed"])  # noqa: E731
    refs = {same(c): c["runs"] for c in cells if c["system"] == "allreduce"}
    for c in cells:
        ref = None if c["system"] == "allreduce" else refs.get(same(c))
        if c["system"] != "allreduce" and ref is None:
            c.pop("result", None)
            continue
        c["result"] = judge(c["runs"], ref, a.loss_tol, a.acc_tol, a.drop_tol, a.window)


def write_table(cells, path):
    """The judged cells as a markdown table."""
    rows = ["| task | inner | H | N | seed | barrier/exchange | compression | F | loss (ref) | Δloss | acc (ref) | Δacc "
            "| max drop (ref) | verdict | B/sample | B/outer step (models) | peak B/s (0.1 s, 1 s) | CPU s | peak RSS MB |",
            "|" + "---|" * 19]
    for c in cells:
        r = c.get("result")
        if r is None or c["system"] == "allreduce":
            continue
        verdict = "ok" if r["pass"] else "FAIL " + ",".join(r["fails"])
        rows.append(f"| {c['task']} | {c['inner']} | {c['H']} | {c['workers']} | {c['seed']} | "
                    f"{c['barrier']}/{c['exchange']} | {c['runs'][0].get('compression', 'none')} | "
                    f"{c['runs'][0].get('fragments', 1)} | "
                    f"{r['final_loss']:.4f} ({r['ref_loss']:.4f}) | "
                    f"{r['loss_rel']:+.1%} | {r['final_acc']:.4f} ({r['ref_acc']:.4f}) | {r['acc_diff']:+.4f} | "
                    f"{r['max_drop']:.3f} ({r['ref_drop']:.3f}) | {verdict} | {r['bytes_per_sample']:.0f} | "
                    f"{r.get('bytes_per_outer', 0):.0f} ({r.get('model_bytes_per_outer', 0):.0f}) | "
                    f"{r.get('peak_Bps_100ms', 0):.3g}, {r.get('peak_Bps_1s', 0):.3g} | "
                    f"{r['cpu_s']:.0f} | {r['peak_rss'] / 2**20:.0f} |")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
