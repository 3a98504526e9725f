"""pspnode.DiLoCo: DiLoCo outer steps under a pspnode job's barrier.

DiLoCo (Douillard et al., 2023) trains with rare communication: each
worker takes H steps of its own inner optimizer (AdamW, say) from the outer
parameters θ_outer, then the workers average their pseudo-gradients
Δ_i = θ_outer − θ_i and an outer optimizer (SGD with Nesterov momentum, lr
0.7, momentum 0.9) takes Δ̄ as the gradient of θ_outer. Published systems
end each outer step with a blocking all-reduce; here the outer step is one
step of a pspnode daemon:

    model = Net()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    opt = pspnode.DiLoCo(inner, model=model, H=100, job="lm", bootstrap=[ADDR])
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()          # an inner step; every H-th, the outer step too

- **The barrier counts outer steps.** The daemon's Step is called once per
  outer step, so pSSP(β, s) bounds how many outer steps a worker runs ahead
  of the peers it samples; the inner steps make no daemon call.
- **Under the epidemic exchange (the default) each worker takes its outer
  step locally, then the exchange averages.** Worker i steps its own
  θ_outer_i with its own pseudo-gradient Δ_i = θ_outer_i − θ_i through the
  outer optimizer, publishes the result, and takes as its next θ_outer_i
  the daemon's average of it and the models S sampled peers sent: the step
  of decentralised SGD (D-PSGD: a local step, then average) with DiLoCo's
  outer step as the local step. The consensus pull toward the peers is a
  plain average, a contraction. (Averaging first and taking θ_outer − the
  average as the outer gradient, as an earlier version did, put that pull
  into Nesterov's momentum at the outer rate: with peers' models one or
  two outer steps stale the loop is marginal or unstable at lr 0.7,
  momentum 0.9, and training collapsed where the all-reduce trained; see
  examples/diloco/stability.py.)
- **The outer momentum is quasi-global** (Lin et al., "Quasi-Global
  Momentum", ICML 2021) when the outer optimizer is torch.optim.SGD with
  momentum (DiLoCo's): after the average, each momentum buffer becomes
  μ·b + (1 − μ)·(θ_outer before the round − θ_outer after it)/lr, the
  round's whole move, average included, rather than μ·b + Δ_i. A buffer
  fed only the worker's own Δ_i (a local momentum) carries that worker's
  noise for 1/(1 − μ) rounds into every model it publishes, and the
  sampled averages never remove it: on an MNIST MLP the models stayed a
  third of an outer step apart and the held-out loss ended 33–85 % above
  the all-reduce's. The quasi-global buffer is an average of the moves of
  the averaged models, so it is nearly the same on every worker; the pull
  enters it at weight 1 − μ, not 1 (fed at the weight that would make it
  all-reduce DiLoCo under full averaging, 1/(1 + μ), the loop diverged).
  Its steady step is Nesterov's, lr·Δ/(1 − μ); it responds to a change of
  Δ more slowly. Other outer optimizers keep their own state (a local
  momentum).
- **Under the gossip exchange** the worker takes the same local outer
  step and publishes its move (stepped θ_outer − θ_outer) × 1/N̂ (the
  daemon's lr_scale); the daemon sums the peers' moves, and θ_outer moves
  by its own and theirs: the mean move, which with every move delivered is
  all-reduce DiLoCo exactly (the mean of the local momenta is the momentum
  of the mean pseudo-gradient), each arriving whenever it does (a late
  one late, as in asynchronous Local-SGD). Nothing pulls the workers
  together: a move a worker never gets stays out of its θ_outer, once
  (publishing Δ_i and running the momentum on the sum, as an earlier
  version did, multiplied such a gap by 1/(1 − μ)).
- **The round's models:** after the barrier the outer step waits up to
  ``merge_wait`` seconds (default 1) for the round's models to arrive (S
  under epidemic:S, N̂ − 1 deltas under gossip) before it pulls, so that a
  peer in step with this worker is merged this round, not the next.
  Whatever else came since the last outer step is merged too (the
  daemon keeps each sender's latest): a worker that ran ahead or behind
  contributes its latest model. (Dropping what came during the round, as
  the previous round's, was measured worse: workers under pSSP drift
  apart by seconds, and the dropped models were most of the merges.)
  ``merge_wait=0`` is the daemon's plain Step. A peer slower than this
  worker sends late every round, so each round waits out the whole
  ``merge_wait`` for it: with a model of 32 kB on 70-ms links, 0.3 s
  reached a target loss 13–19 % sooner than 1 s, slow peer or not. The
  default leaves time for a large model's transfer (10 MB takes 0.8 s at
  100 Mbit/s); a model that comes late is merged a round later.
- **Compression** (``compression="none"``, ``"bf16"``, ``"int8"`` or
  ``"int4"``): the epidemic exchange sends each round's model as float32,
  bfloat16, or int8 or int4 with a float32 scale per 256 values (the
  daemon's ``--exchange epidemic:S``, ``epidemic:S:bf16``,
  ``epidemic:S:int8``, ``epidemic:S:int4``), 1×, 2×, 3.9× or 7.8× fewer
  bytes (int4 held an MNIST CNN's loss and cost a character model's 5–11
  %: measure it on yours); the sender feeds the rounding error into the next round's
  model (error feedback), and a receiver refuses and counts a chunk whose
  scale is not finite or negative. The default (None): int8 for a daemon
  the optimizer starts under epidemic (its --exchange gets ":int8"; the
  matrix's cells ended as in float32), the daemon's own encoding for a
  daemon given by address, none under gossip. It is part of the job's
  configuration: a worker of another compression is refused at connect.
- **Fragments** (``fragments=F``, streaming DiLoCo, Douillard et al.
  2025): θ_outer is cut into F fragments of consecutive values, each
  synchronised every H inner steps, fragment f's outer steps offset by
  f·H/F inner steps: outer step k (a daemon step) comes after inner step
  ⌊k·H/F⌋ and synchronises fragment k mod F alone, with an outer
  optimizer (and momentum) of its own, while the other fragments go on
  with their inner steps. The daemon's exchange (``--exchange
  epidemic:S:fragments=F``, which a daemon of the optimizer's own gets)
  sends and averages that fragment alone: the link carries 1/F of the
  model F times as often, a steady stream in place of a burst every H
  steps. The barrier then counts fragment rounds. 1 (the default for a
  daemon of its own; a daemon given by address: its exchange's) is
  DiLoCo. Epidemic exchange only; part of the job's configuration.
- **The outer optimizer** is torch.optim.SGD(lr=outer_lr, momentum=
  outer_momentum, nesterov=True) over a copy of the parameters (θ_outer),
  or what ``outer_optimizer`` builds.
- **A joining worker** takes the job's outer parameters and outer optimizer
  state: its daemon fetches them from a peer's trainer (the trainer API's
  TrainerState, kind "pspnode.DiLoCo/1"); without them (no peer gave
  them) it takes the job's parameters and a fresh outer optimizer, and
  says so.
- **Every worker of a job must run the same configuration:** the model ID
  the daemon checks covers the model's parameter names and shapes, H, the
  inner optimizer's class and constructor hyperparameters, the outer
  optimizer's, the compression and the fragments, so a worker with another is refused
  (DiLoCoMismatch) before it publishes anything.

It is a torch.optim.Optimizer: ``param_groups``, ``state`` and
``defaults`` are the inner optimizer's (schedulers set the inner rates),
and ``state_dict()`` holds the inner state, the outer optimizer's, θ_outer
and the counts.
"""

