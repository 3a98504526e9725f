"""The daemon session pspnode.Optimizer and pspnode.DiLoCo share.

Both are torch optimizers that wrap the user's (``self.inner``) and drive a
pspnode daemon through the trainer API: they check their arguments alike,
lay out the exchanged parameters alike (pspnode._params), start a daemon of
their own or connect to one, translate the daemon's refusals into errors
that name the fix, keep a learning-rate scheduler at the job's step, and
close alike. Session holds all of that once; each optimizer adds what its
step does (an exchange at every step, or an outer step every H) and what its
Welcome means for its parameters.

A subclass sets ``_what`` (its public name, for messages), ``_inner_what``
(what it wraps), ``_shaped`` (whether the views of the daemon's vectors are
shaped as the parameters), and defines ``_welcome(w)``, ``_params()`` (the
parameters for a peer's fetch), ``_job_step()`` (the step the job counts)
and ``_sched_step()`` (the step its scheduler is kept at).
"""

import logging
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from pspnode._params import checked as _checked_params
from pspnode.client import Client, StepResult
from pspnode.daemon import Daemon
from pspnode.errors import DaemonStartError, DaemonUnavailable, ModelMismatch

log = logging.getLogger("pspnode")

__all__ = []  # internal


@dataclass
class Reset:
    """What ``on_reset`` receives when the optimizer's step jumped to the
    job's: the daemon moved to another lineage of the job, or the worker
    resumed (load_state_dict, a reconnect) into a job at another step. step:
    the step the parameters have taken (the optimizer's ``step_count``
    now; for pspnode.DiLoCo the inner steps, outer step × H); lineage: the
    new lineage's genesis, hex ("" for a resume); why."""
    step: int
    lineage: str
    reason: str


