"""The parameters a pspnode optimizer exchanges, and the checks they pass.

Both `pspnode.Optimizer` (an exchange at every step) and `pspnode.DiLoCo`
(an exchange at every outer step) exchange the parameters the wrapped
optimizer trains, in one order every worker shares: the model's
`named_parameters()` order when a model is given, else the optimizer's
param_groups order. Every exchanged parameter is a dense, contiguous
float32 tensor, all on one device.
"""

import torch

__all__ = []  # internal


def trained(optimizer, model, what="optimizer"):
    """The (name, parameter) pairs optimizer trains, in the shared order.

    Raises ValueError when there are none, or when the optimizer trains a
    parameter the model does not hold; `what` names the optimizer in the
    message ("optimizer", "inner optimizer").
    """
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
    if model is not None:
        named = [(n, p) for n, p in model.named_parameters() if id(p) in in_opt]
        missing = len(in_opt) - len(named)
        if missing:
            raise ValueError(f"the {what} trains {missing} parameter(s) that are not the model's")
    else:
        named, seen = [], set()
        for gi, g in enumerate(optimizer.param_groups):
            for pi, p in enumerate(g["params"]):
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    named.append((f"group{gi}.{pi}", p))
    if not named:
        raise ValueError(f"the {what} trains no parameters (none requires grad)")
    return named


def refuse(name, p, device):
    """Raises if parameter p cannot be exchanged, saying what to do."""
    if p.is_sparse:
        raise TypeError(f"parameter {name!r} is sparse: pspnode exchanges dense vectors")
    if p.dtype != torch.float32:
        raise TypeError(f"parameter {name!r} is {p.dtype}: pspnode exchanges float32; call model.float() before "
                        "building the optimizers (mixed precision: keep float32 weights and use torch.autocast)")
    if p.device != device:
        raise ValueError(f"parameter {name!r} is on {p.device}, others on {device}: keep the exchanged "
                         "parameters on one device")
    if not p.is_contiguous():
        raise ValueError(f"parameter {name!r} is not contiguous (strides {p.stride()}): make it so before "
                         "wrapping, e.g. `with torch.no_grad(): p.data = p.data.contiguous()`")


def checked(optimizer, model, what="optimizer"):
    """trained(), each parameter passed through refuse(); and their device."""
    named = trained(optimizer, model, what)
    device = named[0][1].device
    for name, p in named:
        refuse(name, p, device)
    return named, device


def wraps_inner(name, inner):
    """A class decorator for a torch optimizer that wraps another (its
    `self.inner`): param_groups, state and defaults are the wrapped one's,
    so that LR schedulers, gradient scalers and state dicts see the
    optimizer the user built; add_param_group is refused, naming the class
    (`name`) and what it wraps (`inner`)."""

    def deco(cls):
        for attr in ("param_groups", "state", "defaults"):
            setattr(cls, attr, property(lambda self, a=attr: getattr(self.inner, a),
                                        lambda self, v, a=attr: setattr(self.inner, a, v),
                                        doc=f"The {inner}'s {attr}."))

        def add_param_group(self, param_group):
            raise ValueError(f"{name} exchanges the parameters it was built with, the same on every worker: "
                             f"add the group to the {inner} before wrapping it "
                             f"(inner.add_param_group(...), then {name}(inner, ...))")

        cls.add_param_group = add_param_group
        return cls

    return deco


def nonfinite_grad(named):
    """The name of the first parameter of named whose gradient holds a
    NaN or ±Inf, None when every gradient is finite. One pass: a sum of
    each gradient (NaN and ±Inf carry through a sum, and a single check of
    the sums says whether to look further), as GradScaler checks before it
    lets an optimizer step. A sum that overflows counts as not finite."""
    sums = [p.grad.sum() for _, p in named if p.grad is not None]
    if not sums or bool(torch.isfinite(torch.stack(sums)).all()):
        return None
    for name, p in named:
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return "(a sum of the gradients overflowed)"


class Unpickled:
    """What a pickled pspnode optimizer becomes when it is unpickled: it
    holds a session with a daemon, which no pickle can carry. An optimizer
    is pickled by accident when a scheduler's state_dict() is saved (torch
    1.13's OneCycleLR keeps a method of the scheduler, and with it the
    optimizer); so pickling succeeds, and this stand-in says what happened
    if anything uses it."""

    def __init__(self, what: str, model_name: str, step: int):
        self._what = f"a {what} of model {model_name!r} at step {step}"

    def __getattr__(self, name):
        if name.startswith("__") or name == "_what":
            raise AttributeError(name)
        raise TypeError(f"this stands for {self._what}, which was pickled and cannot be unpickled (it holds a session "
                        "with its daemon): save and load its state_dict() instead, into a new one")

    def __repr__(self):
        return f"<unpickled {self._what}>"
