"""A pspnode daemon that this Python process starts and owns.

``pspnode.Optimizer(opt, model=model, job="mnist", bootstrap=[...])`` with
no daemon address starts ``pspnode run --trainer unix:... --trainer-owned``
as a child, waits until it serves its trainer API, and the optimizer's
session then waits until it has joined its job. When it cannot, the error
says why: the binary missing (and where it looked), the daemon's exit with
its last log lines and what they mean (a port in use, a bad flag), or, when
it has not joined in time, the daemon's own reason (the bootstrap peers not
answering: BootstrapError). The daemon stops when the optimizer closes, when
this object is collected, when the interpreter exits, and, since its
standard input is a pipe from this process (--trainer-owned), when this
process dies however it dies.

Starting from an address, as DDP's ranks start from MASTER_ADDR:MASTER_PORT:
give every worker the same ``bootstrap="HOST:PORT"``. A worker whose machine
has HOST's address and finds PORT free listens there (the first to take it,
on one machine; the others join it); the others learn its peer ID when they
dial it. With a swarm key (``swarm_key=``), only a holder of the key answers.

The daemon's folder (``pspnode-*`` in the temporary directory: its socket
and daemon.log) goes with it; one left by a process killed outright
(SIGKILL, or SIGTERM without a handler) is removed by the next daemon a
process of the same user starts, once both its owners are gone.

The binary is the first of: the ``binary`` argument, $PSPNODE_BIN, the one
the installed wheel carries (``make dist`` builds wheels with the static
binary inside), ``pspnode`` on PATH, and the repository's bin/pspnode
(``make build``) when the client runs from a checkout.
"""

import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from pspnode.errors import BootstrapError, DaemonStartError

log = logging.getLogger("pspnode")

_LOG_LINES = 20


def _bundled() -> Path:
    """Where a wheel built by make dist carries the binary."""
    return Path(__file__).resolve().parent / "bin" / ("pspnode.exe" if os.name == "nt" else "pspnode")


def _checkout_bin() -> Optional[Path]:
    """The repository's bin/pspnode (make build) when this module runs from
    a checkout (clients/python/pspnode/daemon.py), else None: an installed
    package's parents are not a repository."""
    here = Path(__file__).resolve()
    if here.parents[1].name != "python" or here.parents[2].name != "clients":
        return None
    root = here.parents[3]
    return root / "bin" / "pspnode" if (root / "go.mod").is_file() else None


def _executable(path: Path) -> bool:
    if not path.is_file():
        return False
    if not os.access(path, os.X_OK):  # a wheel unpacked without its mode bits
        try:
            path.chmod(path.stat().st_mode | 0o111)
        except OSError:
            return False
    return os.access(path, os.X_OK)


def find_binary(binary: Optional[str] = None) -> str:
    """The pspnode binary to start, or DaemonStartError naming every place
    it looked: the ``binary`` argument, $PSPNODE_BIN, the binary the
    installed wheel carries (pspnode/bin/), ``pspnode`` on PATH, and the
    repository's bin/pspnode (make build) when the client runs from a
    checkout."""
    looked = []
    for what, path in (("pspnode_bin=", binary), ("$PSPNODE_BIN", os.environ.get("PSPNODE_BIN"))):
        if path:  # named explicitly: that one or none
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
            raise DaemonStartError(None, f"{what}{path} is not an executable file: build pspnode (make build, in "
                                   "the repository) and name its binary, e.g. bin/pspnode", "start", "NO_BINARY",
                                   {"binary": path})
    bundled = _bundled()
    if _executable(bundled):
        return str(bundled)
    looked.append(f"{bundled} (none: this package was installed without the binary; the wheels of make dist carry it)")
    on_path = shutil.which("pspnode")
    if on_path:
        return on_path
    looked.append("pspnode on PATH (none)")
    repo = _checkout_bin()
    if repo is not None:
        if _executable(repo):
            return str(repo)
        looked.append(f"{repo} (none)")
    raise DaemonStartError(None, "no pspnode binary to start a daemon: looked at " + "; ".join(looked) +
                           ". Install a wheel that carries it (make dist, or make wheel for this machine), or build "
                           "it (make build, in the repository) and set PSPNODE_BIN or put it on PATH; or start a "
                           "daemon yourself (pspnode run --trainer unix:PATH) and pass its address",
                           "start", "NO_BINARY")


