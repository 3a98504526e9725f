"""pspnode.Optimizer: a torch.optim.Optimizer that trains with a pspnode job.

Wrap the optimizer of a single-process PyTorch loop and it becomes a worker
of a decentralised job:

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = pspnode.Optimizer(opt, model=model, job="mnist", bootstrap="10.0.0.5:29500")  # +1 line
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()      # local step, publish, barrier, merge the peers' updates

With ``job=`` (and no daemon address) the optimizer starts its own daemon,
``pspnode run --trainer``, and stops it when it closes or the process
exits; with a daemon address (``pspnode.Optimizer(opt, "unix:/tmp/a.sock",
model=model)``) it connects to a daemon started beside it.

Resuming into a running job. The job is the truth: a worker restarted from
its checkpoint (``load_state_dict``), or joining late, takes the job's step
and parameters, whatever its own; it keeps its wrapped optimizer's state
(momenta). Its learning-rate schedule follows the job's step: a scheduler
given as ``scheduler=lambda opt: OneCycleLR(opt, ...)`` is the optimizer's
own, stepped once per step and brought to the job's step whenever the step
jumps (a resume, a late join, a reset to another lineage); one the user
steps is the user's to bring there, told by ``on_reset`` (a Reset whose
``step`` is the job's).

A gradient that is not finite (a NaN loss, say) makes ``step()`` raise
FloatingPointError before the wrapped optimizer steps: nothing changes, not
even its momenta, and the next step with finite gradients trains.

``step()`` runs the wrapped optimizer's step, hands the result to the
daemon (under the epidemic exchange the model, which the daemon sends to a
few sampled peers; under gossip the change the step made, which it
publishes to every peer), waits at the barrier for the next step, and takes
what the peers sent (epidemic: the average of the model and theirs; gossip:
the sum of their changes). A worker that joins a running job starts from
the job's parameters and step, fetched by its daemon before its first step.

Under epidemic with the daemon on the same machine and the model on the
CPU, the parameters live in the region of memory the optimizer shares with
its daemon (``shared_params``, on by default): the daemon reads the model
and averages the peers' into it in place, so a step copies nothing in
Python, and the process holds no second copy of the model. The tensors stay
the model's own parameters (their storage moves); ``close()`` moves them
back into the process's own memory.

It is a torch.optim.Optimizer: its ``param_groups``, ``state`` and
``defaults`` are the wrapped optimizer's, so LR schedulers, gradient
clipping and GradScaler work on it as on the wrapped one; its
``state_dict()`` holds the wrapped optimizer's state and the step.

The parameters exchanged are those the optimizer trains (requires_grad),
all float32 and contiguous, in the order of ``model.named_parameters()``
(state_dict order) when ``model`` is given, else in the optimizer's
param_groups order. They stay the model's own tensors. Buffers (BatchNorm
statistics) are not exchanged. Every worker of a job must build the same
model and start from the same parameters, as DDP does by broadcasting rank
0's: seed the initialisation alike (torch.manual_seed) or load the same
weights. A worker that joins a job already under way gets the job's
parameters whatever its own.
"""

import logging
from typing import Callable, Optional, Sequence

import torch

from pspnode.client import model_id_of
from pspnode._params import nonfinite_grad as _nonfinite_grad
from pspnode._params import wraps_inner as _wraps_inner
from pspnode._session import Reset, Session
from pspnode.errors import BadUpdate, SessionLost
from pspnode.trainer.v3 import trainer_pb2 as pb

log = logging.getLogger("pspnode")


