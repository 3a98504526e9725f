"""A pspnode daemon that this Python process starts and owns.

``pspnode.Optimizer(opt, model=model, job="mnist", bootstrap=[...])`` with
no daemon address starts ``pspnode run --trainer unix:... --trainer-owned``
as a child, waits until it serves its trainer API, and the optimizer's
session then waits until it has joined its job. When it cannot, the error
says why: the binary missing (and where it looked), the daemon's exit with
its last log lines and what they mean (a port in use, a bad flag), or, when
it has not joined in time, the daemon's own reason (the bootstrap peers not
answering). The daemon stops when the optimizer closes, when this object is
collected, when the interpreter exits, and, since its standard input is a
pipe from this process (--trainer-owned), when this process dies however it
dies.

The binary is the first of: the ``binary`` argument, $PSPNODE_BIN,
``pspnode`` on PATH, and the repository's bin/pspnode (``make build``) when
the client runs from a checkout.
"""

import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import List, Optional, Sequence

from pspnode.errors import DaemonStartError

log = logging.getLogger("pspnode")

_LOG_LINES = 20


def find_binary(binary: Optional[str] = None) -> str:
    """The pspnode binary to start (see the module comment), or
    DaemonStartError naming every place it looked."""
    looked = []
    for what, path in (("pspnode_bin=", binary), ("$PSPNODE_BIN", os.environ.get("PSPNODE_BIN"))):
        if path:  # named explicitly: that one or none
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
            raise DaemonStartError(None, f"{what}{path} is not an executable file: build pspnode (make build, in "
                                   "the repository) and name its binary, e.g. bin/pspnode", "start", "NO_BINARY",
                                   {"binary": path})
    on_path = shutil.which("pspnode")
    if on_path:
        return on_path
    looked.append("pspnode on PATH (none)")
    repo = Path(__file__).resolve().parents[3] / "bin" / "pspnode"
    if repo.is_file() and os.access(repo, os.X_OK):
        return str(repo)
    looked.append(f"{repo} (none)")
    raise DaemonStartError(None, "no pspnode binary to start a daemon: looked at " + "; ".join(looked) +
                           ". Build it (make build, in the repository) and set PSPNODE_BIN, or put it on PATH; "
                           "or start a daemon yourself (pspnode run --trainer unix:PATH) and pass its address",
                           "start", "NO_BINARY")


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

    job: the job's name. bootstrap: multiaddrs of peers to join through
    (none for the job's first node). listen: multiaddrs to listen on
    (default: TCP and QUIC on every interface, a free port each: pass a
    fixed port for a node others bootstrap from). identity: a key file,
    for a peer ID that survives restarts. args: any other ``pspnode run``
    flags (e.g. ["--barrier", "pssp:2:4", "--http", "127.0.0.1:0"]).
    binary: the pspnode binary (see find_binary).
    """

    def __init__(self, job: str, *, bootstrap: Sequence[str] = (), listen: Optional[Sequence[str]] = None,
                 identity: Optional[str] = None, args: Sequence[str] = (), binary: Optional[str] = None):
        if not job:
            raise ValueError("a daemon needs a job name (job=...)")
        if isinstance(bootstrap, str):
            bootstrap = [bootstrap]
        if isinstance(listen, str):
            listen = [listen]
        self.job = job
        self.binary = find_binary(binary)
        self.dir = tempfile.mkdtemp(prefix="pspnode-")
        self.socket = os.path.join(self.dir, "trainer.sock")
        self.address = "unix:" + self.socket
        self.log_path = os.path.join(self.dir, "daemon.log")
        listen = list(listen) if listen else ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"]
        self.args: List[str] = [self.binary, "run", "--job", job, "--trainer", self.address, "--trainer-owned"]
        for a in listen:
            self.args += ["--listen", a]
        for b in bootstrap:
            self.args += ["--bootstrap", b]
        if identity:
            self.args += ["--identity", identity]
        self.args += list(args)
        self.bootstrap = list(bootstrap)
        self.listen = listen
        self.peer_id = ""
        self.addrs: List[str] = []
        self._serving = threading.Event()
        self._stdout_done = threading.Event()
        self.proc = None
        self._finalizer = None

    def start(self, timeout: float = 30.0) -> "Daemon":
        """Starts the process and returns once it serves its trainer API,
        or raises DaemonStartError saying why not."""
        logf = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                                         text=True, start_new_session=True)
        except OSError as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise DaemonStartError(None, f"could not run {self.binary}: {e}", "start", "EXEC") from e
        finally:
            logf.close()
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

    def alive(self):
        """Raises DaemonStartError if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise self.failure("exited")

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
            hints.append(f"a port it was to listen on is in use{where}: another daemon or program holds it; "
                         f"pass listen=[...] with another port (listen was {self.listen})")
        if waiting:
            hints.append(f"it says: {waiting}")
            if self.bootstrap and re.search(r"refused|no route|timeout|timed out|unreachable|no bootstrap|not joined|dial",
                                            waiting, re.I):
                hints.append(f"the bootstrap peer(s) {self.bootstrap} did not answer: check each address "
                             "(it ends in /p2p/<peer id>), that its daemon runs, and that its port is open to this machine")
        elif code == 2 and not hints:
            hints.append("it refused its flags (see its log below)")
        if hints:
            msg += ": " + "; ".join(hints)
        if tail:
            msg += f".\nIts last log lines ({self.log_path}):\n  " + "\n  ".join(tail)
        meta = {"log": self.log_path, "command": " ".join(self.args)}
        if code is not None:
            meta["exit_code"] = str(code)
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
