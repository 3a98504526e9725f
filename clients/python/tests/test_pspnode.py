"""Tests of the Python client against real pspnode daemons.

PSPNODE_BIN names the pspnode binary (the Go test that runs these,
TestPythonClient in cmd/pspnode, builds it and sets it).
"""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pspnode  # noqa: E402
from pspnode.client import grpc_target  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
logging.basicConfig(level=logging.WARNING)


class Daemon:
    """A `pspnode run --trainer` process on loopback, under the gossip
    exchange unless extra says otherwise (the tests check its deltas)."""

    def __init__(self, tmp, name, job, boot=None, barrier="asp", extra=()):
        self.sock = os.path.join(tmp, name + ".sock")
        args = [BIN, "run", "--job", job, "--listen", "/ip4/127.0.0.1/tcp/0", "--trainer", "unix:" + self.sock,
                "--barrier", barrier, "--nat-traversal=false", "--log-level", "warn", "--exchange", "gossip", *extra]
        if boot:
            args += ["--bootstrap", boot]
        self.log = open(os.path.join(tmp, name + ".log"), "w+")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.addr = None
        for line in self.p.stdout:
            if line.startswith("listening: ") and self.addr is None:
                self.addr = line.split(" ", 1)[1].strip()
            if line.startswith("trainer: "):
                break
        if self.addr is None:
            self.log.seek(0)
            raise RuntimeError("pspnode did not start: " + self.log.read())
        self.address = "unix:" + self.sock

    def stop(self):
        self.p.kill()
        self.p.wait()
        self.p.stdout.close()
        self.log.close()