def host_port(addr: str) -> Optional[Tuple[str, int]]:
    """(host, port) of a bootstrap address given as HOST:PORT (or
    [IPv6]:PORT), None for a multiaddr."""
    if addr.startswith("/"):
        return None
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bootstrap address {addr!r}: want HOST:PORT (e.g. 10.0.0.5:29500, as DDP's "
                         "MASTER_ADDR:MASTER_PORT) or a multiaddr ending in /p2p/<peer id>")
    return host.strip("[]"), int(port)


def _local_listen(bootstrap: Sequence[str]) -> Optional[str]:
    """The listen multiaddr of the first HOST:PORT of bootstrap whose HOST
    is an address of this machine and whose PORT is free now; None if
    none is (the worker joins the node there)."""
    for b in bootstrap:
        hp = host_port(b)
        if hp is None:
            continue
        try:
            infos = socket.getaddrinfo(hp[0], hp[1], type=socket.SOCK_STREAM)
        except OSError:
            continue
        for family, _, _, _, sa in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(sa)
                except OSError as e:
                    if e.errno == errno.EADDRINUSE:
                        return None  # a node listens there (or another program): join it
                    continue  # not this machine's address
            return f"/{'ip4' if family == socket.AF_INET else 'ip6'}/{sa[0]}/tcp/{hp[1]}"
    return None


# A daemon's reasons for waiting that waiting longer does not change: what
# answers at the bootstrap address is not a node of the job.
_DEFINITIVE = re.compile(r"a node of another job|holds another swarm key|not a libp2p node")

