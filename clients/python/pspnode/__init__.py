"""pspnode: drive a pspnode daemon (decentralised data-parallel training
with probabilistic barriers) from a Python training loop.

- ``pspnode.Optimizer`` is a torch.optim.Optimizer that wraps the user's
  own: ``opt.step()`` runs the local step, publishes it, waits at the
  barrier and merges the peers' updates (needs torch). Given ``job=`` it
  starts its own daemon (``pspnode run --trainer``) and stops it when it
  closes; given a daemon address it connects to a daemon started beside it.
- ``pspnode.DiLoCo`` is DiLoCo over a pspnode job: H steps of the user's
  inner optimizer, then an outer step (publish, barrier on outer steps,
  merge, outer Nesterov step on the averaged pseudo-gradient); with
  ``fragments=F``, streaming DiLoCo (a fragment of the model a round).
- ``pspnode.Client`` is the low-level client of the trainer API (numpy and
  grpcio only); ``pspnode.Daemon`` starts a daemon as a child process.
- Errors are ``pspnode.DaemonError`` subclasses, chosen by the reason the
  daemon gives (``.reason``, ``.metadata``), not by the message's text.
"""

from .client import Client, PullResult, StepResult, model_id_of
from .daemon import Daemon, find_binary
from .errors import (ApiVersionMismatch, BadEvaluation, BadTensor, BadUpdate, BootstrapError, DaemonError,
                     DaemonNotReady, DaemonStartError, DaemonUnavailable, ModelMismatch, NoCheckpoint, NotADaemon,
                     SessionLost, StepOrderError, TrainerBusy, TrainerRefused)

__all__ = ["Optimizer", "Reset", "DiLoCo", "DiLoCoMismatch", "Client", "Daemon", "find_binary", "StepResult",
           "PullResult", "model_id_of",
           "DaemonError", "DaemonUnavailable", "NotADaemon", "DaemonStartError", "BootstrapError", "TrainerRefused", "TrainerBusy",
           "ApiVersionMismatch", "ModelMismatch", "SessionLost", "StepOrderError", "BadUpdate", "BadTensor",
           "BadEvaluation", "NoCheckpoint", "DaemonNotReady"]

_TORCH = ("Optimizer", "Reset")
_DILOCO = ("DiLoCo", "DiLoCoMismatch")


def __getattr__(name):
    # torch is imported only by those who use the optimizer.
    if name in _TORCH:
        from . import optim
        return getattr(optim, name)
    if name in _DILOCO:
        from . import diloco
        return getattr(diloco, name)
    raise AttributeError(f"module 'pspnode' has no attribute {name!r}")


def __dir__():
    # dir() and help() list the optimizer too (loading torch when asked).
    return sorted(set(globals()) | set(_TORCH) | set(_DILOCO))
