"""The low-level client of a pspnode daemon's trainer API (version 3).

A daemon started with ``pspnode run --trainer unix:PATH`` keeps the job's
membership, population estimate, barrier and exchange; this client drives
it from a training loop. It needs numpy and grpcio only (Debian:
python3-numpy, python3-grpcio, python3-protobuf).

    c = Client("unix:/tmp/pspnode.sock", model_name="mlp", num_params=n,
               model_id=model_id_of("mlp", shapes))
    w = c.connect()                 # waits for the daemon and its job
    if w.has_params: params[:] = c.welcome_params()
    step = w.step
    while training:
        ...compute, then write the update: under the epidemic exchange
        (w.update_kind == UPDATE_KIND_MODEL) the parameters after the step,
        under gossip the step's delta:
        c.update_buffer()[:] = update         # the shared region when there is one
        r = c.step(step + 1)                  # publish, barrier for the next, pull
        step += 1
        if r.reset is not None:               # the daemon moved to another lineage
            params[:] = c.reset_params(r.reset); step = r.reset.step
        elif r.merged and model_kind: params[:] = r.update   # the average to take
        elif r.merged: params += r.update                    # the peers' deltas to add
    c.close()

Vectors are float32, in one fixed order of the parameters chosen by the
trainer (the same on every worker of a job). With shared memory one region
of a file both sides map carries them all (region()): the trainer writes
its update there, and the daemon leaves there what the trainer takes. A
trainer may keep its parameters in the region under the epidemic exchange,
so that a step copies nothing: the daemon averages them in place.
"""

import hashlib
import ipaddress
import logging
import mmap
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import grpc
import numpy as np

from pspnode.errors import (DaemonError, DaemonNotReady, DaemonStartError, DaemonUnavailable, NotADaemon,
                            SessionLost, TrainerBusy, from_rpc_error)
from pspnode.trainer.v3 import trainer_pb2 as pb
from pspnode.trainer.v3 import trainer_pb2_grpc as pb_grpc

log = logging.getLogger("pspnode")

API_VERSION = pb.API_VERSION_3
CLIENT_NAME = "pspnode-python/3"
SESSION_KEY = "pspnode-session"

# How often the client repeats the daemon's reason for not being ready: at
# once, then only when it changes (at most every 10 s) or every 60 s.
_WAIT_LOG_FIRST, _WAIT_LOG_CHANGED, _WAIT_LOG_SAME = 0.0, 10.0, 60.0
_REASON_CHARS = 160
# How long something that accepts connections at the address may take to
# answer as a gRPC server (HTTP/2 settings) before it is taken for another
# program; a daemon answers within milliseconds.
_HANDSHAKE_S = 5.0


def model_id_of(name: str, shapes) -> int:
    """The model ID every worker of a job derives alike: the first four
    bytes (big-endian) of SHA-256 of "name|shape,shape,...", where each
    shape is "pname:d0xd1x..." in parameter order. Never 0."""
    text = name + "|" + ",".join(
        f"{pname}:{'x'.join(str(d) for d in dims)}" for pname, dims in shapes)
    v = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
    return v or 1


