"""The torch work pspnode.Optimizer adds to a step, two ways: the
parameters as views of one flat vector (the optimizer before version 2:
one copy, one subtraction, one addition over the whole vector), and the
parameters left as the model's own tensors (now: the same three per
parameter, over views made once). The snapshot before the wrapped step,
the delta into the up region, the merge of the peers' vector; the wrapped
step itself is not timed. Runs alternate, three of each; each is the
median of 300 steps; printed: the median of the three.

    /usr/bin/python3 clients/python/benchmarks/wrapper_cost.py
"""
import statistics, time, torch
torch.set_num_threads(1)
def shapes(kind):
    if kind == "linear-1M": return [(1000, 1000), (1000,)]
    # 60 tensors, about 1 M values: conv-like weights and biases
    out = []
    for i in range(30):
        out += [(64, 64, 3, 3) if i % 3 else (32, 32, 3, 3), (64,)]
    return out
def bench(kind, per_param, steps=300):
    ps = [torch.randn(s) for s in shapes(kind)]
    n = sum(p.numel() for p in ps)
    offs = [sum(p.numel() for p in ps[:i]) for i in range(len(ps))]
    old, up, down = torch.empty(n), torch.empty(n), torch.randn(n) * 1e-3
    flat = torch.cat([p.reshape(-1) for p in ps])
    views = lambda t: [t[o:o + p.numel()] for o, p in zip(offs, ps)]
    ts = []
    olds, ups, downs = views(old), views(up), views(down)  # made once
    pf = [p.view(-1) for p in ps]
    for _ in range(steps):
        flat.add_(1e-4)  # the inner step, not timed
        for p in ps: p.add_(1e-4)
        t = time.perf_counter()
        if per_param:
            for p, o in zip(pf, olds): o.copy_(p)
            for p, o, u in zip(pf, olds, ups): torch.sub(p, o, out=u)
            for p, d in zip(pf, downs): p.add_(d)
        else:
            old.copy_(flat)
            torch.sub(flat, old, out=up)
            flat.add_(down)
        ts.append(time.perf_counter() - t)
    return n, statistics.median(ts) * 1e3
for kind in ("linear-1M", "60-tensors"):
    a, b = [], []
    for _ in range(3):
        n, x = bench(kind, False); a.append(x)
        n, y = bench(kind, True); b.append(y)
    print(f"{kind} ({n} values): flat {statistics.median(a):.3f} ms, per-parameter {statistics.median(b):.3f} ms, ratio {statistics.median(b)/statistics.median(a):.2f}")
