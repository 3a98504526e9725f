"""pspnode.DiLoCo's outer optimizers and the fragments they step.

θ_outer is one flat float32 vector; ``DiLoCo.outer_parameters()`` are
per-parameter views of it. With one fragment (the default) a single outer
optimizer steps those views, one tensor per parameter, as DiLoCo does.
Cut into F fragments (streaming DiLoCo), fragment f is the values
[f·N/F, (f+1)·N/F) of the flat vector, the same cut the daemon's
exchange makes (internal/wire's Layout), and each fragment has an outer
optimizer of its own, over one tensor (a view of its slice): its momentum
and state are the fragment's. Elementwise optimizers (SGD with Nesterov
momentum, Adam) step a slice as they step the parameters it cuts through;
one that reads a tensor's norm (LARS, LAMB) would see the slice's.
"""

import copy

import torch

__all__ = []  # internal


def fragment_ranges(n: int, fragments: int):
    """The values [lo, hi) of each of the fragments of a vector of n."""
    return [(f * n // fragments, (f + 1) * n // fragments) for f in range(fragments)]


def pieces(sizes, offsets, lo: int, hi: int):
    """The parts of the parameters (sizes and offsets in the flat vector)
    that fall in [lo, hi): (parameter index, start, end) within each
    parameter's flat values, in order."""
    out = []
    for i, (k, o) in enumerate(zip(sizes, offsets)):
        a, b = max(lo, o), min(hi, o + k)
        if a < b:
            out.append((i, a - o, b - o))
    return out


class Outer:
    """One outer optimizer and the part of θ_outer it steps: params (its
    param list; names for messages) covering the values [lo, hi) of the
    flat θ_outer."""

    def __init__(self, opt: torch.optim.Optimizer, params, names, lo: int, hi: int):
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError("outer_optimizer must return a torch.optim.Optimizer over the list it is given")
        self.opt, self.params, self.names, self.lo, self.hi = opt, params, names, lo, hi

    def save(self):
        """Its parameters and state, to put back with load."""
        return [o.clone() for o in self.params], copy.deepcopy(self.opt.state_dict())

    def load(self, saved):
        with torch.no_grad():
            for o, s in zip(self.params, saved[0]):
                o.copy_(s)
        self.opt.load_state_dict(saved[1])

    def step(self, grads):
        """The optimizer's step on grads (its parameters' gradient)."""
        for o, g in zip(self.params, grads):
            o.grad = g
        self.opt.step()
        for o in self.params:
            o.grad = None

    def _group(self, o):
        for g in self.opt.param_groups:
            if any(p is o for p in g["params"]):
                return g
        raise KeyError("an outer parameter in no param group")

    def buffers(self):
        """The outer SGD's momentum buffers before the outer step, one per
        parameter (None: none yet), when the quasi-global momentum applies:
        the outer optimizer is torch.optim.SGD with momentum. Else None."""
        if not isinstance(self.opt, torch.optim.SGD):
            return None
        out = []
        for o in self.params:
            if self._group(o)["momentum"] <= 0:
                return None
            b = self.opt.state.get(o, {}).get("momentum_buffer")
            out.append(None if b is None else b.clone())
        return out

    def quasi_global(self, before, prev):
        """The quasi-global momentum (see pspnode.diloco's comment): each
        outer SGD momentum buffer becomes μ·(its value before this outer
        step) + (1 − μ)·(the move θ_outer made this round, the local step
        and the average, over the outer rate). prev: buffers() before the
        step (None: not applied)."""
        if prev is None:
            return
        for o, b0, p0 in zip(self.params, before, prev):
            g = self._group(o)
            mu, lr = g["momentum"], g["lr"]
            d = (b0 - o).div_(lr)
            self.opt.state[o]["momentum_buffer"] = d.mul_(1 - mu) if p0 is None else d.mul_(1 - mu).add_(p0, alpha=mu)
