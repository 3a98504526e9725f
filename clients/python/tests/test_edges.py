"""The client's smaller edges: a cut reason keeps its cause, a tcp: address
off loopback is refused, something that is not a daemon at the address is
named within a deadline, and a busy --http port gets the right advice."""

import http.server
import logging
import os
import socket
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pspnode  # noqa: E402
from pspnode import client as client_mod  # noqa: E402
from pspnode.client import short_reason  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
logging.basicConfig(level=logging.WARNING)


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Edges(unittest.TestCase):
    def test_short_reason_keeps_the_cause(self):
        r = ("not joined: overlay: could not reach any bootstrap peer (1 tried): no libp2p peer answered at the "
             "address (127.0.0.1:41853): it is not a libp2p node speaking Noise over TCP: all dial attempts failed")
        for limit in (60, 100, 160):
            s = short_reason(r, limit)
            self.assertLessEqual(len(s), limit)
            self.assertTrue(s.startswith("not joined:"), s)
            self.assertTrue(s.endswith("all dial attempts failed"), s)
        self.assertEqual(short_reason("short  reason\n"), "short reason")

    def test_tcp_off_loopback_refused(self):
        for addr in ("tcp:10.0.0.5:4000", "tcp:0.0.0.0:4000", "tcp:node0.lan:4000", "tcp:127.0.0.1"):
            with self.assertRaises(ValueError) as cm:
                pspnode.Client(addr, model_name="m", num_params=3, model_id=1)
            self.assertIn("loopback", str(cm.exception))
        for addr in ("tcp:127.0.0.1:4000", "tcp:[::1]:4000", "tcp:localhost:4000"):
            pspnode.Client(addr, model_name="m", num_params=3, model_id=1)

    def test_not_a_daemon_is_named_within_a_deadline(self):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        self.addCleanup(silent.close)
        was = client_mod._HANDSHAKE_S
        client_mod._HANDSHAKE_S = 1.0  # a daemon answers in milliseconds; 5 s is for a loaded machine
        self.addCleanup(setattr, client_mod, "_HANDSHAKE_S", was)
        for what, port in (("an HTTP/1 server", srv.server_address[1]), ("a silent one", silent.getsockname()[1])):
            c = pspnode.Client(f"tcp:127.0.0.1:{port}", model_name="m", num_params=3, model_id=1)  # no timeout
            t = time.monotonic()
            with self.assertRaises(pspnode.NotADaemon, msg=what) as cm:
                c.connect()
            self.assertLess(time.monotonic() - t, 30, what)
            self.assertEqual(cm.exception.reason, "NOT_A_DAEMON")
            self.assertIn("--trainer", str(cm.exception))
            c.close()


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class DaemonEdges(unittest.TestCase):
    def test_busy_http_port_advice(self):
        import torch
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        self.addCleanup(held.close)
        port = held.getsockname()[1]
        m = torch.nn.Linear(2, 1)
        with self.assertRaises(pspnode.DaemonStartError) as cm:
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="edges", start_timeout=20,
                              daemon_args=["--http", f"127.0.0.1:{port}"])
        msg = str(cm.exception)
        self.assertIn(f"its --http port is in use (127.0.0.1:{port})", msg)
        self.assertIn("daemon_args", msg)
        self.assertNotIn("pass listen=", msg)


if __name__ == "__main__":
    unittest.main()
