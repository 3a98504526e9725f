"""pspnode: drive a pspnode daemon (decentralised data-parallel training
with probabilistic barriers) from a Python training loop.

- ``pspnode.Optimizer`` wraps a torch.optim optimizer: ``opt.step()`` runs
  the local step, publishes it, waits at the barrier and merges the peers'
  updates (needs torch).
- ``pspnode.Client`` is the low-level client of the trainer API (numpy and
  grpcio only).

Start a daemon with ``pspnode run --trainer unix:/tmp/pspnode.sock`` and
point the optimizer or client at "unix:/tmp/pspnode.sock".
"""

from .client import (BadUpdate, Client, DaemonError, ModelMismatch, SessionLost, StepOrderError,
                     StepResult, TrainerRefused, model_id_of)

__all__ = ["Client", "Optimizer", "DaemonError", "ModelMismatch", "TrainerRefused", "SessionLost",
           "StepOrderError", "BadUpdate", "StepResult", "model_id_of"]


def __getattr__(name):
    # torch is imported only by those who use the optimizer.
    if name == "Optimizer":
        from .optim import Optimizer
        return Optimizer
    raise AttributeError(name)
