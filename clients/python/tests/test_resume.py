"""The resume rule: a worker restored from its checkpoint into a running job
takes the job's step and parameters, and its learning-rate schedule follows
the job's step (PSPNODE_BIN: run through `go test ./cmd/pspnode -run
TestPythonClient`)."""

import logging
import os
import socket
import sys
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import pspnode  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
logging.basicConfig(level=logging.WARNING)
F = torch.nn.functional
LR, GAMMA, EVERY = 0.1, 0.5, 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def train(opt, model, steps, sched=None):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


def steplr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=EVERY, gamma=GAMMA)


def lr_at(step):
    return LR * GAMMA ** (step // EVERY)


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class ResumeIntoARunningJob(unittest.TestCase):
    def optimizer(self, model, boot, **kw):
        opt = pspnode.Optimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model=model,
                                job="resume", bootstrap=boot, start_timeout=30,
                                daemon_args=["--nat-traversal=false", "--barrier", "pssp:1:100"], **kw)
        self.addCleanup(opt.close)
        return opt

    def test_scheduler_follows_the_jobs_step(self):
        boot = f"127.0.0.1:{free_port()}"
        m0 = net()
        w0 = self.optimizer(m0, boot, scheduler=steplr)
        self.assertTrue(w0.daemon.at_bootstrap)
        # The worker that will restart trains with the job, checkpoints at
        # step 4, and goes; the job goes on to step 10.
        m1 = net()
        w1 = self.optimizer(m1, boot, scheduler=steplr)
        train(w1, m1, 4)
        self.assertEqual(w1.step_count, w1.scheduler.last_epoch)
        ck = {"model": m1.state_dict(), "opt": w1.state_dict()}
        saved = w1.step_count
        w1.close()
        train(w0, m0, 10 - w0.step_count)
        job = w0.step_count
        self.assertGreater(job, saved)
        self.assertAlmostEqual(w0.param_groups[0]["lr"], lr_at(job))

        # Restarted from its checkpoint with the optimizer's scheduler: the
        # job's step and parameters, and the job's learning rate.
        m2 = net(seed=5)
        m2.load_state_dict(ck["model"])
        resets = []
        w2 = self.optimizer(m2, boot, scheduler=steplr, on_reset=resets.append)
        w2.load_state_dict(ck["opt"])
        self.assertEqual(w2.step_count, job)
        self.assertEqual(w2.scheduler.last_epoch, job)
        self.assertAlmostEqual(w2.param_groups[0]["lr"], lr_at(job))
        self.assertTrue(torch.equal(w2.params_vector(), w0.params_vector()))
        self.assertEqual([r.step for r in resets], [job])
        self.assertIn("resumed into the job", resets[0].reason)
        # Its next step goes on with the job's schedule.
        train(w2, m2, 1)
        self.assertEqual(w2.scheduler.last_epoch, w2.step_count)
        self.assertAlmostEqual(w2.param_groups[0]["lr"], lr_at(w2.step_count))
        w2.close()

        # Restarted with a scheduler it steps itself: on_reset says the
        # job's step, which the user brings the scheduler to.
        m3 = net(seed=6)
        m3.load_state_dict(ck["model"])
        holder = {}

        def on_reset(r):
            s = holder["sched"]
            for g in s.optimizer.param_groups:
                g["lr"] = g["initial_lr"]
            holder["sched"] = torch.optim.lr_scheduler.StepLR(s.optimizer, EVERY, GAMMA, last_epoch=-1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # stepped ahead of the optimizer, on purpose
                for _ in range(r.step):
                    holder["sched"].step()

        w3 = self.optimizer(m3, boot, on_reset=on_reset)
        holder["sched"] = steplr(w3)
        w3.load_state_dict(ck["opt"])
        self.assertEqual(w3.step_count, w0.step_count)
        self.assertAlmostEqual(w3.param_groups[0]["lr"], lr_at(w3.step_count))

    def test_scheduler_argument_refused_when_wrong(self):
        m = net()
        with self.assertRaises(TypeError):
            pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=LR), model=m, job="resume-bad",
                              scheduler=steplr(torch.optim.SGD(m.parameters(), lr=LR)))
        with self.assertRaises(TypeError) as cm:
            self.optimizer(m, (), scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o))
        self.assertIn("ReduceLROnPlateau", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
