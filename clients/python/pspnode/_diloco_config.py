"""pspnode.DiLoCo's configuration: what every worker of a job must share
(the model ID covers it) and how the daemon's --exchange sends the models.
"""

import torch

__all__ = []  # internal

# Constructor arguments of torch optimizers that choose an implementation,
# not the mathematics: not part of the configuration workers must share.
_IMPLEMENTATION = {"foreach", "fused", "capturable", "differentiable"}


# How the epidemic exchange sends the models (the daemon's --exchange
# epidemic:S:ENCODING): float32, bfloat16, or int8 or int4 with a float32
# scale per 256 values; the sender feeds each round's rounding error into
# the next round's model.
COMPRESSIONS = ("none", "bf16", "int8", "int4")


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


def _spec(exchange: str):
    """An exchange spec's parts: (kind, S, encoding, fragments), as the
    daemon's --exchange reads "gossip" or "epidemic:S[:bf16|:int8|:int4][:fragments=F]"
    (S None when it does not say)."""
    if not exchange.startswith("epidemic:"):
        return "gossip", None, "none", 1
    parts = exchange.split(":")[1:]
    s = int(parts[0]) if parts and parts[0].isdigit() else None
    enc, frags = "none", 1
    for p in parts[1:]:
        if p.startswith("fragments="):
            frags = int(p.split("=", 1)[1]) if p.split("=", 1)[1].isdigit() else frags
        elif p:
            enc = p
    return "epidemic", s, enc, frags


def _with_exchange(args: list, compression: str, fragments: int) -> list:
    """The daemon's arguments with the exchange that sends models in
    compression, fragments fragments: its --exchange epidemic:S gets the
    encoding and the fragments it does not name, and without one the
    default exchange (epidemic:4) is named with them."""
    if compression == "none" and fragments <= 1:
        return args
    at = _exchange_at(args)
    if at is None:
        i, prefix, spec = None, "", "epidemic:4"
    else:
        i, prefix, spec = at
    kind, s, enc, frags = _spec(spec)
    if kind != "epidemic":
        return args
    enc = compression if enc == "none" else enc
    frags = fragments if frags <= 1 else frags
    spec = f"epidemic:{s if s is not None else 4}" + ("" if enc == "none" else f":{enc}") + \
        ("" if frags <= 1 else f":fragments={frags}")
    if i is None:
        return args + ["--exchange", spec]
    args[i] = prefix + spec
    return args


def _encoding_of(exchange: str) -> str:
    """How an exchange ("epidemic:4:int8", "gossip") sends the models."""
    return _spec(exchange)[2]


def _fragments_of(exchange: str) -> int:
    """How many fragments an exchange cuts the model into (1: none)."""
    return _spec(exchange)[3]


def _default_compression(args) -> str:
    """compression=None for a daemon of the optimizer's own: int8 under
    the epidemic exchange (measured: the matrix's cells ended as they do
    in float32, at a quarter of the model's bytes), the daemon's own
    encoding when its --exchange names one, none under gossip."""
    at = _exchange_at(list(args))
    if at is None:
        return "int8"
    kind, _, enc, _ = _spec(at[2])
    if kind != "epidemic":
        return "none"
    return "int8" if enc == "none" else enc  # an --exchange that names no encoding


def _default_fragments(args) -> int:
    """fragments=None for a daemon of the optimizer's own: what its
    --exchange names, else 1."""
    at = _exchange_at(list(args))
    return 1 if at is None else _fragments_of(at[2])


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