class Session(torch.optim.Optimizer):
    """A torch optimizer that wraps ``self.inner`` and holds a session with
    a pspnode daemon (``self.client``; ``self.daemon`` when it started
    it). Not built directly: see pspnode.Optimizer and pspnode.DiLoCo."""

    _what = "pspnode optimizer"
    _inner_what = "optimizer"
    _shaped = False

    # -- set-up ------------------------------------------------------------

    def _prepare(self, optimizer, daemon: Optional[str], model: Optional[torch.nn.Module], *, job: Optional[str],
                 bootstrap: Sequence[str], listen: Optional[Sequence[str]], identity: Optional[str],
                 daemon_args: Sequence[str], swarm_key: Optional[str], scheduler: Optional[Callable],
                 on_reset: Optional[Callable[[Reset], None]]):
        """Checks the arguments every pspnode optimizer takes and lays out
        the parameters; nothing is started. No torch.optim.Optimizer
        __init__: param_groups, state and defaults are the wrapped
        optimizer's (_params.wraps_inner)."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{self._what} wraps a torch.optim.Optimizer (the {self._inner_what}), got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, Session):
            raise TypeError(f"this optimizer is already a {optimizer._what}: wrap the torch optimizer itself")
        if scheduler is not None and not callable(scheduler):
            raise TypeError("scheduler= takes a function that builds the scheduler on the optimizer, e.g. "
                            "scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 30): the optimizer then owns "
                            "it and keeps it at the job's step")
        if daemon is None and not job:
            raise ValueError("give the address of a running daemon (daemon='unix:/tmp/a.sock'), or job='NAME' "
                             "(and bootstrap='HOST:PORT', alike on every worker) to start a daemon of its own")
        if daemon is not None and (job or bootstrap or listen or identity or daemon_args or swarm_key):
            raise ValueError("job, bootstrap, listen, identity, swarm_key and daemon_args start a daemon of the "
                             f"optimizer's own; the daemon at {daemon} has its own flags: drop them, or drop the "
                             "address")
        self.inner = optimizer
        self.on_reset = on_reset
        self._sched_factory = scheduler
        self.scheduler = None
        self._sched_fresh = True  # the scheduler's state matches the lrs (not overwritten by a load)
        self._built = False  # on_reset is called only once the optimizer is built
        self._lock = threading.Lock()  # the parameters, against the client's thread
        self._stepping = threading.Lock()  # one step() at a time
        self._closed = False
        named, self._device = _checked_params(optimizer, model, self._inner_what)
        self._model = model
        self._model_ids = self._ids(model)
        self._named = named
        self.names = [n for n, _ in named]
        self.shapes = [(n, tuple(p.shape)) for n, p in named]
        self._sizes = [p.numel() for _, p in named]
        self._offsets = [sum(self._sizes[:i]) for i in range(len(named))]
        self.num_params = sum(self._sizes)
        # Views made once, not at every step (60 tensors' slices cost as
        # much as their copies): each parameter flat, and the pieces of
        # the shared region or a message, by address.
        self._pf = [p.view(-1) for _, p in named]
        self._cache = {}
        self._host = self._device.type != "cpu"
        self.population, self.lr_scale, self.max_abs = 1.0, 1.0, float("inf")
        self._eval = None
        self.daemon: Optional[Daemon] = None
        self.client: Optional[Client] = None

    def _start(self, daemon: Optional[str], *, job, bootstrap, listen, identity, daemon_args, pspnode_bin, swarm_key,
               start_timeout: float, client_args: dict, **client_kw):
        """Starts a daemon of the optimizer's own when no address is given,
        then makes the client (not yet connected)."""
        if daemon is None:
            self.daemon = Daemon(job, bootstrap=bootstrap, listen=listen, identity=identity, args=list(daemon_args),
                                 binary=pspnode_bin, swarm_key=swarm_key).start(timeout=min(start_timeout, 30.0))
            daemon = self.daemon.address
            client_args.setdefault("connect_timeout", start_timeout)
            # A daemon that cannot join (another job at the bootstrap
            # address, another swarm key) says so at once (BootstrapError).
            client_args.setdefault("alive", lambda: self.daemon.alive(self.client.last_waiting))
        try:
            self.client = Client(daemon, num_params=self.num_params, params_provider=self._params,
                                 **client_kw, **client_args)
        except BaseException:
            self.close()
            raise

    def _open(self, before: Optional[Callable[[], None]] = None):
        """Runs before (with the client made), connects, takes the
        Welcome and builds the scheduler; on any failure closes what was
        started."""
        try:
            if before is not None:
                before()
            self._welcome(self._connect())
            if self._sched_factory is not None:
                self._build_scheduler()
                self._sync_scheduler()
        except BaseException:
            self.close()
            raise
        self._built = True

    @staticmethod
    def _ids(model):
        return None if model is None else tuple(id(p) for p in model.parameters())

    def _check(self):
        """Raises at once if the model changed under the optimizer since it
        was wrapped, naming the fix."""
        if self._closed:
            raise RuntimeError(f"this {self._what} is closed")
        fix = (f"build the model completely and move it (model.to(...)) before building the optimizer and "
               f"{self._what}, or build new ones after the change")
        for i, ((name, p), shape) in enumerate(zip(self._named, self.shapes)):
            if p.device != self._device:
                raise RuntimeError(f"parameter {name!r} moved from {self._device} to {p.device} after wrapping "
                                   f"(model.to?): {fix}")
            if p.dtype != torch.float32:
                raise RuntimeError(f"parameter {name!r} became {p.dtype} after wrapping (model.half()/double()?): "
                                   "pspnode exchanges float32; keep float32 weights (torch.autocast for mixed precision)")
            if tuple(p.shape) != shape[1]:
                raise RuntimeError(f"parameter {name!r} changed shape from {shape[1]} to {tuple(p.shape)} after "
                                   f"wrapping: every worker's model must keep its shapes; {fix}")
            if not p.is_contiguous():
                raise RuntimeError(f"parameter {name!r} is no longer contiguous: "
                                   "`with torch.no_grad(): p.data = p.data.contiguous()`")
            if p.data_ptr() != self._pf[i].data_ptr():  # its data was replaced (p.data = ...): view it anew
                self._pf[i] = p.view(-1)
        if self._model is not None and self._ids(self._model) != self._model_ids:
            raise RuntimeError(f"the model's parameters changed after wrapping (a layer added, removed or "
                               f"replaced): the optimizer would train the old ones; {fix}")

    def _mismatch(self, e: ModelMismatch) -> ModelMismatch:
        """The error for the daemon's refusal of this worker's model."""
        return e

    def _connect(self):
        try:
            return self.client.connect()
        except ModelMismatch as e:
            err = self._mismatch(e)
            if err is e:
                raise
            raise err from None
        except DaemonUnavailable as e:
            if self.daemon is not None and not isinstance(e, DaemonStartError):
                if self.daemon.running and e.reason == "TIMEOUT":
                    raise self.daemon.failure(f"had not joined its job within {self.client.connect_timeout:.0f} s",
                                              waiting=e.metadata.get("waiting", self.client.last_waiting)) from None
                raise self.daemon.failure("could not be reached", waiting=self.client.last_waiting) from None
            raise

    def _welcome_session(self, w, scale_updates: bool = True):
        """What every Welcome sets: the exchange's kind of update, the
        scale, the population and the job's bound on values."""
        self._cache.clear()  # the last session's regions
        self.update_kind = w.update_kind
        self.lr_scale = w.lr_scale if scale_updates and w.lr_scale > 0 else 1.0
        self.population = w.population
        self.max_abs = w.max_abs_value if w.max_abs_value > 0 else float("inf")
        self.exchange = w.exchange

    # -- vectors -----------------------------------------------------------

    def _views(self, flat):
        if self._shaped:
            return [flat[o:o + k].view(s) for o, k, (_, s) in zip(self._offsets, self._sizes, self.shapes)]
        return [flat[o:o + k] for o, k in zip(self._offsets, self._sizes)]

    def _region(self, vec):
        """The per-parameter views of a float32 numpy vector from the
        client (a region of the shared file, the same few every step, or a
        message's bytes), kept by address; of a flat tensor, made anew."""
        if isinstance(vec, torch.Tensor):
            return self._views(vec.reshape(-1))
        if vec.flags.writeable:
            t = torch.from_numpy(vec)
        else:  # a message's bytes: read only, and only read here
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = torch.from_numpy(vec)
        key = (t.data_ptr(), t.numel())
        v = self._cache.get(key)
        if v is None:
            if len(self._cache) >= 8:
                self._cache.clear()
            v = self._cache[key] = self._views(t)
        return v

    def _assign(self, vec, into=None):
        """Copies a float32 vector (numpy, from the daemon: a region of
        shared memory or a message's bytes; or a flat tensor) into the
        parameters, or into the tensors into (laid out as they are)."""
        with torch.no_grad():
            for t, v in zip(self._pf if into is None else into, self._region(vec)):
                t.copy_(v.to(t.device) if t.device != v.device else v)

    # -- steps --------------------------------------------------------------

    def _received(self):
        """The peers' updates the daemon has taken in so far (None when
        its status cannot be read)."""
        try:
            return int(self.client.status(timeout=5).node.updates_received)
        except Exception:  # a daemon without Status: merge as Step does
            return None

    def _step_waiting(self, n, loss, acc, wait: float, expected: Callable[[], int]) -> StepResult:
        """Step n as publish, barrier, then a wait of up to wait seconds
        for the round's updates from the peers (expected() of them) to
        arrive before the pull."""
        c = self.client
        now = self._received()
        if now is None:  # no status to tell arrivals by
            return c.step(n, loss=loss, accuracy=acc)
        c.publish(n, None, loss=loss, accuracy=acc)
        b = c.barrier(n + 1)
        want, deadline = expected(), time.monotonic() + wait
        while (self._received() or now) - now < want and time.monotonic() < deadline:
            time.sleep(0.01)
        p = c.pull()
        return StepResult(barrier=b, merged=p.merged, update=p.update, reset=p.reset)

    # -- torch.optim.Optimizer ---------------------------------------------
    # (param_groups, state, defaults and add_param_group: _wraps_inner)

    def zero_grad(self, set_to_none: Optional[bool] = None):
        """The wrapped optimizer's zero_grad (with its own default for
        set_to_none unless given)."""
        self._check()
        if set_to_none is None:
            self.inner.zero_grad()
        else:
            self.inner.zero_grad(set_to_none=set_to_none)

    def report(self, loss: float, accuracy: Optional[float] = None):
        """Sends a held-out evaluation with the next exchange (the daemon
        shows it in /status and its metrics)."""
        self._eval = (loss, accuracy)

    def step(self, closure=None):
        """One step of the training loop (see the class): one at a time."""
        if not self._stepping.acquire(blocking=False):
            raise RuntimeError(f"{self._what}.step() called from two threads at once: a worker's steps are one "
                               f"sequence; call step() from the training thread only (one {self._what}, and one "
                               "daemon, per training loop)")
        try:
            return self._step(closure)
        finally:
            self._stepping.release()

    def __reduce__(self):
        # A scheduler's saved state_dict can hold the optimizer (see
        # _params.Unpickled): it pickles as a stand-in, not the session.
        from pspnode._params import Unpickled
        return Unpickled, (self._what, self.model_name, self._job_step())

    # -- the scheduler -----------------------------------------------------

    def _jumped(self, r: Reset):
        """The step became the job's: the optimizer's scheduler is brought
        there, and on_reset told."""
        self._sync_scheduler()
        if self.on_reset is not None:
            self.on_reset(r)

    def _build_scheduler(self):
        """Builds the scheduler anew, from the learning rates it started
        from (each group's initial_lr, once a scheduler has set it)."""
        for g in self.param_groups:
            if "initial_lr" in g:
                g["lr"] = g["initial_lr"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sched = self._sched_factory(self)
        if not hasattr(sched, "step") or not hasattr(sched, "last_epoch"):
            raise TypeError(f"scheduler= built {type(sched).__name__}, not a torch learning-rate scheduler")
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise TypeError("ReduceLROnPlateau follows a metric, not the step: step it yourself "
                            "(sched.step(val_loss)) rather than through scheduler=")
        if getattr(sched, "optimizer", None) is not self:
            raise ValueError("scheduler= must build the scheduler on the optimizer it is given "
                             "(lambda opt: StepLR(opt, ...)), not on the wrapped one")
        self.scheduler, self._sched_fresh = sched, True

    def _step_scheduler(self):
        """One step of the optimizer's scheduler after a step the wrapped
        optimizer took, then at the step whatever else happened."""
        if self.scheduler is None:
            return
        if self._sched_fresh and self.scheduler.last_epoch == self._sched_step() - 1:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the order check: this step did run the optimizer's
                self.scheduler.step()
        self._sync_scheduler()

    def _sync_scheduler(self):
        """Brings the optimizer's scheduler to the step: forward by its own
        steps, or, when it is ahead or its state was overwritten by a load,
        built anew and stepped there."""
        if self.scheduler is None:
            return
        target = self._sched_step()
        if not self._sched_fresh or self.scheduler.last_epoch > target:
            self._build_scheduler()
        n = target - self.scheduler.last_epoch
        if n <= 0:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(n):
                self.scheduler.step()
        log.info("pspnode: the scheduler brought to the job's step %d (lr %s)", target,
                 ", ".join(f"{g['lr']:.4g}" for g in self.param_groups))

    # -- closing -----------------------------------------------------------

    def _release(self):
        """What close() does before the session ends (nothing here)."""

    def close(self):
        """Ends the session (the worker leaves its peers' barriers) and
        stops the daemon the optimizer started, if any."""
        self._closed = True
        self._release()
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if getattr(self, "daemon", None) is not None:
            self.daemon.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
