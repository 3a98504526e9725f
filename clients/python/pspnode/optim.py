"""pspnode.Optimizer: a torch.optim optimizer that trains with a pspnode job.

Wrap the optimizer of a single-process PyTorch loop and it becomes a worker
of a decentralised job:

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = pspnode.Optimizer(opt, "unix:/tmp/pspnode.sock", model=model)  # +1 line
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()      # local step, publish, barrier, merge the peers' updates

``step()`` runs the wrapped optimizer's step, hands the change it made to
the daemon (which publishes it to every peer under the gossip exchange, or
sends the model to a few sampled peers under epidemic), waits at the
barrier for the next step, and adds what the peers sent. A worker that
joins a running job starts from the job's parameters and step, fetched by
its daemon before its first step.

The parameters exchanged are those the optimizer trains (requires_grad),
all float32, in the order of ``model.named_parameters()`` (which is
state_dict order) when ``model`` is given, else in the optimizer's
param_groups order. Buffers (BatchNorm statistics) are not exchanged.
Every worker of a job must build the same model and start from the same
parameters, as DDP does by broadcasting rank 0's: seed the initialisation
alike (torch.manual_seed) or load the same weights. A worker that joins a
job already under way gets the job's parameters whatever its own.
"""

import logging
import threading
import warnings
from typing import Optional

import numpy as np
import torch

from .client import BadUpdate, Client, SessionLost, model_id_of
from pspnode.trainer.v1 import trainer_pb2 as pb

log = logging.getLogger("pspnode")