@_wraps_inner("pspnode.Optimizer", "wrapped optimizer")
class Optimizer(Session):
    """Wraps ``optimizer`` (any torch.optim.Optimizer) for a pspnode job.

    daemon: a running daemon's trainer address, "unix:PATH" or
    "tcp:127.0.0.1:PORT" (pspnode run --trainer). Without it, ``job`` must
    be given and the optimizer starts a daemon of its own (see
    pspnode.daemon): job, bootstrap (where to join: "HOST:PORT", the same
    for every worker as DDP's MASTER_ADDR:MASTER_PORT, the worker on that
    machine that finds the port free listening there and starting the job;
    or multiaddrs ending in /p2p/<peer id>), swarm_key (the job's swarm key
    file: a private job, whose address only its key's holders answer),
    listen (multiaddrs; default a free port), identity (a key file),
    daemon_args (other ``pspnode run``
    flags, e.g. ["--barrier", "pssp:2:4"]), pspnode_bin (the binary;
    default $PSPNODE_BIN, PATH, the repository's bin/), start_timeout
    (seconds to join the job before raising, with the daemon's reason).
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
    scheduler: a function that builds the learning-rate scheduler on this
    optimizer (``lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt,
    ...)``, any scheduler but ReduceLROnPlateau), which the optimizer then
    owns (``opt.scheduler``): it steps it after every step and keeps it at
    the job's step (see above), and saves it in its state_dict.
    on_reset: called with a Reset when the parameters and the step became
    the job's after the optimizer was built (its node moved to another
    lineage, or it resumed into a job at another step than its own): bring
    schedulers you step yourself to ``Reset.step``.
    shared_params: under epidemic with shared memory, keep the parameters
    in the shared region (CPU models; see above); False copies them in and
    out at every step.
    Other keyword arguments go to Client (shared_memory, connect_timeout).
    """

    _what = "pspnode.Optimizer"
    _inner_what = "optimizer"

    def __init__(self, optimizer: torch.optim.Optimizer, daemon: Optional[str] = None,
                 model: Optional[torch.nn.Module] = None, *, job: Optional[str] = None,
                 bootstrap: Sequence[str] = (), listen: Optional[Sequence[str]] = None,
                 identity: Optional[str] = None, daemon_args: Sequence[str] = (), pspnode_bin: Optional[str] = None,
                 swarm_key: Optional[str] = None, start_timeout: float = 60.0, model_name: Optional[str] = None,
                 model_id: Optional[int] = None,
                 start_step: int = 0, scale_updates: bool = True, reconnect: bool = True, checkpoint_every: int = 0,
                 on_reset: Optional[Callable[[Reset], None]] = None, shared_params: bool = True,
                 scheduler: Optional[Callable[["Optimizer"], object]] = None, **client_args):
        self._prepare(optimizer, daemon, model, job=job, bootstrap=bootstrap, listen=listen, identity=identity,
                      daemon_args=daemon_args, swarm_key=swarm_key, scheduler=scheduler, on_reset=on_reset)
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every {checkpoint_every}: want >= 0")
        self.checkpoint_every = checkpoint_every
        self.scale_updates = scale_updates
        self.reconnect = reconnect
        # The parameters before a step, when the step needs them (gossip's
        # delta; a restore without shared memory): made when first needed.
        self._old = self._olds = None
        self.shared_params = shared_params
        self._in_region = False  # the parameters live in the shared region
        name = model_name or (type(model).__name__ if model is not None else "model")
        self.model_name = name
        self.model_id = model_id if model_id is not None else model_id_of(name, self.shapes)
        self.step_count = int(start_step)
        self._start(daemon, job=job, bootstrap=bootstrap, listen=listen, identity=identity, daemon_args=daemon_args,
                    pspnode_bin=pspnode_bin, swarm_key=swarm_key, start_timeout=start_timeout,
                    client_args=client_args, model_name=name, model_id=self.model_id, step=self.step_count)
        self._open()

    # -- set-up ------------------------------------------------------------

    def _welcome(self, w: "pb.Welcome"):
        self._welcome_session(w, self.scale_updates)
        params = self.client.welcome_params()
        region = self.client.region()
        with self._lock:
            if (region is not None and self.shared_params and not self._host
                    and self.update_kind == pb.UPDATE_KIND_MODEL):
                # The parameters move into the region: the job's, which the
                # daemon put there, or this worker's own, copied in.
                if params is None:
                    self._copy_out(region)
                self._move_into(region)
            else:
                if self._in_region:  # a new session without a region: back into our own memory
                    self._move_into(None)
                if params is not None:
                    self._assign(params)
            if params is not None:
                log.info("pspnode: starting from the job's parameters (%s) at step %d", w.params_source, w.step)
            asked, self.step_count = self.client.start_step, w.step
        if self._built and w.step != asked:
            self._jumped(Reset(step=int(w.step), lineage="",
                               reason=f"resumed into the job at its step {w.step} (this worker's was {asked}): the "
                                      "parameters and the step are the job's"))
        elif self._built:
            self._sync_scheduler()
        log.info("pspnode: job %s, barrier %s, exchange %s, %d parameters, step %d, shared memory %s",
                 w.job, w.barrier, w.exchange, self.num_params, w.step, "on" if self.client.shared else "off")

    # -- the parameters ----------------------------------------------------

    def _copy_out(self, vec):
        """Copies the parameters into a float32 numpy vector (the region)."""
        with torch.no_grad():
            for flat, u in zip(self._pf, self._region(vec)):
                u.copy_(flat)

    def _move_into(self, region):
        """Makes the parameters' storage the region's (which holds their
        values), or, with None, memory of the process's own again."""
        views = self._region(region) if region is not None else None
        with torch.no_grad():
            for i, (_, p) in enumerate(self._named):
                p.data = views[i].view(p.shape) if views is not None else p.data.clone()
                self._pf[i] = p.view(-1)
        self._in_region = region is not None

    def params_vector(self) -> torch.Tensor:
        """The exchanged parameters as one float32 vector (a copy, on the
        CPU), in the exchange's order."""
        with self._lock, torch.no_grad():
            return torch.cat([p.detach().reshape(-1).cpu() for _, p in self._named])

    def _params(self):
        """The parameters for a peer that joins (from the client's thread)."""
        with self._lock, torch.no_grad():
            return self.step_count, torch.cat([p.detach().reshape(-1) for _, p in self._named]).cpu().numpy()

    # -- torch.optim.Optimizer ---------------------------------------------
    # (param_groups, state, defaults and add_param_group: _wraps_inner)

    def state_dict(self):
        """The wrapped optimizer's state_dict, plus "pspnode": the step
        the parameters have taken and the model they belong to."""
        sd = self.inner.state_dict()
        sd["pspnode"] = {"step": self.step_count, "model_id": self.model_id, "model_name": self.model_name,
                         "num_params": self.num_params}
        if self.scheduler is not None:
            sd["pspnode"]["scheduler"] = self.scheduler.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        """Loads the wrapped optimizer's state and the step. A step other
        than the session's opens a new session at it, whose Welcome may
        give the job's parameters and step if the job has gone further
        (load the model's weights first)."""
        sd = dict(state_dict)
        ps = sd.pop("pspnode", None)
        if ps is None and "inner" in sd and "state" not in sd:  # the format before version 2
            ps, sd = {"step": sd.get("step", self.step_count)}, sd["inner"]
        if ps is not None and ps.get("model_id") not in (None, self.model_id):
            raise ValueError(f"this state_dict is of model {ps.get('model_name')!r} (id {ps['model_id']:#010x}), "
                             f"the optimizer's of {self.model_name!r} (id {self.model_id:#010x})")
        self.inner.load_state_dict(sd)
        if self.scheduler is not None:
            if ps is not None and "scheduler" in ps:
                self.scheduler.load_state_dict(ps["scheduler"])
                self._sched_fresh = True
            else:  # the loaded learning rates are not the scheduler's: it is built anew at the next sync
                self._sched_fresh = False
        if ps is not None and int(ps.get("step", self.step_count)) != self.step_count:
            self._resume(int(ps["step"]))
        else:
            self._sync_scheduler()

    def _resume(self, step: int):
        """Opens a new session whose parameters have taken step steps."""
        log.info("pspnode: resuming at step %d (was %d): a new session", step, self.step_count)
        with self._lock:
            self.step_count = step
        self.client.start_step = step
        self._welcome(self._connect())

    def __repr__(self):
        return (f"pspnode.Optimizer({self.inner!r},\n  model {self.model_name!r} ({self.num_params} parameters), "
                f"step {self.step_count}, daemon {self.client.address})")

    # -- training ----------------------------------------------------------

    @property
    def peers_population(self) -> float:
        return self.population

    def _step(self, closure):
        self._check()
        if closure is None:
            self._refuse_nonfinite()
        model_kind = self.update_kind == pb.UPDATE_KIND_MODEL
        in_region = self._in_region
        # What a refused update is undone from: under epidemic with shared
        # memory the daemon puts the model before the step back into the
        # region; otherwise the parameters before the step, kept here (for
        # gossip's delta too).
        keep_old = not model_kind or self.client.region() is None
        with self._lock, torch.no_grad():
            if keep_old:
                olds = self._snapshot()
            loss = self.inner.step(closure) if closure is not None else self.inner.step()
            if not in_region:
                ups = self._region(self.client.update_buffer())
                for flat, u, o in zip(self._pf, ups, olds if keep_old else self._pf):
                    if model_kind:
                        u.copy_(flat)
                        continue
                    if self._host:
                        u.copy_(flat - o)
                    else:
                        torch.sub(flat, o, out=u)
                    if self.lr_scale != 1.0:
                        u.mul_(self.lr_scale)
                        flat.copy_(o).add_(u.to(flat.device) if self._host else u)
            # The daemon checks every value (NaN, ±Inf, beyond its bound)
            # before it counts the step; a refusal restores the parameters
            # (_exchange).
        ev, self._eval = self._eval, None
        r = self._exchange(ev, olds if keep_old else None)
        if r is None:
            return loss  # reconnected: the Welcome set the step and parameters
        if r.reset is not None:
            self._reset(r.reset)
        else:
            with self._lock:
                self.step_count += 1
                if r.merged and not in_region:
                    with torch.no_grad():
                        for flat, v in zip(self._pf, self._region(r.update)):
                            v = v.to(flat.device) if self._host else v
                            if model_kind:
                                flat.copy_(v)  # the average, to take
                            else:
                                flat.add_(v)  # the peers' deltas, to add
        self._step_scheduler()
        self.population = r.barrier.population
        if self.scale_updates and r.barrier.lr_scale > 0:
            self.lr_scale = r.barrier.lr_scale
        if self.checkpoint_every and self.step_count % self.checkpoint_every == 0:
            self.checkpoint()
        return loss

    def _refuse_nonfinite(self):
        """A gradient that is not finite skips the whole step before the
        wrapped optimizer takes it: its state (momenta) stays as it was."""
        bad = _nonfinite_grad(self._named)
        if bad is not None:
            raise FloatingPointError(
                f"step {self.step_count + 1}: the gradient of parameter {bad!r} is not finite (NaN or ±Inf): the step "
                "was skipped before the wrapped optimizer took it, so its state (momenta) and the parameters are as "
                "they were and nothing was sent; the next step with finite gradients trains (as GradScaler skips "
                "such a step). A loss that is not finite, or a learning rate too high, makes one")

    def _snapshot(self):
        """The parameters before a step, in a buffer kept for it."""
        if self._old is None:
            self._old = torch.empty(self.num_params, dtype=torch.float32, device=self._device)
            self._olds = self._views(self._old)
        for flat, o in zip(self._pf, self._olds):
            o.copy_(flat)  # the one copy of the vector the trainer makes
        return self._olds

    def _exchange(self, ev, olds):
        loss, acc = ev if ev is not None else (None, None)
        try:
            return self.client.step(self.step_count + 1, loss=loss, accuracy=acc)
        except BadUpdate as e:
            with self._lock, torch.no_grad():
                if olds is not None:
                    for flat, o in zip(self._pf, olds):
                        flat.copy_(o)
                elif not self._in_region:  # the daemon put the model before the step back in the region
                    self._assign(self.client.region())
            raise FloatingPointError(
                f"step {self.step_count + 1}: the daemon refused the update ({e.details}); the parameters are as "
                "before the step and nothing was sent (lower the learning rate?)") from e
        except SessionLost as e:
            if not self.reconnect or self._closed:
                raise
            log.warning("pspnode: the daemon went away (%s); connecting again", e.details)
            # This step was taken locally but not published: the parameters
            # have taken one more step than the job knows of.
            self.client.start_step = self.step_count + 1
            self._welcome(self._connect())
            return None

    def _reset(self, reset: "pb.Reset"):
        """The daemon moved to another lineage of the job: its parameters
        and step replace ours; the wrapped optimizer's state stays."""
        vec = self.client.reset_params(reset)
        with self._lock:
            if not (self._in_region and vec is self.client.region()):
                self._assign(vec)
            self.step_count = int(reset.step)
        log.warning("pspnode: the daemon moved to lineage %s of the job (%s): the parameters and the step (%d) are "
                    "the job's now; the optimizer's state is kept", reset.lineage[:16], reset.reason, reset.step)
        self._jumped(Reset(step=int(reset.step), lineage=reset.lineage, reason=reset.reason))

    def checkpoint(self) -> str:
        """Writes the parameters to the daemon's checkpoint file (pspnode
        run --checkpoint), which a restarted worker resumes from."""
        if self._in_region:  # the daemon reads them where they are
            with self._lock:
                return self.client.checkpoint(self.step_count, self.client.region())
        step, vec = self._params()
        return self.client.checkpoint(step, vec)

    def _job_step(self) -> int:
        return self.step_count

    def _sched_step(self) -> int:
        return self.step_count

    def _release(self):
        """Parameters that lived in the shared region move back into the
        process's memory before the session ends."""
        if getattr(self, "_in_region", False):
            with self._lock:
                self._move_into(None)
