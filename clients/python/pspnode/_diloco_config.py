"""pspnode.DiLoCo's configuration: what every worker of a job must share
(the model ID covers it) and how the daemon's --exchange sends the models.
"""

import torch

__all__ = []  # internal

# Constructor arguments of torch optimizers that choose an implementation,
# not the mathematics: not part of the configuration workers must share.
_IMPLEMENTATION = {"foreach", "fused", "capturable", "differentiable"}


# How the epidemic exchange sends the models (the daemon's --exchange
# epidemic:S:ENCODING): float32, bfloat16, or int8 with a float32 scale
# per 256 values; the sender feeds each round's rounding error into the
# next round's model.
COMPRESSIONS = ("none", "bf16", "int8")


def _exchange_at(args):
    """Where a daemon's arguments give --exchange: (index, prefix, spec),
    the argument at index being prefix + spec; None when they do not."""
    for i, a in enumerate(args):
        for flag in ("--exchange", "-exchange"):
            if a == flag and i + 1 < len(args):
                return i + 1, "", args[i + 1]
            if a.startswith(flag + "="):
                return i, flag + "=", a.split("=", 1)[1]
    return None


def _with_compression(args: list, compression: str) -> list:
    """The daemon's arguments with the exchange that sends models in
    compression: its --exchange epidemic:S gets the encoding, and without
    one the default exchange (epidemic:4) is named with it."""
    if compression == "none":
        return args
    at = _exchange_at(args)
    if at is None:
        return args + ["--exchange", f"epidemic:4:{compression}"]
    i, prefix, spec = at
    if spec.startswith("epidemic:") and spec.count(":") == 1:
        args[i] = f"{prefix}{spec}:{compression}"
    return args


def _encoding_of(exchange: str) -> str:
    """How an exchange ("epidemic:4:int8", "gossip") sends the models."""
    parts = exchange.split(":")
    return parts[2] if exchange.startswith("epidemic:") and len(parts) > 2 else "none"


def _default_compression(args) -> str:
    """compression=None for a daemon of the optimizer's own: int8 under
    the epidemic exchange (measured: the matrix's cells ended as they do
    in float32, at a quarter of the model's bytes), the daemon's own
    encoding when its --exchange names one, none under gossip."""
    at = _exchange_at(list(args))
    if at is None:
        return "int8"
    spec = at[2]
    if not spec.startswith("epidemic:"):
        return "none"
    return _encoding_of(spec) if spec.count(":") > 1 else "int8"



def describe_optimizer(opt: torch.optim.Optimizer) -> str:
    """An optimizer's class and constructor hyperparameters, as workers of
    one job must share them: "AdamW(amsgrad=False, betas=(0.9, 0.95), ...)"
    (flags that choose an implementation, such as foreach, are left out).
    Schedulers change param_groups, not these."""
    parts = []
    for k in sorted(opt.defaults):
        v = opt.defaults[k]
        if k in _IMPLEMENTATION or k == "params":
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, (bool, int, float, str)) or v is None:
            parts.append(f"{k}={v!r}")
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float)) for x in v):
            parts.append(f"{k}={tuple(v)!r}")
    return f"{type(opt).__name__}({', '.join(parts)})"