def grpc_target(address: str) -> str:
    """The gRPC target of a daemon address: unix:PATH or tcp:HOST:PORT."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if not path:
            raise ValueError("unix: needs a path, e.g. unix:/tmp/pspnode.sock")
        return "unix:" + os.path.abspath(path)
    if address.startswith("tcp:"):
        hostport = address[len("tcp:"):]
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.isdigit() or not _loopback(host.strip("[]")):
            raise ValueError(f"{address!r}: a tcp: daemon address must be on this machine's loopback "
                             "(tcp:127.0.0.1:PORT or tcp:[::1]:PORT): the trainer API has neither authentication "
                             "nor encryption, and `pspnode run --trainer` listens on loopback only. Run the trainer "
                             "on the daemon's machine, or forward a local port to it (ssh -L)")
        return hostport
    raise ValueError(f"{address!r}: want unix:PATH or tcp:127.0.0.1:PORT")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _accepts(address: str) -> bool:
    """Whether something accepts a connection at a daemon address."""
    target = grpc_target(address)
    try:
        if target.startswith("unix:"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(target[len("unix:"):])
        else:
            host, _, port = target.rpartition(":")
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False


def short_reason(reason: str, limit: int = _REASON_CHARS) -> str:
    """A daemon's reason on one line of at most limit characters: its
    beginning (what failed) and its end (the cause: a Go error ends with
    its innermost one), the middle cut at word boundaries (the whole goes
    to the debug log and into exceptions)."""
    one = " ".join(reason.split())
    if len(one) <= limit:
        return one
    head_n = (limit - 3) * 2 // 5
    tail_n = limit - 3 - head_n
    head = one[:head_n]
    if " " in head[head_n // 2:]:
        head = head[:head.rindex(" ")]
    tail = one[-tail_n:]
    if " " in tail[:tail_n // 2]:
        tail = tail[tail.index(" ") + 1:]
    return f"{head} … {tail}"


class _WaitLog:
    """Says why the daemon is not ready: at once, then again only when the
    reason changes (at most every 10 s) or every 60 s, on one short line."""

    def __init__(self, address: str):
        self.address, self.last, self.at, self.start = address, None, None, time.monotonic()

    def __call__(self, reason: str, waited: float):
        now = time.monotonic()
        log.debug("pspnode daemon at %s not ready (waited %.0f s): %s", self.address, waited, reason)
        key = short_reason(reason, 60)
        if self.at is not None:
            since = now - self.at
            if (key == self.last and since < _WAIT_LOG_SAME) or (key != self.last and since < _WAIT_LOG_CHANGED):
                return
        self.last, self.at = key, now
        if reason.startswith("fetching the job's model"):  # progress, not trouble
            log.info("pspnode: %s (%.0f s)", reason, waited)
            return
        log.warning("pspnode daemon at %s not ready after %.0f s: %s", self.address, waited, short_reason(reason))
        if reason != short_reason(reason):
            log.info("pspnode: the daemon's whole reason: %s", reason)


@dataclass
class StateOf:
    """A peer's trainer state (welcome_state): its kind, the steps it has
    taken, and its bytes."""
    kind: str
    step: int
    data: bytearray


@dataclass
class StepResult:
    """What Client.step returns: the barrier for the next step, and what
    to add to the parameters (``update`` is None when ``merged`` is 0).
    ``update`` may be a view of shared memory valid until the next pull
    or step: add it, do not keep it. ``reset``, when not None, says the
    daemon moved to another lineage of the job: take its parameters
    (``Client.reset_params``) and its step instead (update is then None)."""
    barrier: "pb.BarrierReply"
    merged: int
    update: Optional[np.ndarray]
    reset: Optional["pb.Reset"] = None


@dataclass
class PullResult:
    """What Client.pull returns (see StepResult). It unpacks as
    ``merged, update`` too."""
    merged: int
    update: Optional[np.ndarray]
    reset: Optional["pb.Reset"] = None

    def __iter__(self):
        return iter((self.merged, self.update))


class Client:
    """One trainer's session with a pspnode daemon.

    address: "unix:PATH" or "tcp:127.0.0.1:PORT" (pspnode run --trainer).
    model_name, num_params, model_id: the model (model_id_of derives the
    ID from the parameter shapes). step: the steps the trainer's
    parameters have taken (0 for a fresh model). params_provider: called
    from a background thread with no arguments when a peer fetches the
    model; returns (steps taken, float32 vector). shared_memory: map the
    daemon's shared file for tensors (same machine). connect_timeout:
    seconds to keep trying to reach the daemon and its job (None: for
    ever, logging why). alive: called while waiting; it raises to stop the
    wait (the daemon this process started has exited). state_kind: the
    kind of state the trainer keeps beside its parameters (e.g.
    "pspnode.DiLoCo/1"; "" for none), and state_provider, called from a
    background thread when a peer's daemon asks for it (a worker joining
    the job): returns (steps taken, bytes). A session that starts from the
    job's parameters then gets a peer's state too (welcome_state()).
    """

    def __init__(self, address: str, *, model_name: str, num_params: int, model_id: int,
                 step: int = 0, params_provider: Optional[Callable[[], Tuple[int, np.ndarray]]] = None,
                 shared_memory: bool = True, connect_timeout: Optional[float] = None,
                 max_message_bytes: int = 1 << 30, client_name: Optional[str] = None,
                 alive: Optional[Callable[[], None]] = None, state_kind: str = "",
                 state_provider: Optional[Callable[[], Tuple[int, bytes]]] = None):
        self.address = address
        grpc_target(address)  # refuse a bad address at once
        self.model_name, self.num_params, self.model_id = model_name, int(num_params), int(model_id)
        self.start_step = int(step)
        self.params_provider = params_provider
        self.state_kind, self.state_provider = state_kind, state_provider
        self.shared_memory = shared_memory
        self.connect_timeout = connect_timeout
        self.client_name = client_name or f"{CLIENT_NAME} pid {os.getpid()}"
        self._alive = alive
        self._opts = [("grpc.max_send_message_length", max_message_bytes),
                      ("grpc.max_receive_message_length", max_message_bytes)]
        self._channel = None
        self._stub = None
        self._welcome = None
        self._session = ""
        self._md = ()
        self._out = None
        self._reader = None
        self._lost = threading.Event()
        self._lost_why = ""
        self._mm = None
        self._region = None
        self._own_buf = None
        self._closed = False
        self.last_waiting = ""  # the daemon's last reason for not being ready

    # -- the session -------------------------------------------------------

    def connect(self) -> "pb.Welcome":
        """Opens the session: waits until the daemon is there and has
        joined its job (logging the daemon's reason while it waits), then
        returns its Welcome. Raises ModelMismatch or TrainerRefused when
        the daemon refuses this trainer, DaemonUnavailable when no daemon
        was ready within connect_timeout."""
        deadline = None if self.connect_timeout is None else time.monotonic() + self.connect_timeout
        backoff, waitlog = 0.1, _WaitLog(self.address)
        started = time.monotonic()
        while True:
            try:
                return self._open(deadline, waitlog)
            except (DaemonUnavailable, DaemonNotReady, SessionLost) as e:
                if isinstance(e, (DaemonStartError, NotADaemon)) or e.reason == "TIMEOUT":
                    raise
                why = e.details
            except TrainerBusy as e:
                # After a session of ours, the daemon may still be closing
                # it: a few seconds' grace. A first connect is refused.
                if self._welcome is None or time.monotonic() - started > 5:
                    raise
                why = e.details
            if self._alive is not None:
                self._alive()
            self.last_waiting = why
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise DaemonUnavailable(grpc.StatusCode.UNAVAILABLE,
                                        f"no pspnode daemon ready at {self.address} within {self.connect_timeout} s: {why}",
                                        "connect")
            waitlog(f"no daemon answers (start one with `pspnode run --trainer {self.address}`, or let "
                    f"pspnode.Optimizer start one with job=...): {why}", now - started)
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _open(self, deadline, waitlog) -> "pb.Welcome":
        self._teardown()
        self._channel = grpc.insecure_channel(grpc_target(self.address), options=self._opts)
        self._await_transport(deadline)
        self._stub = pb_grpc.TrainerStub(self._channel)
        self._out = queue.Queue()
        self._lost.clear()
        hello = pb.Hello(api_version=API_VERSION, model_name=self.model_name, model_id=self.model_id,
                         num_params=self.num_params, dtype=pb.DTYPE_FLOAT32, step=self.start_step,
                         client=self.client_name, shared_memory=self.shared_memory, state_kind=self.state_kind)

        def messages(out=self._out):
            yield pb.TrainerMessage(hello=hello)
            while True:
                m = out.get()
                if m is None:
                    return
                yield m

        responses = self._stub.Session(messages())
        try:
            for msg in responses:
                kind = msg.WhichOneof("msg")
                if kind == "waiting":
                    self.last_waiting = msg.waiting.reason
                    waitlog(msg.waiting.reason, msg.waiting.waited_s)
                    if self._alive is not None:
                        try:
                            self._alive()
                        except BaseException:
                            responses.cancel()
                            raise
                    if deadline is not None and time.monotonic() >= deadline:
                        responses.cancel()
                        raise DaemonUnavailable(
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"the daemon at {self.address} had not joined its job after {msg.waiting.waited_s:.0f} s: "
                            f"{msg.waiting.reason}", "connect", "TIMEOUT", {"waiting": msg.waiting.reason})
                elif kind == "welcome":
                    self._take_state(msg.welcome, responses)
                    self._start(msg.welcome, responses)
                    return msg.welcome
        except grpc.RpcError as e:
            self._out.put(None)
            raise from_rpc_error(e, "connect", in_session=False) from None
        raise SessionLost(grpc.StatusCode.UNAVAILABLE, "the daemon closed the session before its Welcome", "connect")

    def _await_transport(self, deadline):
        """Waits until the channel's transport is up: the daemon answered
        HTTP/2's handshake. Raises DaemonUnavailable when nothing listens
        (connect tries again), NotADaemon when something accepts
        connections but does not answer so within _HANDSHAKE_S (an HTTP/1
        server, the daemon's --http port: a call on it would wait for
        ever)."""
        ready, failed = threading.Event(), threading.Event()

        def watch(state):
            if state == grpc.ChannelConnectivity.READY:
                ready.set()
            elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                failed.set()

        self._channel.subscribe(watch, try_to_connect=True)
        try:
            limit = _HANDSHAKE_S if deadline is None else min(_HANDSHAKE_S, max(0.0, deadline - time.monotonic()))
            end = time.monotonic() + limit
            while not ready.wait(0.02):
                if failed.is_set():
                    failed.clear()
                    if not _accepts(self.address):
                        raise DaemonUnavailable(grpc.StatusCode.UNAVAILABLE, f"nothing listens at {self.address}",
                                                "connect")
                if time.monotonic() >= end:
                    if not _accepts(self.address):
                        raise DaemonUnavailable(grpc.StatusCode.UNAVAILABLE, f"nothing listens at {self.address}",
                                                "connect")
                    raise NotADaemon(grpc.StatusCode.UNAVAILABLE,
                                     f"something listens at {self.address} but did not answer as a pspnode daemon "
                                     f"(gRPC over HTTP/2) within {limit:.0f} s: another program, or the daemon's "
                                     "--http port? Give the address of its --trainer flag", "connect", "NOT_A_DAEMON",
                                     {"address": self.address})
        finally:
            self._channel.unsubscribe(watch)

    def _take_state(self, w, responses):
        """Collects the peer's state Welcome began: its first chunk, then
        the StateChunk messages that follow it, into one buffer."""
        self._state = None
        if not w.HasField("state") or w.state.kind != self.state_kind:
            return
        st = w.state
        total = st.total_size or len(st.data)
        buf = bytearray(total)
        buf[:len(st.data)] = st.data
        have = len(st.data)
        while have < total:
            msg = next(responses, None)
            if msg is None or msg.WhichOneof("msg") != "state_chunk":
                log.warning("pspnode: the peer's state stopped after %d of %d bytes: starting without it", have, total)
                return
            c = msg.state_chunk
            if c.failed or c.offset != have or have + len(c.data) > total:
                log.warning("pspnode: the peer's state could not be fetched whole (%s): starting without it",
                            c.error or f"a chunk at {c.offset} of {len(c.data)} bytes after {have}")
                return
            buf[have:have + len(c.data)] = c.data
            have += len(c.data)
        self._state = StateOf(kind=st.kind, step=st.step, data=buf)

    def _start(self, w, responses):
        self._welcome, self._session = w, w.session
        self._md = ((SESSION_KEY, w.session),)
        self._mm = self._region = None
        if w.shm_path:
            try:
                with open(w.shm_path, "r+b") as f:
                    self._mm = mmap.mmap(f.fileno(), w.shm_size)
                # One region carries every tensor of the session, in turns:
                # the trainer writes its update, the daemon leaves what the
                # trainer takes.
                self._region = np.frombuffer(self._mm, dtype="<f4", count=self.num_params, offset=w.shm_offset)
                self._out.put(pb.TrainerMessage(shm_ready=pb.SharedMemoryReady(ok=True)))
            except OSError as e:
                self._mm = self._region = None
                self._out.put(pb.TrainerMessage(shm_ready=pb.SharedMemoryReady(ok=False, error=str(e))))
        if self._region is None and self._own_buf is None:
            self._own_buf = np.zeros(self.num_params, dtype="<f4")
        self._reader = threading.Thread(target=self._read, args=(responses,), daemon=True,
                                        name="pspnode-session")
        self._reader.start()

    def _read(self, responses):
        """Serves the daemon's requests on the session stream."""
        try:
            for msg in responses:
                if msg.WhichOneof("msg") == "params_request":
                    if msg.params_request.want_state:
                        self._serve_state(msg.params_request)
                    else:
                        self._serve_params(msg.params_request.id)
            self._lost_why = "the daemon closed the session"
        except grpc.RpcError as e:
            self._lost_why = f"{e.details()} ({e.code().name})"
        finally:
            self._lost.set()

    def _serve_params(self, rid):
        if self.params_provider is None:
            return
        try:
            step, vec = self.params_provider()
            vec = np.asarray(vec, dtype="<f4").reshape(-1)
            if vec.size != self.num_params:
                raise ValueError(f"params_provider gave {vec.size} values, the model has {self.num_params}")
            t = pb.Tensor(data=vec.tobytes())  # the region may be in use by a step
            self._out.put(pb.TrainerMessage(params=pb.ParamsReply(id=rid, step=int(step), params=t)))
        except Exception:  # a failing provider must not kill the session
            log.exception("pspnode: could not give the daemon this trainer's parameters")

    def _serve_state(self, req):
        # The range of the state the daemon asks for (a joiner's daemon
        # fetches a large state a chunk at a time): the provider's state
        # may be any object that has a length and gives bytes for a slice.
        if self.state_provider is None or not self.state_kind:
            return
        try:
            step, data = self.state_provider()
            total = len(data)
            end = total if req.state_length == 0 else min(total, req.state_offset + req.state_length)
            part = bytes(data[min(req.state_offset, total):end])
            st = pb.TrainerState(kind=self.state_kind, step=int(step), data=part, offset=req.state_offset,
                                 total_size=total)
            self._out.put(pb.TrainerMessage(params=pb.ParamsReply(id=req.id, step=int(step), state=st)))
        except Exception:  # a failing provider must not kill the session
            log.exception("pspnode: could not give the daemon this trainer's state")

    def welcome_state(self) -> Optional["StateOf"]:
        """The state a peer's trainer keeps beside the job's parameters
        (of this client's state_kind), when the session starts from them
        and a peer gave it whole; None otherwise. It comes from a peer:
        check it before use. Welcome.state_source says which peer."""
        w = self._welcome
        if w is None or not w.has_params:
            return None
        return getattr(self, "_state", None)

    @property
    def welcome(self) -> "pb.Welcome":
        return self._welcome

    def welcome_params(self) -> Optional[np.ndarray]:
        """The job's parameters to start from (None: keep your own)."""
        w = self._welcome
        if w is None or not w.has_params:
            return None
        return self._vector(w.params)

    def reset_params(self, reset: "pb.Reset") -> np.ndarray:
        """The parameters of a Reset (StepResult.reset, PullResult.reset)."""
        v = self._vector(reset.params)
        if v is None:
            raise DaemonError(None, "a reset without parameters", "reset", "BAD_TENSOR")
        return v

    @property
    def shared(self) -> bool:
        """Whether tensors go through shared memory."""
        return self._region is not None

    def region(self) -> Optional[np.ndarray]:
        """The shared region (a float32 vector of the model's size), None
        without shared memory. The trainer writes its update there before
        a step; after it, the region holds what the trainer takes."""
        return self._region

    def update_buffer(self, step: Optional[int] = None) -> np.ndarray:
        """A float32 vector to write an update into (the shared region when
        the session has it): publish and step send it when called without
        a vector."""
        if self._region is not None:
            return self._region
        return self._own_buf

    def _tensor(self, vec) -> "pb.Tensor":
        shared = self._region is not None
        if vec is None:
            if shared:
                return pb.Tensor(shared=pb.SharedRegion(offset=self._welcome.shm_offset))
            vec = self._own_buf
        vec = np.asarray(vec)
        if vec.dtype != np.float32:
            raise TypeError(f"vectors are float32, got {vec.dtype}")
        if vec.size != self.num_params:
            raise ValueError(f"vector of {vec.size} values, the model has {self.num_params}")
        if shared:
            if not np.shares_memory(vec, self._region):
                self._region[:] = vec.reshape(-1)
            return pb.Tensor(shared=pb.SharedRegion(offset=self._welcome.shm_offset))
        return pb.Tensor(data=vec.astype("<f4", copy=False).tobytes())

    def _vector(self, t) -> Optional[np.ndarray]:
        if t is None:
            return None
        kind = t.WhichOneof("carrier")
        if kind == "shared":
            if self._region is None or t.shared.offset != self._welcome.shm_offset:
                raise DaemonError(None, f"the daemon named offset {t.shared.offset} of a shared file this session "
                                  "has not mapped", "tensor", "BAD_TENSOR")
            return self._region
        if kind == "data":
            if len(t.data) != 4 * self.num_params:
                raise DaemonError(None, f"the daemon sent {len(t.data)} bytes for {self.num_params} parameters",
                                  "tensor", "BAD_TENSOR")
            return np.frombuffer(t.data, dtype="<f4", count=self.num_params)
        return None

    def _call(self, name, fn, req):
        if self._lost.is_set():
            raise SessionLost(grpc.StatusCode.UNAVAILABLE, f"session lost: {self._lost_why}", name)
        if self._stub is None:
            raise SessionLost(None, "no session: call connect() first", name)
        try:
            return fn(req, metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e, name) from None

    # -- the calls ---------------------------------------------------------

    def barrier(self, step: int) -> "pb.BarrierReply":
        """Returns when the node may take ``step`` (completed steps + 1)."""
        return self._call("barrier", self._stub.Barrier, pb.BarrierRequest(step=step))

    def publish(self, step: int, update=None, loss=None, accuracy=None) -> None:
        """Hands the update of the completed ``step`` (a delta, or under
        epidemic the model) to the exchange; None sends update_buffer()."""
        req = pb.PublishRequest(step=step, update=self._tensor(update))
        self._eval(req, loss, accuracy)
        self._call("publish", self._stub.Publish, req)

    def _pulled(self, r: "pb.PullReply") -> PullResult:
        reset = r.reset if r.HasField("reset") else None
        if reset is not None:
            return PullResult(0, None, reset)
        return PullResult(r.merged, self._vector(r.update) if r.merged else None)

    def pull(self) -> PullResult:
        """The peers' work since the last pull: a PullResult (merged,
        update, reset), which unpacks as (merged, update); update is None
        when merged is 0. Under gossip, add update to the parameters; under
        epidemic, take it as the parameters (the average of the model last
        published and the peers')."""
        return self._pulled(self._call("pull", self._stub.Pull, pb.PullRequest()))

    def step(self, step: int, update=None, loss=None, accuracy=None) -> StepResult:
        """publish(step), barrier(step + 1) and pull, in one call."""
        req = pb.StepRequest(step=step, update=self._tensor(update))
        self._eval(req, loss, accuracy)
        r = self._call("step", self._stub.Step, req)
        p = self._pulled(r.pull)
        return StepResult(barrier=r.barrier, merged=p.merged, update=p.update, reset=p.reset)

    @staticmethod
    def _eval(req, loss, accuracy):
        if loss is not None:
            req.has_eval, req.loss = True, float(loss)
            req.accuracy = float("nan") if accuracy is None else float(accuracy)

    def checkpoint(self, step: int, params=None) -> str:
        """Writes params (a float32 vector; None under epidemic: the model
        the daemon holds, the trainer's after its last step) to the daemon's
        checkpoint file; returns its path. Parameters that are not the
        shared region go through the socket."""
        if params is None:
            req = pb.CheckpointRequest(step=step)
        else:
            vec = np.asarray(params)
            if vec.dtype != np.float32 or vec.size != self.num_params:
                raise ValueError(f"checkpoint: want {self.num_params} float32 values, got {vec.size} {vec.dtype}")
            if self._region is not None and np.shares_memory(vec, self._region):
                t = pb.Tensor(shared=pb.SharedRegion(offset=self._welcome.shm_offset))
            else:
                t = pb.Tensor(data=vec.astype("<f4", copy=False).tobytes())
            req = pb.CheckpointRequest(step=step, params=t)
        return self._call("checkpoint", self._stub.Checkpoint, req).path

    def status(self, timeout: float = 10) -> "pb.StatusReply":
        """The daemon's status (needs no session)."""
        if self._stub is None:
            self._channel = grpc.insecure_channel(grpc_target(self.address), options=self._opts)
            self._stub = pb_grpc.TrainerStub(self._channel)
        try:
            return self._stub.Status(pb.StatusRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "status", in_session=False) from None

    @property
    def lost(self) -> bool:
        """Whether the session has ended (the daemon went away)."""
        return self._lost.is_set()

    def _teardown(self):
        if self._out is not None:
            self._out.put(None)
        if self._channel is not None:
            self._channel.close()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._channel = self._stub = self._reader = self._out = None
        self._region = None
        self._md = ()
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping goes with it
            self._mm = None

    def close(self):
        """Ends the session: the daemon's node leaves its peers' barriers
        until another trainer connects."""
        if not self._closed:
            self._closed = True
            self._teardown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