_OWNERS = "owners"  # in a daemon's folder: "PYTHON_PID DAEMON_PID"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def clean_stale(tmp: Optional[str] = None) -> List[str]:
    """Removes the folders of daemons (``pspnode-*`` in the temporary
    directory, of this user) whose owning process and daemon are both gone:
    those a process killed outright left. Returns the folders removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        d = os.path.join(tmp, name)
        if not name.startswith("pspnode-"):
            continue
        try:
            st = os.lstat(d)
            with open(os.path.join(d, _OWNERS)) as f:
                pids = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue  # not a daemon's folder of ours, or being made
        if st.st_uid != os.getuid() or not os.path.isdir(d) or any(_alive(p) for p in pids):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        log.info("pspnode: removed %d folder(s) of daemons whose owners are gone: %s", len(removed), ", ".join(removed))
    return removed


def _stop(proc: subprocess.Popen, stdin, directory: str, timeout: float = 10.0):
    """Stops a daemon: its stdin closes (--trainer-owned: a clean stop),
    SIGTERM, then SIGKILL after timeout. Removes its directory."""
    try:
        if proc.poll() is None:
            try:
                stdin.close()
            except OSError:
                pass
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        for f in (stdin, proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass
        shutil.rmtree(directory, ignore_errors=True)


class Daemon:
    """A ``pspnode run --trainer`` child process.

    job: the job's name. bootstrap: where to join the job: "HOST:PORT" (the
    same for every worker, as DDP's MASTER_ADDR:MASTER_PORT; see the module
    comment) or multiaddrs ending in /p2p/<peer id>, a string or a list
    (none for the job's first node). listen: multiaddrs to listen on
    (default: TCP and QUIC on every interface, a free port each, TCP only
    with a swarm key; plus HOST:PORT of bootstrap when it is this
    machine's and free). swarm_key: the job's swarm key file (pspnode
    keygen --swarm-key FILE), which makes the job private: only its holders
    answer at the address. identity: a key file, for a peer ID that
    survives restarts. args: any other ``pspnode run`` flags (e.g.
    ["--barrier", "pssp:2:4", "--http", "127.0.0.1:0"], or ["--mdns"] to
    find the job's nodes on the local network with no address). binary:
    the pspnode binary (see find_binary).
    """

    def __init__(self, job: str, *, bootstrap: Sequence[str] = (), listen: Optional[Sequence[str]] = None,
                 identity: Optional[str] = None, args: Sequence[str] = (), binary: Optional[str] = None,
                 swarm_key: Optional[str] = None):
        if not job:
            raise ValueError("a daemon needs a job name (job=...)")
        if isinstance(bootstrap, str):
            bootstrap = [b.strip() for b in bootstrap.split(",") if b.strip()]
        if isinstance(listen, str):
            listen = [listen]
        for b in bootstrap:
            host_port(b)  # a malformed HOST:PORT is refused before anything starts
        if swarm_key is not None and not os.path.isfile(swarm_key):
            raise ValueError(f"swarm_key={swarm_key!r} is not a file: write one with `pspnode keygen --swarm-key "
                             "FILE` and give every worker of the job a copy")
        private = swarm_key is not None or any(a == "--swarm-key" or a.startswith("--swarm-key=") for a in args)
        self.job = job
        self.binary = find_binary(binary)
        clean_stale()
        self.dir = tempfile.mkdtemp(prefix="pspnode-")
        self.socket = os.path.join(self.dir, "trainer.sock")
        self.address = "unix:" + self.socket
        self.log_path = os.path.join(self.dir, "daemon.log")
        self._listen_given = bool(listen)
        if not listen:
            listen = ["/ip4/0.0.0.0/tcp/0"] if private else ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]
        self.listen = list(listen)
        self.args: List[str] = [self.binary, "run", "--job", job, "--trainer", self.address, "--trainer-owned"]
        for b in bootstrap:
            self.args += ["--bootstrap", b]
        if swarm_key is not None:
            self.args += ["--swarm-key", swarm_key]
        if identity:
            self.args += ["--identity", identity]
        self.args += list(args)
        self.bootstrap = list(bootstrap)
        self.at_bootstrap = ""  # the bootstrap address this daemon listens at, if any (it starts the job)
        self.peer_id = ""
        self.addrs: List[str] = []
        self._serving = threading.Event()
        self._stdout_done = threading.Event()
        self.proc = None
        self._finalizer = None

    def start(self, timeout: float = 30.0) -> "Daemon":
        """Starts the process and returns once it serves its trainer API,
        or raises DaemonStartError saying why not."""
        if self._listen_given or not any(host_port(b) for b in self.bootstrap):
            return self._start(timeout)
        # Whether this worker listens at the bootstrap address is decided
        # under a lock of this machine's, held until its daemon listens:
        # of workers started at once on one machine, one takes the port.
        lock = open(os.path.join(tempfile.gettempdir(), f"pspnode.bootstrap-{os.getuid()}.lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            at = _local_listen(self.bootstrap)
            if at is not None:
                self.listen.append(at)
                self.at_bootstrap = at
            return self._start(timeout)
        finally:
            lock.close()

    def _start(self, timeout: float) -> "Daemon":
        args = list(self.args)
        for a in self.listen:
            args += ["--listen", a]
        self.args = args
        logf = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                                         text=True, start_new_session=True)
        except OSError as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise DaemonStartError(None, f"could not run {self.binary}: {e}", "start", "EXEC") from e
        finally:
            logf.close()
        with open(os.path.join(self.dir, _OWNERS), "w") as f:
            f.write(f"{os.getpid()} {self.proc.pid}\n")
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.proc.stdin, self.dir)
        threading.Thread(target=self._read, name="pspnode-daemon-stdout", daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._serving.wait(0.05):
            if self.proc.poll() is not None:
                self._stdout_done.wait(1)
                err = self.failure("exited before serving its trainer API")
                self.close()
                raise err
            if time.monotonic() > deadline:
                err = self.failure(f"did not serve its trainer API within {timeout:.0f} s")
                self.close()
                raise err
        log.info("pspnode: started daemon pid %d for job %s, peer %s, listening on %s; log %s", self.proc.pid,
                 self.job, self.peer_id, ", ".join(self.addrs[:2]) + (" ..." if len(self.addrs) > 2 else ""),
                 self.log_path)
        if self.at_bootstrap:
            log.info("pspnode: this worker listens at the bootstrap address (%s): it starts the job, or joins the "
                     "nodes it remembers", self.at_bootstrap)
        return self

    def _read(self):
        try:
            for line in self.proc.stdout:
                line = line.strip()
                if line.startswith("peer id: "):
                    self.peer_id = line[len("peer id: "):]
                elif line.startswith("listening: "):
                    self.addrs.append(line[len("listening: "):])
                elif line.startswith("trainer: "):
                    self._serving.set()
        except (OSError, ValueError):
            pass
        finally:
            self._stdout_done.set()

    def alive(self, waiting: str = ""):
        """Raises DaemonStartError if the process has exited, and
        BootstrapError if its reason for waiting (``waiting``, the
        daemon's last) says it cannot join through its bootstrap addresses
        however long it waits: a node of another job answers there, or
        something that is not a node of the job's swarm key."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.failure("exited")
        if self.bootstrap and waiting and _DEFINITIVE.search(waiting):
            raise self.failure("cannot join its job", waiting=waiting)

    def log_tail(self, n: int = _LOG_LINES) -> List[str]:
        """The last n lines of the daemon's log."""
        try:
            with open(self.log_path, errors="replace") as f:
                return [l.rstrip("\n") for l in f.readlines()[-n:]]
        except OSError:
            return []

    def failure(self, what: str, waiting: str = "") -> DaemonStartError:
        """A DaemonStartError for the daemon's state: what happened, what
        its log or its waiting reason say it means, its last log lines."""
        code = self.proc.poll() if self.proc is not None else None
        tail = self.log_tail()
        text = "\n".join(tail)
        msg = f"the pspnode daemon for job {self.job!r} {what}"
        if code is not None:
            msg += f" (exit code {code})"
        hints = []
        m = re.search(r"[^\n]*(already in use|bind: address)[^\n]*", text)
        if m:
            line = m.group(0)
            hp = re.search(r"(\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]*\]):(\d+)", line)
            ph = re.search(r"port (\d+) on ([^\s:]+)", line)
            where = f" ({hp.group(0)})" if hp else (f" ({ph.group(2)}:{ph.group(1)})" if ph else "")
            if "--http" in line:
                hints.append(f"its --http port is in use{where}: another daemon or program holds it; pass another "
                             "in daemon_args (e.g. [\"--http\", \"127.0.0.1:0\"] for any free port)")
            else:
                hints.append(f"a port it was to listen on is in use{where}: another daemon or program holds it; "
                             f"pass listen=[...] with another port (listen was {self.listen})")
        bootstrap_reason = ""
        if waiting:
            hints.append(f"it says: {waiting}")
            if self.bootstrap and re.search(r"another job|does not speak", waiting):
                bootstrap_reason = "OTHER_JOB"
                hints.append(f"what answers at {', '.join(self.bootstrap)} is a pspnode node of another job: check the "
                             f"address and the job's name (job={self.job!r})")
            elif self.bootstrap and re.search(r"refused|no route|timeout|timed out|unreachable|no bootstrap|not joined|"
                                              r"dial|no libp2p peer", waiting, re.I):
                bootstrap_reason = "NO_PEER_AT_ADDRESS"
                hints.append(f"nothing of this job answered at {', '.join(self.bootstrap)}: check that the job's first "
                             "worker runs there, that its port is open to this machine, and, for a private job, that "
                             "every worker has the same swarm key")
        elif code == 2 and not hints:
            hints.append("it refused its flags (see its log below)")
        if hints:
            msg += ": " + "; ".join(hints)
        if tail:
            msg += f".\nIts last log lines ({self.log_path}):\n  " + "\n  ".join(tail)
        meta = {"log": self.log_path, "command": " ".join(self.args)}
        if code is not None:
            meta["exit_code"] = str(code)
        if bootstrap_reason:
            meta["bootstrap"] = ",".join(self.bootstrap)
            return BootstrapError(None, msg, "start", bootstrap_reason, meta)
        return DaemonStartError(None, msg, "start", "DAEMON_START", meta)

    def close(self, timeout: float = 10.0):
        """Stops the daemon (cleanly: its peers are told it leaves) and
        removes its directory. Idempotent."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
            _stop(self.proc, self.proc.stdin, self.dir, timeout)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