def quadratic(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class WithDaemons(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="pspnode-py-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def daemons(self, job, k, barrier="asp", extra=()):
        ds = [Daemon(self.tmp, f"{job}0", job, barrier=barrier, extra=extra)]
        for i in range(1, k):
            ds.append(Daemon(self.tmp, f"{job}{i}", job, boot=ds[0].addr, barrier=barrier, extra=extra))
        for d in ds:
            self.addCleanup(d.stop)
        return ds

    def test_two_workers_end_with_the_same_model(self):
        # Under gossip every worker adds every update: with the same start,
        # once all updates are merged the models are equal.
        a, b = self.daemons("same", 2)
        models = [quadratic(), quadratic()]
        opts = [pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.05), d.address, model=m, connect_timeout=30)
                for m, d in zip(models, (a, b))]
        x, y = torch.randn(64, 4), torch.randn(64, 1)
        errors = []

        def train(m, opt, seed):
            # Each worker's half of the data: the steps differ between
            # workers, but not so much that the receiver's norm bound (4 ×
            # its own) refuses one, which would leave the models apart.
            try:
                half = slice(0, 32) if seed == 1 else slice(32, 64)
                for _ in range(30):
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(m(x[half]), y[half]).backward()
                    opt.step()
            except Exception as e:  # surfaced below
                errors.append(e)

        ts = [threading.Thread(target=train, args=(m, o, s)) for m, o, s in zip(models, opts, (1, 2))]
        [t.start() for t in ts]
        [t.join() for t in ts]
        self.assertEqual(errors, [])
        self.assertEqual([o.step_count for o in opts], [30, 30])
        # Pull what is still on its way.
        deadline = time.time() + 20
        while time.time() < deadline:
            for o in opts:
                merged, v = o.client.pull()
                if merged:
                    o._assign(o.params_vector() + torch.from_numpy(v.copy()))
            if torch.allclose(opts[0].params_vector(), opts[1].params_vector(), atol=1e-5):
                break
            time.sleep(0.05)
        sts = [o.client.status().node for o in opts]
        flat = [o.params_vector() for o in opts]
        self.assertTrue(torch.allclose(flat[0], flat[1], atol=1e-5),
                        f"models differ by {float((flat[0] - flat[1]).abs().max())}; "
                        f"received {[s.updates_received for s in sts]}, norm-refused {[s.updates_norm_refused for s in sts]}, "
                        f"rejected {[s.updates_rejected for s in sts]}")
        # The model's own parameters trained: the vector is theirs.
        w = dict(models[0].named_parameters())["0.weight"]
        self.assertTrue(torch.equal(w.detach().reshape(-1), flat[0][:w.numel()]))
        for o in opts:
            o.close()

    def test_epidemic_parameters_live_in_shared_memory(self):
        # Under epidemic with shared memory the parameters are the shared
        # region: the daemon averages into them in place. Both workers
        # train, their models stay close, a refused step leaves the
        # parameters as they were, and close() gives the model its own
        # memory back with the values it had.
        for shared_params in (True, False):
            with self.subTest(shared_params=shared_params):
                ds = self.daemons(f"epi{int(shared_params)}", 2, barrier="pssp:1:2", extra=("--exchange", "epidemic:1"))
                models = [quadratic(), quadratic()]
                opts = [pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.05), d.address, model=m,
                                          connect_timeout=30, shared_params=shared_params)
                        for m, d in zip(models, ds)]
                for o, m in zip(opts, models):
                    region = o.client.region()
                    self.assertIsNotNone(region)
                    lo = region.ctypes.data
                    inside = [lo <= p.data_ptr() < lo + region.nbytes for p in m.parameters()]
                    self.assertEqual(inside, [shared_params] * len(inside))
                x, y = torch.randn(64, 4), torch.randn(64, 1)
                errors = []

                def train(m, opt, half):
                    try:
                        for _ in range(20):
                            opt.zero_grad()
                            torch.nn.functional.mse_loss(m(x[half]), y[half]).backward()
                            opt.step()
                    except Exception as e:  # surfaced below
                        errors.append(e)

                ts = [threading.Thread(target=train, args=(m, o, h)) for m, o, h in
                      zip(models, opts, (slice(0, 32), slice(32, 64)))]
                [t.start() for t in ts]
                [t.join() for t in ts]
                self.assertEqual(errors, [])
                flat = [o.params_vector() for o in opts]
                # Trained apart, the two halves' models drift apart; averaged,
                # they stay close.
                twins = [quadratic(), quadratic()]
                for tw, half in zip(twins, (slice(0, 32), slice(32, 64))):
                    sgd = torch.optim.SGD(tw.parameters(), lr=0.05)
                    for _ in range(20):
                        sgd.zero_grad()
                        torch.nn.functional.mse_loss(tw(x[half]), y[half]).backward()
                        sgd.step()
                apart = torch.cat([(a - b).detach().reshape(-1) for a, b in zip(*(tw.parameters() for tw in twins))])
                averaged = [o.client.status().node.models_averaged for o in opts]
                self.assertTrue(all(averaged), f"models averaged: {averaged}")
                self.assertLess(float((flat[0] - flat[1]).norm()), 0.5 * float(apart.norm()),
                                f"the workers' models did not average ({averaged} averaged)")
                # A step whose values overflow is refused; nothing changes.
                o, m = opts[0], models[0]
                before, step = o.params_vector(), o.step_count
                for g in o.param_groups:
                    g["lr"] = 1e38
                o.zero_grad()
                torch.nn.functional.mse_loss(m(torch.ones(2, 4) * 1e3), torch.zeros(2, 1)).backward()
                with self.assertRaises(FloatingPointError):
                    o.step()
                self.assertTrue(torch.equal(o.params_vector(), before), "a refused step changed the parameters")
                self.assertEqual(o.step_count, step)
                for o, m in zip(opts, models):
                    kept = o.params_vector()
                    o.close()
                    self.assertTrue(torch.equal(torch.cat([p.detach().reshape(-1) for p in m.parameters()]), kept))
                    self.assertFalse(o._in_region)
                    m(torch.ones(1, 4)).sum().backward()  # the model still works on its own

    def test_refusals(self):
        (a,) = self.daemons("refuse", 1)
        m = quadratic()
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), a.address, model=m, connect_timeout=30)
        # A second trainer on the same daemon.
        m2 = quadratic()
        with self.assertRaises(pspnode.TrainerRefused) as cm:
            pspnode.Optimizer(torch.optim.SGD(m2.parameters(), lr=0.1), a.address, model=m2, connect_timeout=30)
        self.assertIn("already has a trainer", str(cm.exception))
        self.assertIsInstance(cm.exception, pspnode.TrainerBusy)
        self.assertEqual(cm.exception.reason, "TRAINER_CONNECTED")
        self.assertIn("pspnode-python", cm.exception.metadata["connected_client"])
        opt.close()
        # Another model once the first is gone: both are named.
        other = torch.nn.Linear(5, 2)
        with self.assertRaises(pspnode.ModelMismatch) as cm:
            deadline = time.time() + 10
            while True:
                try:
                    pspnode.Optimizer(torch.optim.SGD(other.parameters(), lr=0.1), a.address, model=other,
                                      model_name="other", connect_timeout=30)
                except pspnode.TrainerRefused:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)  # the first session is still closing
                    continue
                break
        msg = str(cm.exception)
        self.assertIn('"other"', msg)
        self.assertIn('"Sequential"', msg)
        self.assertIn("12 float32 parameters", msg)
        self.assertIn("19", msg)
        # The class comes from the daemon's reason; the facts from its metadata.
        e = cm.exception
        self.assertEqual(e.reason, "MODEL_MISMATCH")
        self.assertEqual((e.metadata["model_name"], e.metadata["num_params"]), ("other", "12"))
        self.assertEqual((e.metadata["other_model_name"], e.metadata["other_num_params"]), ("Sequential", "19"))

    def test_reconnects_when_the_daemon_restarts(self):
        d = Daemon(self.tmp, "restart", "restart")
        m = quadratic()
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.01), d.address, model=m, connect_timeout=30)
        x, y = torch.randn(8, 4), torch.randn(8, 1)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        for _ in range(3):
            step()
        self.assertEqual(opt.step_count, 3)
        d.stop()
        d2 = Daemon(self.tmp, "restart", "restart")  # the same socket path
        self.addCleanup(d2.stop)
        before = opt.params_vector()
        step()  # the daemon is gone: this step reconnects and keeps its parameters
        self.assertFalse(torch.equal(opt.params_vector(), before), "the local step was lost")
        self.assertEqual(opt.step_count, 4)
        step()
        self.assertEqual(opt.step_count, 5)
        self.assertEqual(opt.client.status().step, 5)
        opt.close()

    def test_checkpoint_resumes(self):
        ck = os.path.join(self.tmp, "job.ckpt")
        d = Daemon(self.tmp, "ckpt", "ckpt", extra=("--checkpoint", ck))
        m = quadratic()
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.05), d.address, model=m,
                                checkpoint_every=4, connect_timeout=30)
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for _ in range(8):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        saved = opt.params_vector()
        opt.close()
        d.stop()
        # A restarted daemon and a fresh worker resume from step 8.
        d2 = Daemon(self.tmp, "ckpt2", "ckpt", extra=("--checkpoint", ck))
        self.addCleanup(d2.stop)
        m2 = quadratic(seed=5)
        opt2 = pspnode.Optimizer(torch.optim.SGD(m2.parameters(), lr=0.05), d2.address, model=m2, connect_timeout=30)
        self.assertEqual(opt2.step_count, 8)
        self.assertTrue(torch.allclose(opt2.params_vector(), saved), "not the checkpointed parameters")
        opt2.close()

    def test_not_float32(self):
        m = quadratic().double()
        with self.assertRaises(TypeError) as cm:
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), "unix:/nonexistent.sock", model=m)
        self.assertIn("float32", str(cm.exception))

    def test_non_finite_update_is_not_sent(self):
        (a,) = self.daemons("nan", 1)
        m = quadratic()
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=1e30), a.address, model=m, connect_timeout=30)
        before = opt.params_vector()
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(torch.ones(2, 4) * 1e3), torch.zeros(2, 1)).backward()
        with self.assertRaises(FloatingPointError) as cm:
            opt.step()
        self.assertIsInstance(cm.exception.__cause__, pspnode.BadUpdate)
        self.assertEqual(cm.exception.__cause__.reason, "BAD_VALUE")
        self.assertTrue(torch.equal(opt.params_vector(), before), "the parameters changed")
        self.assertEqual(opt.step_count, 0)
        st = opt.client.status()
        self.assertEqual(st.step, 0)
        opt.close()

    def test_nan_loss_skips_the_whole_step(self):
        # A NaN loss gives NaN gradients: the step is refused before SGD
        # takes it, so its momentum buffer stays finite and the next step
        # trains (before, the momentum went NaN and every later step was
        # refused until the user reset the optimizer's state).
        for kind in ("gossip", "epidemic:1"):
            with self.subTest(exchange=kind):
                (a,) = self.daemons("nanloss" + kind.replace(":", ""), 1, extra=("--exchange", kind))
                m = quadratic()
                opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), a.address, model=m,
                                        connect_timeout=30)
                x, y = torch.randn(8, 4), torch.randn(8, 1)

                def step(loss_scale=1.0):
                    opt.zero_grad()
                    (torch.nn.functional.mse_loss(m(x), y) * loss_scale).backward()
                    opt.step()

                step()
                before = opt.params_vector()
                momenta = [opt.state[p]["momentum_buffer"].clone() for p in m.parameters()]
                with self.assertRaises(FloatingPointError) as cm:
                    step(float("nan"))
                self.assertIn("not finite", str(cm.exception))
                self.assertTrue(torch.equal(opt.params_vector(), before))
                self.assertTrue(all(torch.equal(opt.state[p]["momentum_buffer"], mo)
                                    for p, mo in zip(m.parameters(), momenta)))
                self.assertEqual(opt.step_count, 1)
                for _ in range(3):
                    step()
                self.assertEqual(opt.step_count, 4)
                self.assertTrue(torch.isfinite(opt.params_vector()).all())
                opt.close()

    def test_no_daemon(self):
        # No session existed: not SessionLost, but DaemonUnavailable.
        c = pspnode.Client("unix:" + os.path.join(self.tmp, "nobody.sock"), model_name="m", num_params=3,
                           model_id=5, connect_timeout=1)
        with self.assertRaises(pspnode.DaemonUnavailable) as cm:
            c.connect()
        self.assertNotIsInstance(cm.exception, pspnode.SessionLost)
        self.assertIn("no pspnode daemon ready", str(cm.exception))

    def test_low_level_client_step_order(self):
        (a,) = self.daemons("order", 1)
        c = pspnode.Client(a.address, model_name="m", num_params=3, model_id=5, connect_timeout=30)
        w = c.connect()
        self.assertEqual(w.step, 0)
        self.assertTrue(c.shared)
        c.update_buffer(1)[:] = [0.1, 0.2, 0.3]
        with self.assertRaises(pspnode.StepOrderError) as cm:
            c.barrier(5)
        self.assertEqual(cm.exception.reason, "STEP_ORDER")
        r = c.step(1)
        self.assertEqual(r.barrier.step, 2)
        self.assertEqual(c.status().step, 1)
        c.update_buffer(2)[:] = [np.nan, 0, 0]
        with self.assertRaises(pspnode.BadUpdate) as cm:
            c.step(2)
        self.assertIn("value 0 is NaN", str(cm.exception))
        self.assertEqual(cm.exception.reason, "BAD_VALUE")
        # A vector passed in goes to the step's region too.
        r = c.step(2, np.array([1, 2, 3], dtype=np.float32))
        self.assertEqual(c.status().step, 2)
        c.close()


class Pure(unittest.TestCase):
    def test_model_id_of(self):
        a = pspnode.model_id_of("mlp", [("fc.weight", (3, 4)), ("fc.bias", (3,))])
        self.assertEqual(a, pspnode.model_id_of("mlp", [("fc.weight", (3, 4)), ("fc.bias", (3,))]))
        self.assertNotEqual(a, pspnode.model_id_of("mlp", [("fc.weight", (4, 3)), ("fc.bias", (3,))]))
        self.assertNotEqual(a, pspnode.model_id_of("cnn", [("fc.weight", (3, 4)), ("fc.bias", (3,))]))
        self.assertGreater(a, 0)
        self.assertLess(a, 1 << 32)

    def test_grpc_target(self):
        self.assertEqual(grpc_target("tcp:127.0.0.1:7000"), "127.0.0.1:7000")
        self.assertEqual(grpc_target("unix:/tmp/a.sock"), "unix:/tmp/a.sock")
        with self.assertRaises(ValueError):
            grpc_target("http://x")


if __name__ == "__main__":
    unittest.main()
