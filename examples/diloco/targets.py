#!/usr/bin/python3
"""The targets of DiLoCo under pspnode, judged on the runs of
examples/diloco (its runs.json): for each tier, slow setting and system,
the medians over seeds and the per-seed ranges of time to the target,
bytes per trained sample, final loss, CPU seconds, peak memory and load,
and the ratios against the targets paired by seed:

  bytes   DDP's bytes per trained sample ÷ this system's (want ≥ 400), and
          its final loss against DDP's (want ≤ +2 %), with none slow;
  time    time to the target ÷ DDP's, none slow (want ≤ 0.3);
  slow    time to the target ÷ the all-reduce DiLoCo's, one worker slowed
          (want ≤ 0.5).

With one slow worker there is no DDP run: its losses are set against
DDP's with none slow of the same seed.

    /usr/bin/python3 examples/diloco/targets.py results/targets/runs.json

It also splits the daemons' bytes: the models the exchange sent (their
count × the encoded model) and the rest (barrier, membership, the DHT,
GossipSub, framing), per trained sample.
"""

import json
import statistics
import sys

PARAMS = 32086  # examples/diloco/charlm.py, d 32, 2 layers, context 32: runs that do not record theirs


def model_bytes(system, params):
    """The encoded size of one model the epidemic exchange sends."""
    if "int8" in system:
        return params + 4 * -(-params // 256)
    if "int4" in system:
        full, rest = divmod(params, 256)
        return full * (4 + 128) + (4 + (rest + 1) // 2 if rest else 0)
    if "bf16" in system:
        return 2 * params
    return 4 * params


def rng(v, fmt):
    v = sorted(x for x in v if x is not None)
    if not v:
        return "—"
    med = statistics.median(v)
    if len(v) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(v[0])}–{fmt.format(v[-1])})"


def main():
    runs = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "results/diloco/runs.json"))
    by = {(r["tier"], r["slow_workers"], r["system"], r["seed"]): r for r in runs}
    tiers = sorted({r["tier"] for r in runs}, key=lambda t: ["continent", "consumer"].index(t) if t in ("continent", "consumer") else 9)
    order = ["diloco/pssp:2:4/epidemic:3:int8", "diloco/pssp:2:4/epidemic:1:int8", "allreduce", "ddp"]
    # Systems with their own worker flags (SYSTEM@FLAGS) after their plain form.
    def rank(s):
        base = s.split("@")[0]
        return (order.index(base) if base in order else len(order), s)

    systems = sorted({r["system"] for r in runs}, key=rank)
    for tier in tiers:
        print(f"\n{tier}\n")
        print("| slow | system | seeds | time to the target | vs DDP (none slow) | vs all-reduce | bytes per trained sample "
              "| DDP's ÷ this | final loss | vs DDP's | on the wire per sample | DDP's ÷ this on the wire "
              "| daemons: models / rest per sample "
              "| CPU-s a run | peak RSS a worker | load |")
        print("|---" * 16 + "|")
        for slow in (0, 1):
            for sys_ in systems:
                rs = [by[k] for k in sorted(by) if k[:3] == (tier, slow, sys_)]
                if not rs:
                    continue
                seeds = [r["seed"] for r in rs]
                ddp = {s: by.get((tier, 0, "ddp", s)) for s in seeds}
                ar = {s: by.get((tier, slow, "allreduce", s)) for s in seeds}
                t = [r["time_to_target_s"] for r in rs]
                vs_ddp = [r["time_to_target_s"] / ddp[r["seed"]]["time_to_target_s"]
                          for r in rs if ddp[r["seed"]] and r["time_to_target_s"] and ddp[r["seed"]]["time_to_target_s"]
                          and sys_ != "ddp"]
                vs_ar = [r["time_to_target_s"] / ar[r["seed"]]["time_to_target_s"]
                         for r in rs if ar[r["seed"]] and r["time_to_target_s"] and ar[r["seed"]]["time_to_target_s"]
                         and sys_ != "allreduce"]
                bps = [r["bytes_per_sample"] for r in rs]
                fewer = [ddp[r["seed"]]["bytes_per_sample"] / r["bytes_per_sample"]
                         for r in rs if ddp[r["seed"]] and sys_ != "ddp"]
                fl = [r["final_loss"] for r in rs]
                dfl = [100 * (r["final_loss"] / ddp[r["seed"]]["final_loss"] - 1)
                       for r in rs if ddp[r["seed"]] and sys_ != "ddp"]
                wire = [r["wire_bytes"] / r["samples"] for r in rs if r["wire_bytes"] >= 0]
                fewer_wire = [ddp[r["seed"]]["wire_bytes"] / ddp[r["seed"]]["samples"] / (r["wire_bytes"] / r["samples"])
                              for r in rs if ddp[r["seed"]] and sys_ != "ddp" and r["wire_bytes"] > 0
                              and ddp[r["seed"]]["wire_bytes"] > 0]
                split = "—"
                sp = [(r["models_sent"] * model_bytes(sys_, r.get("params") or PARAMS) / r["samples"],
                       (r["daemon_out_bytes"] - r["models_sent"] * model_bytes(sys_, r.get("params") or PARAMS))
                       / r["samples"])
                      for r in rs if r.get("models_sent")]
                if sp:
                    split = f"{rng([m for m, _ in sp], '{:.1f}')} / {rng([o for _, o in sp], '{:.1f}')} B"
                print(f"| {slow} | {sys_} | {','.join(map(str, seeds))} | {rng(t, '{:.0f}')} s | "
                      f"{rng(vs_ddp, '{:.2f}')}× | {rng(vs_ar, '{:.2f}')}× | {rng(bps, '{:.0f}')} B | "
                      f"{rng(fewer, '{:.0f}')}× | {rng(fl, '{:.3f}')} | {rng(dfl, '{:+.1f}')} % | "
                      f"{rng(wire, '{:.1f}')} B | {rng(fewer_wire, '{:.0f}')}× | {split} | {rng([r['cpu_s'] for r in rs], '{:.0f}')} | "
                      f"{rng([r['peak_rss_bytes_per_worker'] / 1e6 for r in rs], '{:.0f}')} MB | "
                      f"{rng([r['load_average'] for r in rs], '{:.1f}')} |")
        print()
        for slow in (0, 1):
            for sys_ in systems:
                rs = [by[k] for k in sorted(by) if k[:3] == (tier, slow, sys_)]
                if rs:
                    print(f"{tier} slow {slow} {sys_}: steps at target "
                          f"{[r['step_at_target'] for r in rs]}, duration {[round(r['duration_s']) for r in rs]} s, "
                          f"steps {[r['steps'] for r in rs]}, merged {[r['merged'] for r in rs]}")


if __name__ == "__main__":
    main()
