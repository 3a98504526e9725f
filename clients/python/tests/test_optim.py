"""pspnode.Optimizer as a torch.optim.Optimizer, with a daemon it starts
itself (pspnode run --trainer, PSPNODE_BIN), and what it refuses.

Each test's optimizer starts its own daemon, the first of its job: a lone
worker under the default exchange (epidemic), whose steps merge nothing, so
a step moves the parameters exactly as the wrapped optimizer's does.
"""

import logging
import os
import pickle
import pydoc
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import pspnode  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
logging.basicConfig(level=logging.WARNING)
F = torch.nn.functional


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def flat(model):
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class TorchOptimizer(unittest.TestCase):
    def wrap(self, inner, model, job, **kw):
        opt = pspnode.Optimizer(inner, model=model, job=job, start_timeout=30, **kw)
        self.addCleanup(opt.close)
        return opt

    def train(self, opt, model, steps, x=None, y=None, sched=None):
        if x is None:
            x, y = batch()
        for _ in range(steps):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if sched is not None:
                sched.step()

    def test_is_an_optimizer_and_schedulers_work(self):
        m = net()
        opt = self.wrap(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), m, "sched")
        self.assertIsInstance(opt, torch.optim.Optimizer)
        self.assertIs(opt.param_groups, opt.inner.param_groups)
        self.assertIs(opt.state, opt.inner.state)
        self.assertEqual(opt.defaults["momentum"], 0.9)
        # StepLR: the wrapped optimizer's lr follows, and so do the steps.
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        self.train(opt, m, 4, sched=sched)
        self.assertAlmostEqual(opt.inner.param_groups[0]["lr"], 0.001)
        self.assertEqual(opt._step_count, 4)  # the scheduler counted our steps
        # A step at lr 0.001 without momentum moves the parameters by lr × grad.
        opt.inner.param_groups[0]["momentum"] = 0
        x, y = batch(7)
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        grad = torch.cat([p.grad.reshape(-1).clone() for p in m.parameters()])
        before = flat(m)
        opt.step()
        self.assertTrue(torch.allclose(flat(m), before - 0.001 * grad, atol=1e-7))
        self.assertEqual((opt.step_count, opt.client.status().step), (5, 5))
        # LambdaLR and OneCycleLR (which reads defaults and sets momentum).
        lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (e + 1))
        self.train(opt, m, 2, sched=lam)
        self.assertAlmostEqual(opt.inner.param_groups[0]["lr"], lam.base_lrs[0] / 3)
        opt.inner.param_groups[0]["momentum"] = 0.9
        one = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
        lrs = []
        for _ in range(5):
            self.train(opt, m, 1, sched=one)
            lrs.append(opt.inner.param_groups[0]["lr"])
        self.assertGreater(max(lrs), lrs[0])
        self.assertLess(opt.inner.param_groups[0]["momentum"], 0.95)
        self.assertEqual(opt.step_count, 12)

    def test_state_dict_round_trip(self):
        m = net()
        opt = self.wrap(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), m, "sd")
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        self.train(opt, m, 7, sched=sched)
        sd = opt.state_dict()
        self.assertEqual(sd["pspnode"]["step"], 7)
        ck = {"model": m.state_dict(), "opt": sd, "sched": sched.state_dict()}
        tmp = tempfile.mkdtemp(prefix="pspnode-sd-")
        self.addCleanup(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "ck.pt")
        torch.save(ck, path)
        opt.close()
        # A restarted worker: new model, new optimizer, a fresh daemon.
        ck = torch.load(path)
        m2 = net(seed=3)
        m2.load_state_dict(ck["model"])
        opt2 = self.wrap(torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9), m2, "sd2")
        sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=3, gamma=0.5)
        opt2.load_state_dict(ck["opt"])
        sched2.load_state_dict(ck["sched"])
        self.assertEqual(opt2.step_count, 7)
        self.assertEqual(opt2.client.status().step, 7)
        self.assertEqual(opt2.param_groups[0]["lr"], opt.param_groups[0]["lr"])
        for p, q in zip(m.parameters(), m2.parameters()):
            self.assertTrue(torch.equal(opt.state[p]["momentum_buffer"], opt2.state[q]["momentum_buffer"]))
        # Both go on alike from there.
        self.train(opt2, m2, 1, sched=sched2)
        self.assertEqual((opt2.step_count, opt2.client.status().step), (8, 8))
        # The format before version 2 loads too; another model's does not.
        opt2.load_state_dict({"inner": opt2.inner.state_dict(), "step": 8})
        bad = opt2.state_dict()
        bad["pspnode"]["model_id"] ^= 1
        with self.assertRaises(ValueError):
            opt2.load_state_dict(bad)

    def test_every_scheduler_checkpoints(self):
        # Every torch scheduler's state_dict on a pspnode.Optimizer saves
        # with torch.save and loads back (OneCycleLR's keeps a method of the
        # scheduler, and with it the optimizer: torch.save failed and left
        # a partial file), and the learning rate goes on alike.
        makers = {
            "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20),
            # (CyclicLR's state_dict holds a WeakMethod in torch 1.13, which
            # no pickle takes, on a plain optimizer too: torch's, fixed later.)
            "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e),
            "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
            "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10),
            "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
        }
        for name, make in makers.items():
            with self.subTest(scheduler=name):
                m = net()
                opt = self.wrap(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), m, "sched-" + name.lower())
                sched = make(opt)
                for _ in range(3):
                    self.train(opt, m, 1)
                    sched.step(1.0) if name == "ReduceLROnPlateau" else sched.step()
                tmp = tempfile.mkdtemp(prefix="pspnode-sched-")
                self.addCleanup(shutil.rmtree, tmp, True)
                path = os.path.join(tmp, "ck.pt")
                torch.save({"sched": sched.state_dict(), "opt": opt.state_dict()}, path)
                ck = torch.load(path)
                twin_opt = torch.optim.SGD(net().parameters(), lr=0.05, momentum=0.9)
                twin_opt.load_state_dict({k: v for k, v in ck["opt"].items() if k != "pspnode"})
                twin = make(twin_opt)
                twin.load_state_dict(ck["sched"])
                lr = lambda s: s.optimizer.param_groups[0]["lr"]  # noqa: E731
                for _ in range(2):
                    sched.step(1.0) if name == "ReduceLROnPlateau" else sched.step()
                    twin.step(1.0) if name == "ReduceLROnPlateau" else twin.step()
                self.assertAlmostEqual(lr(sched), lr(twin), places=12)
                opt.close()

    def test_zero_grad_clip_and_scaler(self):
        m = net()
        opt = self.wrap(torch.optim.SGD(m.parameters(), lr=0.1), m, "grads")
        x, y = batch()
        F.mse_loss(m(x), y).backward()
        opt.zero_grad(set_to_none=False)
        self.assertTrue(all(p.grad is not None and not p.grad.any() for p in m.parameters()))
        opt.zero_grad(set_to_none=True)
        self.assertTrue(all(p.grad is None for p in m.parameters()))
        # Gradient clipping acts on the model's gradients, as always.
        F.mse_loss(m(x * 100), y).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        grad = torch.cat([p.grad.reshape(-1).clone() for p in m.parameters()])
        self.assertAlmostEqual(float(grad.norm()), 0.5, places=4)
        before = flat(m)
        opt.step()
        self.assertTrue(torch.allclose(flat(m), before - 0.1 * grad, atol=1e-6))
        # GradScaler's sequence: scale the loss, unscale through the
        # optimizer's param_groups, skip the step on an overflow.
        scale = 1024.0
        for overflow in (False, True):
            opt.zero_grad()
            (F.mse_loss(m(x), y) * scale).backward()
            for g in opt.param_groups:
                for p in g["params"]:
                    p.grad.div_(scale)
                    if overflow:
                        p.grad[0] = float("inf")
            found_inf = any(not torch.isfinite(p.grad).all() for g in opt.param_groups for p in g["params"])
            step_before, before = opt.step_count, flat(m)
            if not found_inf:
                opt.step()
            self.assertEqual(opt.step_count, step_before + (0 if overflow else 1))
            self.assertEqual(torch.equal(flat(m), before), overflow)
        # torch's GradScaler itself (disabled without CUDA: a pass-through).
        scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
        opt.zero_grad()
        scaler.scale(F.mse_loss(m(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        self.assertEqual(opt.step_count, 3)
        with self.assertRaises(ValueError) as cm:
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        self.assertIn("before wrapping", str(cm.exception))
        # Pickled by accident (in a scheduler's saved state), it comes back
        # as a stand-in that says what happened when used.
        back = pickle.loads(pickle.dumps(opt))
        with self.assertRaises(TypeError) as cm:
            back.step()
        self.assertIn("state_dict()", str(cm.exception))

    def test_model_changed_after_wrapping(self):
        m = net()
        opt = self.wrap(torch.optim.SGD(m.parameters(), lr=0.1), m, "changed")
        self.train(opt, m, 1)
        last = m[2]
        cases = [
            ("double", lambda: m.double(), lambda: m.float(), "float32"),
            ("shape", lambda: setattr(m[0].bias, "data", torch.zeros(5)),
             lambda: setattr(m[0].bias, "data", torch.zeros(3)), "changed shape"),
            ("layer", lambda: m.__setitem__(2, torch.nn.Linear(3, 1)), lambda: m.__setitem__(2, last),
             "layer added, removed or replaced"),
        ]
        for name, change, undo, says in cases:
            with self.subTest(name):
                change()
                for call in (opt.zero_grad, opt.step):
                    with self.assertRaises(RuntimeError) as cm:
                        call()
                    self.assertIn(says, str(cm.exception))
                    self.assertIn("before building the optimizer", str(cm.exception)) if name != "double" else None
                if undo:
                    undo()
                    self.train(opt, m, 1)
        self.assertEqual(opt.step_count, 4)
        # Data replaced in place of the same shape (p.data = ...) is
        # followed: the step trains the new tensor.
        m[0].weight.data = m[0].weight.data.clone()
        before = m[0].weight.detach().clone()
        self.train(opt, m, 1)
        self.assertFalse(torch.equal(m[0].weight.detach(), before))
        self.assertTrue(torch.equal(opt.params_vector()[:12], m[0].weight.detach().reshape(-1)))

    def test_step_from_two_threads(self):
        m = net()
        inner = torch.optim.SGD(m.parameters(), lr=0.1)
        entered, release = threading.Event(), threading.Event()
        plain = inner.step

        def slow_step(*a, **kw):
            entered.set()
            release.wait(30)
            return plain(*a, **kw)
        opt = self.wrap(inner, m, "threads")
        inner.step = slow_step
        x, y = batch()
        F.mse_loss(m(x), y).backward()
        errs = []
        t = threading.Thread(target=lambda: errs.append(opt.step()))
        t.start()
        self.assertTrue(entered.wait(30))
        with self.assertRaises(RuntimeError) as cm:
            opt.step()
        self.assertIn("two threads", str(cm.exception))
        release.set()
        t.join()
        self.assertEqual(opt.step_count, 1)


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class OwnDaemon(unittest.TestCase):
    """The daemon the optimizer starts: it says why it cannot start, and
    goes when the optimizer or the process goes."""

    def test_stops_with_the_optimizer(self):
        m = net()
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="own", start_timeout=30)
        d = opt.daemon
        self.assertTrue(d.running and d.peer_id and d.addrs)
        self.assertTrue(opt.client.status().node.joined)
        opt.close()
        self.assertIsNotNone(d.proc.poll())
        self.assertEqual(d.proc.returncode, 0)  # a clean stop
        self.assertFalse(os.path.exists(d.dir))

    def test_stops_when_the_process_dies(self):
        # A process killed outright cannot close anything: its daemon
        # notices its stdin close (--trainer-owned) and stops, and the
        # next daemon started on this machine removes the folder it left.
        code = ("import os, sys, torch, pspnode\n"
                "m = torch.nn.Linear(2, 1)\n"
                "o = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job='orphan')\n"
                "print(o.daemon.proc.pid, o.daemon.dir, flush=True)\n"
                "sys.stdin.read()\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        for sig in (signal.SIGKILL, signal.SIGTERM):
            p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=env, text=True)
            pid, folder = p.stdout.readline().split()
            pid = int(pid)
            self.assertTrue(os.path.isdir(folder))
            os.kill(p.pid, sig)
            p.wait()
            p.stdin.close()
            p.stdout.close()
            deadline = time.time() + 30
            while time.time() < deadline and alive(pid):
                time.sleep(0.05)
            self.assertFalse(alive(pid), f"the daemon outlived the process that started it ({sig.name})")
            removed = pspnode.daemon.clean_stale()
            self.assertIn(folder, removed, sig.name)
            self.assertFalse(os.path.exists(folder), sig.name)

    def test_says_why_it_cannot_start(self):
        m = net()
        mk = lambda **kw: pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m, job="fail", **kw)
        # The binary missing: where it looked.
        with self.assertRaises(pspnode.DaemonStartError) as cm:
            mk(pspnode_bin="/nonexistent/pspnode")
        self.assertIn("/nonexistent/pspnode", str(cm.exception))
        # A port in use: which.
        held = socket.socket()
        held.bind(("127.0.0.1", 0))
        held.listen()
        self.addCleanup(held.close)
        port = held.getsockname()[1]
        t = time.monotonic()
        with self.assertRaises(pspnode.DaemonStartError) as cm:
            mk(listen=[f"/ip4/127.0.0.1/tcp/{port}"])
        msg = str(cm.exception)
        self.assertIn(f"a port it was to listen on is in use (127.0.0.1:{port})", msg)
        self.assertIn("pass listen=", msg)
        self.assertIn("last log lines", msg)
        self.assertLess(time.monotonic() - t, 20)
        # The bootstrap peer does not answer: the daemon's reason, and the
        # address to check, at the join timeout.
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        dead = free.getsockname()[1]
        free.close()
        boot = f"/ip4/127.0.0.1/tcp/{dead}/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
        with self.assertRaises(pspnode.BootstrapError) as cm:
            mk(bootstrap=[boot], listen=["/ip4/127.0.0.1/tcp/0"], daemon_args=["--nat-traversal=false"],
               start_timeout=4)
        msg = str(cm.exception)
        self.assertEqual(cm.exception.reason, "NO_PEER_AT_ADDRESS")
        self.assertIn("had not joined", msg)
        self.assertIn(boot, msg)
        self.assertIn("nothing of this job answered", msg)
        # Without an address or a job: what to give.
        with self.assertRaises(ValueError) as cm:
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), model=m)
        self.assertIn("job=", str(cm.exception))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its parent, here init) is gone too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class BadInput(unittest.TestCase):
    """Refused before any daemon is started or reached."""

    def test_not_float32_or_not_contiguous(self):
        m = net().double()
        with self.assertRaises(TypeError) as cm:
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), "unix:/nonexistent.sock", model=m)
        self.assertIn("model.float()", str(cm.exception))
        w = torch.nn.Parameter(torch.randn(3, 4).t())
        with self.assertRaises(ValueError) as cm:
            pspnode.Optimizer(torch.optim.SGD([w], lr=0.1), "unix:/nonexistent.sock")
        self.assertIn("contiguous", str(cm.exception))
        with self.assertRaises(TypeError):
            pspnode.Optimizer(object(), "unix:/nonexistent.sock")

    def test_help_lists_the_optimizer(self):
        text = pydoc.render_doc(pspnode, renderer=pydoc.plaintext)
        self.assertIn("class Optimizer(pspnode._session.Session)", text)
        self.assertIn("torch.optim.optimizer.Optimizer", text)  # in its method resolution order
        self.assertIn("Optimizer", dir(pspnode))


if __name__ == "__main__":
    unittest.main()