import copy
import logging
import math
import time
from typing import Callable, Optional, Sequence

import torch

from pspnode.client import model_id_of
from pspnode._diloco_config import (COMPRESSIONS, _default_compression, _default_fragments,  # noqa: F401
                                    _encoding_of, _fragments_of, _spec, _with_exchange, describe_optimizer)
from pspnode._diloco_state import STATE_KIND, load_wire_state, wire_state, wire_view
from pspnode._outer import Outer, fragment_ranges, pieces
from pspnode._params import nonfinite_grad as _nonfinite_grad
from pspnode._params import wraps_inner as _wraps_inner
from pspnode._session import Reset, Session
from pspnode.errors import ApiVersionMismatch, BadUpdate, DaemonUnavailable, ModelMismatch, SessionLost
from pspnode.trainer.v3 import trainer_pb2 as pb

log = logging.getLogger("pspnode")

# The outer step's algorithm, in the model ID: a worker of another version
# (whose outer step combines the exchange's models otherwise) is refused.
_ALGORITHM = "local-outer-qg/3"
class DiLoCoMismatch(ModelMismatch):
    """The daemon refused this worker: its model or its DiLoCo
    configuration (H, the inner or the outer optimizer) is not the job's."""


@_wraps_inner("pspnode.DiLoCo", "inner optimizer")
class DiLoCo(Session):
    """DiLoCo over a pspnode job: ``optimizer`` is the inner optimizer (any
    torch.optim.Optimizer over the model's parameters), H the inner steps
    per outer step.

    daemon: a running daemon's trainer address ("unix:PATH"); without it,
    ``job`` starts a daemon of the optimizer's own, as pspnode.Optimizer
    does (bootstrap: "HOST:PORT", the same on every worker, or multiaddrs;
    swarm_key, listen, identity, daemon_args, pspnode_bin, start_timeout).
    model: the module (recommended: parameter names and order). outer_lr, outer_momentum, outer_nesterov: the outer SGD's
    (DiLoCo's 0.7, 0.9, True); outer_optimizer: instead, a function of the
    list of outer parameters that returns the outer optimizer. model_name:
    the model's name (default its class name). reconnect: when the daemon
    goes away, connect again at the next outer step (the round's inner
    steps are dropped) or raise SessionLost. on_outer_step: called after
    each outer step with (outer step, merged, barrier reply). merge_wait:
    seconds an outer step waits after the barrier for the round's models
    (or deltas) to arrive (see the module comment). compression: "none",
    "bf16", "int8" or "int4", how the epidemic exchange sends the models (default:
    int8 for a daemon of its own, the daemon's encoding for another's; see
    the module comment). fragments: F, the fragments of θ_outer
    synchronised in turn (1 <= F <= H; see the module comment).
    scheduler: a function that builds a
    learning-rate scheduler of the inner rates on this optimizer
    (``lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt,
    T_max=...)``, any but ReduceLROnPlateau), which the optimizer then owns
    (``opt.scheduler``): it steps it once per inner step (step() of this
    optimizer, the torch convention: T_max and step_size count inner
    steps), keeps it at outer step × H + the round's inner steps when the
    outer step jumps to the job's or a round's inner steps are dropped,
    and saves it in its state_dict. on_reset: called with a Reset (its
    step counted in inner steps, outer step × H) when θ_outer and the outer
    step became the job's after the optimizer was built: bring schedulers
    you step yourself there. Other keyword arguments go to Client
    (shared_memory, connect_timeout).
    """

    _what = "pspnode.DiLoCo"
    _inner_what = "inner optimizer"
    _shaped = True

    def __init__(self, optimizer: torch.optim.Optimizer, daemon: Optional[str] = None,
                 model: Optional[torch.nn.Module] = None, *, H: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, outer_nesterov: bool = True,
                 outer_optimizer: Optional[Callable[[list], torch.optim.Optimizer]] = None,
                 job: Optional[str] = None, bootstrap: Sequence[str] = (), listen: Optional[Sequence[str]] = None,
                 identity: Optional[str] = None, daemon_args: Sequence[str] = (), pspnode_bin: Optional[str] = None,
                 start_timeout: float = 60.0, model_name: Optional[str] = None, reconnect: bool = True,
                 on_outer_step: Optional[Callable] = None, merge_wait: float = 1.0, compression: Optional[str] = None,
                 swarm_key: Optional[str] = None, scheduler: Optional[Callable[["DiLoCo"], object]] = None,
                 on_reset: Optional[Callable[[Reset], None]] = None, fragments: Optional[int] = None,
                 **client_args):
        self._prepare(optimizer, daemon, model, job=job, bootstrap=bootstrap, listen=listen, identity=identity,
                      daemon_args=daemon_args, swarm_key=swarm_key, scheduler=scheduler, on_reset=on_reset)
        if isinstance(H, bool) or not isinstance(H, int) or H < 1:
            raise ValueError(f"H={H!r}: H is the number of inner steps between outer steps, a positive integer "
                             "(DiLoCo used 500 for language models; small models 20 to 100)")
        if outer_optimizer is None:
            if not (isinstance(outer_lr, (int, float)) and math.isfinite(outer_lr) and outer_lr > 0):
                raise ValueError(f"outer_lr={outer_lr!r}: want a finite rate > 0 (DiLoCo's is 0.7)")
            if not (isinstance(outer_momentum, (int, float)) and 0 <= outer_momentum < 1):
                raise ValueError(f"outer_momentum={outer_momentum!r}: want 0 <= momentum < 1 (DiLoCo's is 0.9)")
        if compression is not None and compression not in COMPRESSIONS:
            raise ValueError(f"compression={compression!r}: want one of {', '.join(COMPRESSIONS)} (how the "
                             "epidemic exchange sends the models; see the module comment)")
        if not (merge_wait >= 0 and math.isfinite(merge_wait)):
            raise ValueError(f"merge_wait={merge_wait!r}: want seconds >= 0")
        if fragments is None and daemon is None:
            fragments = _default_fragments(daemon_args)
        if fragments is not None and (isinstance(fragments, bool) or not isinstance(fragments, int)
                                      or not 1 <= fragments <= min(H, 256, self.num_params)):
            raise ValueError(f"fragments={fragments!r}: the fragments synchronised in turn, a whole number from 1 "
                             f"to H ({H}), 256 and the parameters ({self.num_params}); 1 synchronises the whole model")
        self.H = H
        self.reconnect = reconnect
        self.on_outer_step = on_outer_step
        self.merge_wait = float(merge_wait)
        self.merged_total = 0
        self._fanout = 1
        # θ_outer: a copy of the parameters, which the outer optimizers
        # step: one flat vector, viewed per parameter (_outer.py).
        with torch.no_grad():
            self._outer_flat = torch.cat([p.detach().reshape(-1) for _, p in self._named]).clone()
        self.outer_params = self._views(self._outer_flat)
        if outer_optimizer is None:
            def outer_optimizer(params):
                return torch.optim.SGD(params, lr=outer_lr, momentum=outer_momentum,
                                       nesterov=outer_nesterov and outer_momentum > 0)
        self._make_outer = outer_optimizer
        self._cut(fragments or 1)
        name = model_name or (type(model).__name__ if model is not None else "model")
        self._name = name
        self.model_name = f"{name}/diloco"
        self.plain_model_id = model_id_of(name, self.shapes)
        if compression is None and daemon is None:
            compression = _default_compression(daemon_args)
        self._configure(compression or "none", self.fragments)
        self.outer_step_count = 0
        self.inner_step_count = 0  # inner steps in the current round, 0 <= . < H
        self.last_merged = 0
        # Where the last session's θ_outer came from: "own", "job
        # parameters" (a fresh outer optimizer) or "peer state".
        self.started_from = "own"
        self._start(daemon, job=job, bootstrap=bootstrap, listen=listen, identity=identity,
                    daemon_args=_with_exchange(list(daemon_args), compression, self.fragments), pspnode_bin=pspnode_bin,
                    swarm_key=swarm_key, start_timeout=start_timeout, client_args=client_args,
                    model_name=self.model_name, model_id=self.model_id, step=0, state_kind=STATE_KIND,
                    state_provider=self._state)

        def configure():
            if compression is None or fragments is None:  # another's daemon: what its exchange sends
                sent = self._daemons_exchange()
                if fragments is None:
                    if not 1 <= _fragments_of(sent) <= min(H, self.num_params):
                        raise ValueError(f"the daemon's exchange, {sent}, cuts the model into more fragments than "
                                         f"H ({H}) or the parameters: give it another --exchange")
                    self._cut(_fragments_of(sent))
                self._configure(compression or _encoding_of(sent), self.fragments)
                self.client.model_id = self.model_id
            log.info("pspnode.DiLoCo: model %s (id %#010x): %d parameters; %s", name, self.model_id,
                     self.num_params, self.config)

        self._open(configure)

    # -- set-up ------------------------------------------------------------

    def _daemons_exchange(self) -> str:
        """The daemon's exchange, by its Status (waiting up to the connect
        timeout for it to answer); "" from a daemon without Status."""
        deadline = time.monotonic() + self.client.connect_timeout
        while True:
            try:
                return self.client.status(timeout=max(1.0, deadline - time.monotonic())).exchange
            except ApiVersionMismatch:
                return ""
            except DaemonUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _cut(self, fragments: int):
        """Cuts θ_outer into fragments, each with an outer optimizer of its
        own (one fragment: one optimizer over the per-parameter views)."""
        self.fragments = max(1, fragments)
        if self.fragments == 1:
            self.outers = [Outer(self._make_outer(self.outer_params), self.outer_params, self.names, 0,
                                 self.num_params)]
        else:
            self.outers = []
            for f, (lo, hi) in enumerate(fragment_ranges(self.num_params, self.fragments)):
                params = [self._outer_flat[lo:hi]]
                self.outers.append(Outer(self._make_outer(params), params, [f"fragment {f}"], lo, hi))
        self.outer = self.outers[0].opt  # the (first) outer optimizer
        self._pieces = [pieces(self._sizes, self._offsets, o.lo, o.hi) for o in self.outers]

    def _configure(self, compression: str, fragments: int):
        """The configuration every worker of the job shares, and the model
        ID that covers it."""
        self.compression = compression
        self.config = (f"H={self.H}; inner {describe_optimizer(self.inner)}; outer {describe_optimizer(self.outer)}; "
                       f"compression {compression}" + (f"; fragments {fragments}" if fragments > 1 else ""))
        self.model_id = model_id_of(f"{self._name}|{STATE_KIND}|{_ALGORITHM}|{self.config}", self.shapes)

    def _mismatch(self, e: ModelMismatch) -> ModelMismatch:
        return DiLoCoMismatch(e.code, self._mismatch_message(e.details), e.call, e.reason, e.metadata)

    def _mismatch_message(self, details: str) -> str:
        return (f"this DiLoCo worker was refused: its model or its DiLoCo configuration is not the job's "
                f"({details}). Its model ID {self.model_id:#010x} covers the model's parameter names and shapes "
                f"(alone: {self.plain_model_id:#010x}) and this configuration: {self.config}. Every worker of a job "
                "must build the same model with the same H, the same inner optimizer (class and constructor "
                "arguments; schedulers may differ), the same outer optimizer, compression and fragments. Nothing "
                "was published, and "
                "the job's parameters are as they were.")

    def _welcome(self, w: "pb.Welcome"):
        self._welcome_session(w)
        if w.exchange.startswith("epidemic:"):
            try:
                self._fanout = max(1, int(w.exchange.split(":")[1]))
            except ValueError:
                self._fanout = 1
        kind, _, sent, frags = _spec(w.exchange)
        if frags != self.fragments:
            raise ValueError(
                f"this DiLoCo synchronises {self.fragments} fragment(s) in turn, and its daemon's exchange, "
                f"{w.exchange}, cuts the model into {frags}: start the daemon with --exchange "
                f"epidemic:S[:ENCODING]:fragments={self.fragments} (fragments need the epidemic exchange), or give "
                "fragments to match. Nothing was published")
        if sent != self.compression:
            raise ValueError(
                f"this DiLoCo's compression is {self.compression!r}, and its daemon's exchange, {w.exchange}, sends "
                f"models {'as float32' if sent == 'none' else 'in ' + sent}: start the daemon with --exchange "
                f"epidemic:S{'' if self.compression == 'none' else ':' + self.compression} (compression applies "
                "to the epidemic exchange's models only), or give compression to match. Nothing was published")
        params = self.client.welcome_params()
        state = self.client.welcome_state()
        with self._lock, torch.no_grad():
            took = False
            if state is not None:
                try:
                    load_wire_state(self, state.data, params)
                    took = True
                    log.info("pspnode.DiLoCo: starting from the job's outer parameters and outer optimizer state "
                             "(%s, outer step %d) at outer step %d", w.state_source, state.step, w.step)
                except ValueError as e:
                    log.warning("pspnode.DiLoCo: the outer state %s gave is not usable (%s): taking the job's "
                                "parameters with a fresh outer optimizer", w.state_source, e)
            if not took and params is not None:
                self._assign(torch.from_numpy(params.copy()), self.outer_params)
                for o in self.outers:
                    o.opt.state.clear()
                log.warning("pspnode.DiLoCo: starting from the job's parameters (%s) at outer step %d, with a fresh "
                            "outer optimizer: %s", w.params_source, w.step,
                            "its state was not usable" if state is not None else "no peer gave its outer state")
            self.started_from = "peer state" if took else "job parameters" if params is not None else "own"
            if took or params is not None:
                for (_, p), o in zip(self._named, self.outer_params):
                    p.copy_(o)
                self.inner_step_count = 0
            asked, self.outer_step_count = self.client.start_step, int(w.step)
        if self._built and w.step != asked:
            self._jumped(Reset(step=self._synced(int(w.step)), lineage="",
                               reason=f"resumed into the job at its outer step {w.step} (this worker's was {asked}): "
                                      "θ_outer and the outer step are the job's"))
        elif self._built:
            self._sync_scheduler()
        log.info("pspnode.DiLoCo: job %s, barrier %s (on outer steps), exchange %s, H=%d, outer step %d",
                 w.job, w.barrier, w.exchange, self.H, w.step)

    # -- vectors -----------------------------------------------------------

    def _flat_outer(self) -> torch.Tensor:
        return torch.cat([o.detach().reshape(-1).cpu() for o in self.outer_params])

    def _params(self):
        """θ_outer, for a peer's model fetch (the client's thread)."""
        with self._lock, torch.no_grad():
            return self.outer_step_count, self._flat_outer().numpy()

    def _state(self):
        """The outer parameters and optimizer state, for a joining peer:
        a view that gives any range of _wire_state's bytes without making
        the whole (a peer's daemon fetches a large state a chunk at a
        time)."""
        with self._lock, torch.no_grad():
            return self.outer_step_count, wire_view(self)

    def _wire_state(self) -> bytes:
        return wire_state(self)

    # -- torch.optim.Optimizer ---------------------------------------------
    # (param_groups, state, defaults and add_param_group: _wraps_inner)

    def state_dict(self):
        """The inner optimizer's state_dict, plus "diloco": the outer
        optimizer's state_dict, θ_outer, the outer steps, the inner steps of
        the current round, and the model and configuration they belong to.
        Save it with the model's state_dict (θ_i, mid-round)."""
        sd = self.inner.state_dict()
        with self._lock:
            outer = [copy.deepcopy(o.opt.state_dict()) for o in self.outers]
            sd["diloco"] = {"outer": outer[0] if self.fragments == 1 else outer,
                            "outer_params": [o.detach().clone() for o in self.outer_params],
                            "outer_step": self.outer_step_count, "inner_step": self.inner_step_count,
                            "H": self.H, "model_id": self.model_id, "model_name": self.model_name,
                            "config": self.config}
            if self.scheduler is not None:
                sd["diloco"]["scheduler"] = self.scheduler.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        """Loads what state_dict() saved (load the model's weights too). An
        outer step other than the session's opens a new session at it,
        whose Welcome may give the job's state instead if the job has gone
        further."""
        sd = dict(state_dict)
        d = sd.pop("diloco", None)
        if d is None:
            raise ValueError("not a pspnode.DiLoCo state_dict (no 'diloco' entry)")
        if d.get("model_id") != self.model_id:
            raise ValueError(f"this state_dict is of model {d.get('model_name')!r} with configuration "
                             f"{d.get('config')!r} (id {d.get('model_id', 0):#010x}); this optimizer's is "
                             f"{self.model_name!r}, {self.config!r} (id {self.model_id:#010x})")
        outer_params = d["outer_params"]
        if [tuple(t.shape) for t in outer_params] != [s for _, s in self.shapes]:
            raise ValueError("the state_dict's outer parameters have other shapes than the model's")
        self.inner.load_state_dict(sd)
        if self.scheduler is not None:
            if "scheduler" in d:
                self.scheduler.load_state_dict(d["scheduler"])
            self._sched_fresh = "scheduler" in d  # else built anew at the sync below
        with self._lock, torch.no_grad():
            for o, osd in zip(self.outers, [d["outer"]] if self.fragments == 1 else d["outer"]):
                o.opt.load_state_dict(osd)
            for o, t in zip(self.outer_params, outer_params):
                o.copy_(t)
            self.inner_step_count = int(d["inner_step"])
            step = int(d["outer_step"])
        if step != self.outer_step_count:
            log.info("pspnode.DiLoCo: resuming at outer step %d (was %d): a new session", step, self.outer_step_count)
            self.outer_step_count = step
            self.client.start_step = step
            inner_step = self.inner_step_count
            self._welcome(self._connect())
            if self.client.welcome_params() is None:
                self.inner_step_count = inner_step  # our own state: mid-round as saved
        self._sync_scheduler()

    def __repr__(self):
        return (f"pspnode.DiLoCo({self.inner!r},\n  model {self.model_name!r} ({self.num_params} parameters), "
                f"{self.config}, outer step {self.outer_step_count}, daemon {self.client.address})")

    # -- training ----------------------------------------------------------

    def outer_parameters(self):
        """θ_outer, one tensor per parameter (the outer optimizer's)."""
        return self.outer_params

    def _step(self, closure):
        """An inner step; after every H-th, the outer step: publish, barrier
        (on outer steps), merge, outer optimizer step. Returns the inner
        step's loss (the closure's)."""
        self._check()
        try:
            loss = self._inner_then_outer(closure)
        except FloatingPointError:  # the round's inner steps may have been dropped
            self._sync_scheduler()
            raise
        self._step_scheduler()
        return loss

    def _inner_then_outer(self, closure):
        if closure is None and (bad := _nonfinite_grad(self._named)) is not None:
            n = self.outer_step_count + 1
            with self._lock, torch.no_grad():
                diverged = self._first_bad([p for _, p in self._named])
                if diverged is not None:  # the parameters themselves: this round's training diverged
                    self._restore_round()
            if diverged is not None:
                raise FloatingPointError(
                    f"outer step {n}: parameter {diverged[0]!r}[{diverged[1]}] is {diverged[2]}, so the gradient "
                    f"is not finite: the inner training diverged from θ_outer. Nothing was published; the model is "
                    f"back at θ_outer of outer step {self.outer_step_count} (the inner optimizer's state may hold "
                    "non-finite values: reload it)")
            raise FloatingPointError(
                f"inner step {self.inner_step_count + 1} of outer step {n}: the gradient of parameter {bad!r} is "
                "not finite (NaN or ±Inf): the step was skipped before the inner optimizer took it, so its state "
                "and the parameters are as they were; the next step with finite gradients trains")
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.inner_step_count += 1
        if self.inner_step_count >= self._gap(self.outer_step_count):
            self._outer_step()
        return loss

    def _gap(self, k: int) -> int:
        """The inner steps between outer steps k and k + 1: H, or with F
        fragments their share, so that outer step k comes after inner step
        ⌊k·H/F⌋ (fragment k mod F's, every H inner steps)."""
        return (k + 1) * self.H // self.fragments - self._synced(k)

    def _synced(self, k: int) -> int:
        """The inner steps before outer step k's: ⌊k·H/F⌋."""
        return k * self.H // self.fragments

    def _restore_round(self):
        """Back to θ_outer: the round's inner steps are dropped."""
        with torch.no_grad():
            for (_, p), o in zip(self._named, self.outer_params):
                p.copy_(o)
        self.inner_step_count = 0

    def _first_bad(self, tensors, bound=float("inf"), names=None):
        """(name, index, value) of the first value not finite or beyond
        bound, None if none."""
        for name, t in zip(self.names if names is None else names, tensors):
            ok = torch.isfinite(t) if math.isinf(bound) else (t.abs() <= bound)
            if not bool(ok.all()):
                i = int((~ok).reshape(-1).nonzero()[0])
                return name, i, float(t.reshape(-1)[i])
        return None

    def _outer_step(self):
        n = self.outer_step_count + 1
        f = n % self.fragments  # the fragment this outer step synchronises (the daemon's cut: step mod F)
        outer = self.outers[f]
        with self._lock, torch.no_grad():
            params = [p for _, p in self._named]
            bad = self._first_bad(params)
            if bad is not None:
                big = max(float(o.abs().max()) for o in self.outer_params)
                self._restore_round()
                raise FloatingPointError(
                    f"outer step {n}: after {self.H} inner steps parameter {bad[0]!r}[{bad[1]}] is {bad[2]}, so the "
                    f"pseudo-gradient is not finite: the inner training diverged from θ_outer (largest magnitude "
                    f"{big:.3g}; a diverging outer learning rate, {self._outer_lr()}, or the inner one?). Nothing "
                    "was published; the model is back at θ_outer of outer step "
                    f"{self.outer_step_count} (the inner optimizer's state may hold non-finite values: reload it)")
            model_kind = self.update_kind == pb.UPDATE_KIND_MODEL
            saved = outer.save()
            prev = outer.buffers() if model_kind else None
            # The local outer step on this worker's own pseudo-gradient
            # (see the module comment); under epidemic the stepped θ_outer
            # is published for the exchange to average (with fragments,
            # its fragment f alone goes), under gossip its move × 1/N̂ for
            # every peer to add.
            self._outer_apply(outer, [o - p for o, p in zip(outer.params, self._inner_of(f))], n, saved)
            ups = self._region(self.client.update_buffer())
            scale = self.lr_scale
            for i, (o, u) in enumerate(zip(self.outer_params, ups)):
                if model_kind:
                    u.copy_(o)
                    continue
                b = saved[0][i]  # gossip: one fragment, the whole model
                if u.device == o.device:
                    torch.sub(o, b, out=u)
                else:
                    u.copy_(o - b)
                if scale != 1.0:
                    u.mul_(scale)
        ev, self._eval = self._eval, None
        loss, acc = ev if ev is not None else (None, None)
        try:
            if self.merge_wait > 0:
                r = self._step_waiting(n, loss, acc, self.merge_wait, self._expected)
            else:
                r = self.client.step(n, loss=loss, accuracy=acc)
        except BadUpdate as e:
            with self._lock:
                outer.load(saved)
                self._restore_round()
            raise FloatingPointError(
                f"outer step {n}: the daemon refused the update ({e.details}): after {self.H} inner steps the "
                f"parameters are beyond the job's bound (a diverging outer learning rate, {self._outer_lr()}, or "
                f"inner one?). Nothing was published; the model is back at θ_outer of outer step "
                f"{self.outer_step_count}") from e
        except SessionLost as e:
            if not self.reconnect or self._closed:
                raise
            log.warning("pspnode.DiLoCo: the daemon went away (%s): this round's inner steps are dropped; "
                        "connecting again", e.details)
            with self._lock:
                outer.load(saved)
                self._restore_round()
            self.client.start_step = self.outer_step_count
            self._welcome(self._connect())
            return
        if r.reset is not None:
            self._reset(r.reset)
            return
        if r.barrier is not None:
            self.population = r.barrier.population
            if r.barrier.lr_scale > 0:
                self.lr_scale = r.barrier.lr_scale
        self.last_merged = r.merged
        self.merged_total += r.merged
        with self._lock, torch.no_grad():
            merged = self._region(r.update) if r.merged else None
            if model_kind:
                # θ_outer ← the average of this worker's stepped model and
                # the peers' (the daemon's, block by block; with fragments,
                # of fragment f: the rest of the vector is ours as sent).
                if merged is not None:
                    for i, a, b in self._pieces[f]:
                        self.outer_params[i].view(-1)[a:b].copy_(merged[i].reshape(-1)[a:b].to(self._device))
                outer.quasi_global(saved[0], prev)
            else:
                # θ_outer ← θ_outer + (own move × 1/N̂ + Σ peers' moves × 1/N̂)
                for i, (o, b) in enumerate(zip(self.outer_params, saved[0])):
                    o.sub_(b).mul_(scale).add_(b)
                    if merged is not None:
                        o.add_(merged[i].to(o.device).view(o.shape))
            for i, a, b in self._pieces[f]:  # the next round of fragment f starts at θ_outer
                params[i].view(-1)[a:b].copy_(self.outer_params[i].view(-1)[a:b])
            self.outer_step_count = n
            self.inner_step_count = 0
        if self.on_outer_step is not None:
            self.on_outer_step(n, r.merged, r.barrier)

    def _inner_of(self, f: int):
        """θ_i where outer optimizer f steps θ_outer: the parameters, or
        fragment f's values of them (a copy)."""
        params = [p for _, p in self._named]
        if self.fragments == 1:
            return params
        return [torch.cat([params[i].detach().reshape(-1)[a:b] for i, a, b in self._pieces[f]])]

    def _outer_apply(self, outer: Outer, grads, n, saved):
        """The outer optimizer's step on grads (θ_outer's gradient), before
        anything is published; if it leaves θ_outer beyond the job's bound,
        θ_outer and its state are put back as saved, the model back at
        θ_outer, and FloatingPointError says so. The lock is held."""
        outer.step(grads)
        bad = self._first_bad(outer.params, self.max_abs, outer.names)
        if bad is None:
            return
        outer.load(saved)
        self._restore_round()
        raise FloatingPointError(
            f"outer step {n}: the outer optimizer made parameter {bad[0]!r}[{bad[1]}] {bad[2]:.4g}, not "
            f"finite or beyond the job's bound of {self.max_abs:g}: the outer learning rate "
            f"({self._outer_lr()}) diverges. θ_outer and the outer optimizer's state are as before this "
            "step and the model is back at θ_outer; nothing was published")

    def _expected(self) -> int:
        """How many peers' updates one outer step should bring: S under
        epidemic:S, every peer's under gossip (N̂ − 1)."""
        peers = max(0, int(round(self.population)) - 1)
        if self.update_kind == pb.UPDATE_KIND_MODEL:
            return min(self._fanout, peers)
        return peers

    def _outer_lr(self):
        lrs = sorted({float(g.get("lr", float("nan"))) for o in self.outers for g in o.opt.param_groups})
        return "outer lr " + ", ".join(f"{lr:g}" for lr in lrs)

    def _reset(self, reset: "pb.Reset"):
        """The daemon moved to another lineage of the job: its parameters
        and step become θ_outer's; the outer and inner states stay."""
        vec = self.client.reset_params(reset)
        with self._lock, torch.no_grad():
            self._assign(torch.from_numpy(vec.copy()), self.outer_params)
            self._restore_round()
            self.outer_step_count = int(reset.step)
        log.warning("pspnode.DiLoCo: the daemon moved to lineage %s of the job (%s): θ_outer and the outer step "
                    "(%d) are the job's now", reset.lineage[:16], reset.reason, reset.step)
        self._jumped(Reset(step=self._synced(int(reset.step)), lineage=reset.lineage, reason=reset.reason))

    def checkpoint(self) -> str:
        """Writes θ_outer to the daemon's checkpoint file (pspnode run
        --checkpoint); the outer optimizer's state is not in it (save
        state_dict() for that)."""
        step, vec = self._params()
        return self.client.checkpoint(step, vec)

    def _job_step(self) -> int:
        return self.outer_step_count

    def _sched_step(self) -> int:
        """The scheduler's step: the inner steps θ_i has taken."""
        return self._synced(self.outer_step_count) + self.inner_step_count