class Optimizer:
    """Wraps ``optimizer`` (any torch.optim.Optimizer) for a pspnode job.

    daemon: the daemon's trainer address, "unix:PATH" or "tcp:127.0.0.1:PORT".
    model: the module, for the parameter order and names (recommended).
    model_name: the model's name (default: the module's class name).
    model_id: the job's model ID (default: derived from the name and the
    parameter names and shapes, alike on every worker).
    start_step: the steps the parameters have taken (a resumed model).
    scale_updates: scale each step's change by the daemon's lr_scale
    (1/N under gossip, so that N workers' updates add up to one step of
    the mean gradient, as DDP's averaged gradients do; 1 under epidemic).
    reconnect: when the daemon goes away, connect again at the next step
    (True) or raise SessionLost (False).
    checkpoint_every: write the parameters to the daemon's checkpoint file
    (pspnode run --checkpoint) every this many steps (0: only when
    checkpoint() is called); a restarted worker resumes from it.
    Other keyword arguments go to Client (shared_memory, connect_timeout).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, daemon: str, model: Optional[torch.nn.Module] = None, *,
                 model_name: Optional[str] = None, model_id: Optional[int] = None, start_step: int = 0,
                 scale_updates: bool = True, reconnect: bool = True, checkpoint_every: int = 0, **client_args):
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every {checkpoint_every}: want >= 0")
        self.checkpoint_every = checkpoint_every
        self.inner = optimizer
        self.scale_updates = scale_updates
        self.reconnect = reconnect
        self._lock = threading.Lock()
        named = self._trained(optimizer, model)
        if not named:
            raise ValueError("the optimizer trains no parameters (none requires grad)")
        device = named[0][1].device
        for name, p in named:
            if p.dtype != torch.float32:
                raise TypeError(f"parameter {name!r} is {p.dtype}: pspnode exchanges float32; call model.float() "
                                "(mixed precision: keep float32 master weights in the optimizer)")
            if p.device != device:
                raise ValueError(f"parameter {name!r} is on {p.device}, others on {device}: keep the model on one device")
            if p.is_sparse:
                raise TypeError(f"parameter {name!r} is sparse: pspnode exchanges dense vectors")
        self.names = [n for n, _ in named]
        self.shapes = [(n, tuple(p.shape)) for n, p in named]
        n = sum(p.numel() for _, p in named)
        # The parameters become views of one flat vector, so that a step's
        # change is one subtraction and a merge one addition.
        self._flat = torch.empty(n, dtype=torch.float32, device=device)
        off = 0
        with torch.no_grad():
            for _, p in named:
                k = p.numel()
                self._flat[off:off + k].copy_(p.reshape(-1))
                p.data = self._flat[off:off + k].view_as(p)
                off += k
        self._old = torch.empty_like(self._flat)
        self._host = device.type != "cpu"
        name = model_name or (type(model).__name__ if model is not None else "model")
        self.model_name = name
        self.model_id = model_id if model_id is not None else model_id_of(name, self.shapes)
        self.num_params = n
        self.step_count = int(start_step)
        self._eval = None
        self.client = Client(daemon, model_name=name, num_params=n, model_id=self.model_id,
                             step=self.step_count, params_provider=self._params, **client_args)
        self._welcome(self.client.connect())

    @staticmethod
    def _trained(optimizer, model):
        in_opt = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
        if model is not None:
            named = [(n, p) for n, p in model.named_parameters() if id(p) in in_opt]
            missing = len(in_opt) - len(named)
            if missing:
                raise ValueError(f"the optimizer trains {missing} parameter(s) that are not the model's")
            return named
        out, seen = [], set()
        for gi, g in enumerate(optimizer.param_groups):
            for pi, p in enumerate(g["params"]):
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append((f"group{gi}.{pi}", p))
        return out

    def _welcome(self, w: "pb.Welcome"):
        self.update_kind = w.update_kind
        self.lr_scale = w.lr_scale if self.scale_updates else 1.0
        self.population = w.population
        self.max_abs = w.max_abs_value
        params = self.client.welcome_params()
        with self._lock:
            if params is not None:
                with torch.no_grad():
                    self._flat.copy_(torch.from_numpy(params.copy()))
                log.info("pspnode: starting from the job's parameters (%s) at step %d", w.params_source, w.step)
            self.step_count = w.step
        log.info("pspnode: job %s, barrier %s, exchange %s, %d parameters, step %d, shared memory %s",
                 w.job, w.barrier, w.exchange, self.num_params, w.step, "on" if self.client.shared else "off")

    def _params(self):
        """The parameters for a peer that joins (from the client's thread)."""
        with self._lock:
            return self.step_count, self._flat.detach().cpu().numpy().copy()

    # torch.optim.Optimizer's surface, delegated.
    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"inner": self.inner.state_dict(), "step": self.step_count}

    def load_state_dict(self, sd):
        self.inner.load_state_dict(sd["inner"])

    def report(self, loss: float, accuracy: Optional[float] = None):
        """Sends a held-out evaluation with the next step (the daemon shows
        it in /status and its metrics)."""
        self._eval = (loss, accuracy)

    @property
    def peers_population(self) -> float:
        return self.population

    def step(self, closure=None):
        """The wrapped optimizer's step, then publish, barrier and merge."""
        loss = None
        with self._lock, torch.no_grad():
            self._old.copy_(self._flat)  # the one copy of the vector the trainer makes
            loss = self.inner.step(closure) if closure is not None else self.inner.step()
            # The step's region of shared memory, when the session has it.
            up = torch.from_numpy(self.client.update_buffer(self.step_count + 1))
            if self.update_kind == pb.UPDATE_KIND_MODEL:
                up.copy_(self._flat if not self._host else self._flat.cpu())
            else:
                if not self._host:
                    torch.sub(self._flat, self._old, out=up)
                else:
                    up.copy_(self._flat - self._old)
                if self.lr_scale != 1.0:
                    up.mul_(self.lr_scale)
                    self._flat.copy_(self._old).add_(up.to(self._flat.device) if self._host else up)
            # The daemon checks every value (NaN, ±Inf, beyond its bound)
            # before it counts the step; a refusal restores the parameters
            # (_exchange).
        ev, self._eval = self._eval, None
        r = self._exchange(ev)
        if r is None:
            return loss  # reconnected: the Welcome set the step and parameters
        with self._lock:
            self.step_count += 1
            if r.merged:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a read-only view: added, not kept
                    self._flat.add_(torch.from_numpy(r.update).to(self._flat.device))
            self.population = r.barrier.population
            if self.scale_updates and r.barrier.lr_scale > 0:
                self.lr_scale = r.barrier.lr_scale
        if self.checkpoint_every and self.step_count % self.checkpoint_every == 0:
            self.checkpoint()
        return loss

    def _exchange(self, ev):
        loss, acc = ev if ev is not None else (None, None)
        try:
            return self.client.step(self.step_count + 1, loss=loss, accuracy=acc)
        except BadUpdate as e:
            with self._lock:
                self._flat.copy_(self._old)
            raise FloatingPointError(
                f"step {self.step_count + 1}: the daemon refused the update ({e.details}); the parameters are as "
                "before the step and nothing was sent (lower the learning rate?)") from e
        except SessionLost as e:
            if not self.reconnect:
                raise
            log.warning("pspnode: the daemon went away (%s); connecting again", e.details)
            # This step was taken locally but not published: the parameters
            # have taken one more step than the job knows of.
            self.client.start_step = self.step_count + 1
            self._welcome(self.client.connect())
            return None

    def checkpoint(self) -> str:
        """Writes the parameters to the daemon's checkpoint file (pspnode
        run --checkpoint), which a restarted worker resumes from."""
        with self._lock:
            return self.client.checkpoint(self.step_count, self._flat.detach().cpu().numpy())

    def close(self):
        """Ends the session: the worker leaves its peers' barriers."""
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
