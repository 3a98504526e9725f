"""pspnode.DiLoCo's outer state on the wire: θ_outer and the outer
optimizer's state as bytes a joining peer's daemon fetches (the trainer
API's TrainerState of kind STATE_KIND), and their checks on the way in.
No pickle: the bytes go to other machines.
"""

import json
import math
import struct

import numpy as np
import torch

__all__ = []  # internal

STATE_KIND = "pspnode.DiLoCo/1"
_MAGIC = b"PSPD"
_MAX_HEADER = 4 << 20
# How far (relative to the job's parameters' norm) a peer's θ_outer may be
# from the parameters the job's peers serve: a round's outer step moves
# them a few percent; a state of another job, or a forged one, is far.
_STATE_PARAMS_TOL = 0.5


class _StateView:
    """The bytes of a DiLoCo state (a header, then tensors as float32
    little-endian), given a range at a time from the tensors where they
    lie: len() and slicing, as bytes have."""

    def __init__(self, head: bytes, vecs):
        self.head = head
        self.vecs = [v.detach().float().cpu() for v in vecs]  # views when already float32 on the CPU
        self.size = len(head) + 4 * sum(v.numel() for v in self.vecs)

    def __len__(self):
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        lo, hi, _ = s.indices(self.size)
        out, at = [], 0
        for seg in [self.head] + self.vecs:
            n = len(seg) if isinstance(seg, bytes) else 4 * seg.numel()
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                if isinstance(seg, bytes):
                    out.append(seg[a - at:b - at])
                else:  # whole values of the tensor, then the bytes asked for
                    i, j = (a - at) // 4, (b - at + 3) // 4
                    raw = seg[i:j].numpy().astype("<f4", copy=False).tobytes()
                    out.append(raw[a - at - 4 * i:b - at - 4 * i])
            at += n
        return b"".join(out)


def wire_view(opt) -> "_StateView":
    """θ_outer and the outer optimizer's state, as wire_state lays
    them out, viewed in place."""
    tensors, scalars, vecs = [], [], [o.detach().reshape(-1) for o in opt.outer_params]
    base = 0  # the outer optimizers' parameters, numbered across them (one per fragment)
    for outer in opt.outers:
        sd = outer.opt.state_dict()["state"]
        for idx in sorted(sd):
            for key in sorted(sd[idx]):
                v = sd[idx][key]
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    tensors.append([base + int(idx), key, list(v.shape)])
                    vecs.append(v.detach().reshape(-1))
                elif isinstance(v, torch.Tensor):
                    scalars.append([base + int(idx), key, float(v.item()), True])
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    scalars.append([base + int(idx), key, float(v), False])
        base += len(outer.params)
    header = json.dumps({"config": opt.config, "outer_step": opt.outer_step_count, "n": opt.num_params,
                         "tensors": tensors, "scalars": scalars}).encode()
    return _StateView(_MAGIC + struct.pack("<I", len(header)) + header, vecs)


def load_wire_state(opt, data: bytes, job_params=None):
    """Takes θ_outer and the outer state from a peer's bytes
    (wire_state), checking everything; ValueError if unusable, with
    nothing changed. One peer's state is checked against what the
    job's other peers say: every value within the job's MaxAbsValue,
    and θ_outer within _STATE_PARAMS_TOL (relative) of job_params,
    the parameters the daemon fetched from the job's peers (a peer's
    model protocol serves its θ_outer)."""
    if len(data) < 8 or data[:4] != _MAGIC:
        raise ValueError("not a pspnode.DiLoCo state")
    (hl,) = struct.unpack("<I", data[4:8])
    if hl > _MAX_HEADER or 8 + hl > len(data):
        raise ValueError(f"a header of {hl} bytes")
    try:
        h = json.loads(data[8:8 + hl])
        config, n, tensors, scalars = h["config"], h["n"], h["tensors"], h["scalars"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"a bad header: {e}") from None
    if config != opt.config:
        raise ValueError(f"the peer's configuration is {config!r}, this worker's {opt.config!r}")
    if n != opt.num_params or not isinstance(tensors, list) or not isinstance(scalars, list):
        raise ValueError(f"{n} parameters, this model has {opt.num_params}")
    shapes, total = [], opt.num_params
    for t in tensors:
        if (not isinstance(t, list) or len(t) != 3 or not isinstance(t[0], int) or not isinstance(t[1], str)
                or not 0 <= t[0] < sum(len(o.params) for o in opt.outers) or not isinstance(t[2], list)
                or not all(isinstance(d, int) and d >= 0 for d in t[2])):
            raise ValueError(f"a bad tensor entry {t!r}")
        k = int(np.prod(t[2], dtype=np.int64)) if t[2] else 1
        shapes.append(k)
        total += k
    body = memoryview(data)[8 + hl:]
    if len(body) != 4 * total:
        raise ValueError(f"{len(body)} bytes of values, the header says {4 * total}")
    vals = np.frombuffer(body, dtype="<f4")
    if not np.isfinite(vals).all():
        raise ValueError("values that are not finite")
    big = float(np.abs(vals).max()) if len(vals) else 0.0
    if big > opt.max_abs:
        raise ValueError(f"a value of magnitude {big:.3g}, beyond the job's limit {opt.max_abs:.3g}")
    if job_params is not None:
        theta = vals[:opt.num_params].astype(np.float64)
        ref = np.asarray(job_params, dtype=np.float64).reshape(-1)
        dist, norm = float(np.linalg.norm(theta - ref)), float(np.linalg.norm(ref))
        if len(ref) != opt.num_params or dist > _STATE_PARAMS_TOL * norm + 1e-3 * math.sqrt(opt.num_params):
            raise ValueError(f"outer parameters {dist:.3g} from the job's parameters (of norm {norm:.3g}): "
                             "not the job's")
    flat = torch.from_numpy(vals.copy())
    state = {}
    off = opt.num_params
    for (idx, key, shape), k in zip(tensors, shapes):
        state.setdefault(idx, {})[key] = flat[off:off + k].view(shape).to(opt._device)
        off += k
    for s in scalars:
        if (not isinstance(s, list) or len(s) != 4 or not isinstance(s[0], int) or not isinstance(s[1], str)
                or not 0 <= s[0] < sum(len(o.params) for o in opt.outers) or not isinstance(s[2], (int, float))
                or not math.isfinite(s[2])):
            raise ValueError(f"a bad scalar entry {s!r}")
        state.setdefault(s[0], {})[s[1]] = torch.tensor(float(s[2])) if s[3] else s[2]
    base = 0
    for outer in opt.outers:
        sd = outer.opt.state_dict()
        sd["state"] = {i - base: v for i, v in state.items() if base <= i < base + len(outer.params)}
        outer.opt.load_state_dict(sd)  # checks the groups; casts to the parameters' device
        base += len(outer.params)
    opt._assign(flat[:opt.num_params], opt.outer_params)


def wire_state(opt) -> bytes:
    """θ_outer and the outer optimizer's state as bytes: "PSPD", the
    header's length (uint32 LE), a JSON header, then float32 LE values
    (θ_outer, then each tensor of the outer state the header names)."""
    v = wire_view(opt)
    return v[0:len(v)]
