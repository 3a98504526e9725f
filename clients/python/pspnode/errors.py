"""The errors of the pspnode client.

Every error a daemon returns is a ``DaemonError`` whose ``reason`` is the
ErrorInfo reason the daemon put in the gRPC status details (an
``ErrorReason`` of the trainer API without its prefix, e.g.
"MODEL_MISMATCH") and whose ``metadata`` holds that error's facts (for a
model mismatch, both models' IDs and sizes). The class follows the reason,
never the message's text.
"""

from typing import Dict, Optional

import grpc

from pspnode.rpc import status_pb2 as rpc_pb

ERROR_DOMAIN = "trainer.pspnode"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class DaemonError(Exception):
    """A pspnode daemon refused a call, or could not be reached.

    code: the gRPC status code (None when no call was made); details: the
    daemon's message; reason: the trainer API's ErrorReason name ("" when
    the daemon sent none, e.g. when nothing answered); metadata: the
    error's facts; call: which call failed."""

    def __init__(self, code: Optional[grpc.StatusCode], details: str, call: str = "", reason: str = "",
                 metadata: Optional[Dict[str, str]] = None):
        self.code, self.details, self.call = code, details, call
        self.reason, self.metadata = reason, dict(metadata or {})
        what = f"{call}: " if call else ""
        tag = reason or (code.name if code else "")
        super().__init__(f"{what}{details}" + (f" ({tag})" if tag else ""))


class DaemonUnavailable(DaemonError):
    """No daemon answered at the address, or it had not joined its job
    within the time allowed. No session existed: nothing was lost."""


class NotADaemon(DaemonUnavailable):
    """Something accepts connections at the address but does not answer as
    a pspnode daemon (gRPC over HTTP/2) within the client's deadline: an
    HTTP/1 server, the daemon's --http port, another program."""


class DaemonStartError(DaemonUnavailable):
    """The daemon this client started could not start or join: the message
    says why (its last log lines, a port in use, the bootstrap peers not
    answering, the binary missing)."""


class BootstrapError(DaemonStartError):
    """The daemon could not join its job through the bootstrap addresses it
    was given. ``reason`` says which way: "NO_PEER_AT_ADDRESS" (nothing
    answered there, or what answered is no libp2p node of this job's swarm
    key: another key, none, or another program) or "OTHER_JOB" (a pspnode
    node answered, of another job); ``metadata["bootstrap"]`` is the
    addresses. Nothing was started: the worker's state is as it was."""


class TrainerRefused(DaemonError):
    """The daemon refused this trainer's Hello (API version, dtype, sizes),
    or another trainer is connected (``TrainerBusy``)."""


class TrainerBusy(TrainerRefused):
    """Another trainer is connected to the daemon (one per daemon);
    ``metadata["connected_client"]`` names it."""


class ApiVersionMismatch(TrainerRefused):
    """The daemon speaks another version of the trainer API: upgrade the
    client or the daemon so that they come from one release."""


class ModelMismatch(DaemonError):
    """The daemon or its job runs another model than this trainer. The
    metadata names both: model_name, model_id, num_params (this trainer's)
    and other_model_id, other_num_params (and other_model_name, peer)."""


class SessionLost(DaemonError):
    """The session ended: the daemon stopped or restarted. Connect again."""


class StepOrderError(DaemonError):
    """A barrier or a step out of order."""


class BadUpdate(DaemonError):
    """The daemon refused an update (a value not finite or beyond its
    bound); nothing of it reached a peer and the step was not counted."""


class BadTensor(BadUpdate):
    """A vector of the wrong length, or in the wrong place of the shared
    file: a bug of the caller's."""


class BadEvaluation(DaemonError):
    """A held-out evaluation the daemon refused (a loss not finite, an
    accuracy outside [0, 1])."""


class NoCheckpoint(DaemonError):
    """Checkpoint on a daemon started without --checkpoint."""


class DaemonNotReady(DaemonError):
    """The session could not start yet (the job is ahead and no peer gave
    its model); connecting again may succeed."""


_BY_REASON = {
    "MODEL_MISMATCH": ModelMismatch,
    "TRAINER_CONNECTED": TrainerBusy,
    "BAD_HELLO": TrainerRefused,
    "API_VERSION": ApiVersionMismatch,
    "PROTOCOL": TrainerRefused,
    "NO_SESSION": SessionLost,
    "DAEMON_STOPPING": SessionLost,
    "STEP_ORDER": StepOrderError,
    "BAD_VALUE": BadUpdate,
    "BAD_TENSOR": BadTensor,
    "BAD_EVALUATION": BadEvaluation,
    "NO_CHECKPOINT": NoCheckpoint,
    "NOT_READY": DaemonNotReady,
}


def error_info(e: grpc.RpcError):
    """(reason, metadata) of the ErrorInfo in an RPC error's status details,
    ("", {}) when it has none."""
    try:
        trailers = e.trailing_metadata() or ()
    except Exception:  # an error raised before any call was made
        return "", {}
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        try:
            st = rpc_pb.Status.FromString(value)
        except Exception:
            return "", {}
        for d in st.details:
            if d.type_url == _ERROR_INFO:
                info = rpc_pb.ErrorInfo.FromString(d.value)
                if info.domain in ("", ERROR_DOMAIN):
                    return info.reason, dict(info.metadata)
    return "", {}


def from_rpc_error(e: grpc.RpcError, call: str, in_session: bool = True) -> DaemonError:
    """The DaemonError of a failed call: by the ErrorInfo's reason; without
    one (nothing answered, a deadline), by the gRPC code: UNAVAILABLE is a
    lost session when one was open, else no daemon at all."""
    code, details = e.code(), e.details() or ""
    reason, meta = error_info(e)
    cls = _BY_REASON.get(reason)
    if cls is None:
        if code == grpc.StatusCode.UNAVAILABLE or (code == grpc.StatusCode.CANCELLED and in_session):
            cls = SessionLost if in_session else DaemonUnavailable
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            cls = ApiVersionMismatch
        else:
            cls = DaemonError
    return cls(code, details, call, reason, meta)
