"""Starting every worker of a job from one HOST:PORT, as DDP's ranks start
from MASTER_ADDR:MASTER_PORT, and what a worker is told when nothing of
its job answers there (PSPNODE_BIN: run through `go test ./cmd/pspnode -run
TestPythonClient`)."""

import http.server
import logging
import os
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import pspnode  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
logging.basicConfig(level=logging.WARNING)
F = torch.nn.functional


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class StartFromAnAddress(unittest.TestCase):
    def key(self):
        tmp = tempfile.mkdtemp(prefix="pspnode-test-key-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "swarm.key")
        subprocess.run([BIN, "keygen", "--swarm-key", path], check=True, capture_output=True)
        return path

    def test_workers_started_alike_train_together(self):
        # Three workers of a private job started at once with the same
        # arguments: one takes the port and starts the job, the others
        # learn its peer ID through the swarm key and join it.
        master, key = f"127.0.0.1:{free_port()}", self.key()
        opts, errs = [None] * 3, []
        x, y = torch.randn(16, 4), torch.randn(16, 1)

        def worker(i):
            try:
                m = net(seed=i)
                opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.05), model=m, job="address",
                                        bootstrap=master, swarm_key=key, start_timeout=60,
                                        daemon_args=["--barrier", "pssp:2:2", "--nat-traversal=false"])
                opts[i] = opt
                for _ in range(5):
                    opt.zero_grad()
                    F.mse_loss(m(x), y).backward()
                    opt.step()
            except BaseException as e:  # noqa: B036 (reported below)
                errs.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for o in opts:
            if o is not None:
                self.addCleanup(o.close)
        self.assertEqual(errs, [])
        at = [o.daemon.at_bootstrap for o in opts]
        self.assertEqual(sum(1 for a in at if a), 1, f"listening at the bootstrap address: {at}")
        self.assertIn(master.split(":")[1], "".join(at))
        for o in opts:
            self.assertGreaterEqual(o.step_count, 5)
            st = o.client.status()
            self.assertTrue(st.node.joined)
            self.assertGreaterEqual(st.node.connected_peers, 2 if o.daemon.at_bootstrap else 1)

    def fails(self, boot, **kw):
        m = net()
        with self.assertRaises(pspnode.BootstrapError) as cm:
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job=kw.pop("job", "address"),
                              bootstrap=boot, start_timeout=30, daemon_args=["--nat-traversal=false"], **kw)
        self.assertIsInstance(cm.exception, pspnode.DaemonStartError)
        self.assertEqual(cm.exception.metadata["bootstrap"], boot)
        return cm.exception

    def test_not_a_node_of_the_job(self):
        # Something else holds the port: an HTTP server.
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        e = self.fails(f"127.0.0.1:{srv.server_address[1]}")
        self.assertEqual(e.reason, "NO_PEER_AT_ADDRESS")
        self.assertIn("no libp2p peer answered", str(e))
        # A node of another job, and a node of another swarm key.
        m = net()
        master = f"127.0.0.1:{free_port()}"
        first = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="other", bootstrap=master,
                                  start_timeout=30, swarm_key=None, daemon_args=["--nat-traversal=false"])
        self.addCleanup(first.close)
        self.assertTrue(first.daemon.at_bootstrap)
        e = self.fails(master, job="address")
        self.assertEqual(e.reason, "OTHER_JOB", str(e))
        self.assertIn("another job", str(e))
        e = self.fails(master, job="other", swarm_key=self.key())
        self.assertEqual(e.reason, "NO_PEER_AT_ADDRESS")
        self.assertIn("another swarm key", str(e))
        # DiLoCo starts its daemon the same way and is told as soon.
        m = net()
        with self.assertRaises(pspnode.BootstrapError) as cm:
            pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), model=m, H=5, job="address", bootstrap=master,
                           start_timeout=30, daemon_args=["--nat-traversal=false"])
        self.assertEqual(cm.exception.reason, "OTHER_JOB", str(cm.exception))

    def test_bad_addresses_refused_before_anything_starts(self):
        m = net()
        for bad in ("10.0.0.5", "10.0.0.5:0", "10.0.0.5:99999", ":4001"):
            with self.assertRaises(ValueError) as cm:
                pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="address", bootstrap=bad)
            self.assertIn("HOST:PORT", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
