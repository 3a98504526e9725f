"""pspnode.DiLoCo: the outer step's arithmetic, a joiner that takes the
job's outer state, the state_dict round trip and schedulers, and what it
refuses (H of 0, a diverging outer learning rate, a non-finite
pseudo-gradient, another inner optimizer than the job's), with real
daemons (PSPNODE_BIN) and, for the gossip exchange's arithmetic and bad
peer state, the fake daemon of test_fake."""

import logging
import os
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pspnode  # noqa: E402
from pspnode.diloco import STATE_KIND  # noqa: E402
from pspnode.trainer.v3 import trainer_pb2 as pb  # noqa: E402
from test_fake import FakeDaemon, serve_fake  # noqa: E402

BIN = os.environ.get("PSPNODE_BIN", "")
F = F_ = torch.nn.functional
ARGS = ["--nat-traversal=false", "--exchange", "epidemic:1", "--barrier", "asp"]
LOCAL = ["/ip4/127.0.0.1/tcp/0"]


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batches(seed, n):
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(4, dtype=torch.float32).reshape(4, 1) / 4
    out = []
    for _ in range(n):
        x = torch.randn(16, 4, generator=g)
        out.append((x, x @ w))
    return out


def flat(ts):
    return torch.cat([t.detach().reshape(-1).clone() for t in ts])


def train(opt, model, data, sched=None):
    for x, y in data:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()


class Refusals(unittest.TestCase):
    """Refused before any daemon is started or asked."""

    def test_bad_h_and_outer_rates(self):
        m = net()
        for kw, says in [({"H": 0}, "positive integer"), ({"H": -3}, "positive integer"),
                         ({"H": 2.5}, "positive integer"), ({"H": True}, "positive integer"),
                         ({"H": 5, "outer_lr": 0}, "outer_lr"), ({"H": 5, "outer_lr": float("nan")}, "outer_lr"),
                         ({"H": 5, "outer_lr": float("inf")}, "outer_lr"),
                         ({"H": 5, "outer_momentum": 1.0}, "outer_momentum"),
                         ({"H": 5, "merge_wait": -1}, "merge_wait"),
                         ({"H": 5, "compression": "int2"}, "compression"),
                         ({"H": 5, "fragments": 0}, "fragments"), ({"H": 2, "fragments": 3}, "fragments"),
                         ({"H": 5, "fragments": 2.0}, "fragments")]:
            with self.subTest(kw=kw):
                with self.assertRaises(ValueError) as cm:
                    pspnode.DiLoCo(torch.optim.AdamW(m.parameters()), "unix:/nonexistent/sock", model=m, **kw)
                self.assertIn(says, str(cm.exception))
        with self.assertRaises(TypeError):
            pspnode.DiLoCo(torch.optim.AdamW(m.parameters()), "unix:/nonexistent/sock", model=m)  # no H


@unittest.skipUnless(BIN, "PSPNODE_BIN not set: run through `go test ./cmd/pspnode -run TestPythonClient`")
class WithDaemons(unittest.TestCase):
    def make(self, job, model, inner=None, boot=(), args=(), **kw):
        inner = inner or torch.optim.AdamW(model.parameters(), lr=1e-2)
        kw.setdefault("H", 3)
        opt = pspnode.DiLoCo(inner, model=model, job=job, bootstrap=list(boot), listen=LOCAL,
                             daemon_args=ARGS + list(args), start_timeout=30, **kw)
        self.addCleanup(opt.close)
        return opt

    @staticmethod
    def boot(opt):
        return [a for a in opt.daemon.addrs if "/127.0.0.1/tcp/" in a][:1]

    def test_outer_step_arithmetic(self):
        # A lone worker merges nothing: Δ̄ is its own pseudo-gradient, and
        # the outer SGD (lr 0.7, no momentum) moves θ_outer by 0.7 × (θ_i −
        # θ_outer); the daemon counts one step per H = 3 inner steps. A twin
        # trained by plain SGD on the same batches gives θ_i.
        m, twin = net(), net()
        opt = self.make("dl-arith", m, inner=torch.optim.SGD(m.parameters(), lr=0.1), outer_momentum=0.0)
        plain = torch.optim.SGD(twin.parameters(), lr=0.1)
        start = flat(opt.outer_parameters())
        data = batches(1, 3)
        train(opt, m, data[:2])
        self.assertEqual((opt.outer_step_count, opt.inner_step_count), (0, 2))
        self.assertTrue(torch.equal(flat(opt.outer_parameters()), start))  # inner steps leave θ_outer alone
        self.assertEqual(opt.client.status().step, 0)  # and make no daemon call
        train(opt, m, data[2:])
        train(plain, twin, data)
        self.assertEqual((opt.outer_step_count, opt.inner_step_count), (1, 0))
        self.assertEqual(opt.client.status().step, 1)
        want = start + 0.7 * (flat(twin.parameters()) - start)
        got = flat(opt.outer_parameters())
        self.assertTrue(torch.allclose(got, want, atol=1e-6), (got - want).abs().max())
        self.assertTrue(torch.equal(flat(m.parameters()), got))  # the next round starts at θ_outer

    def test_joiner_takes_outer_state(self):
        # A worker that joins a job under way takes θ_outer and the outer
        # momentum of a peer's trainer, not just its parameters.
        ma = net()
        a = self.make("dl-join", ma)
        train(a, ma, batches(2, 12))  # 4 outer steps
        self.assertEqual(a.outer_step_count, 4)
        mb = net(seed=9)  # other initial weights: the job's replace them
        with self.assertLogs("pspnode", "INFO") as logs:
            b = self.make("dl-join", mb, boot=self.boot(a))
        self.assertTrue(any("outer optimizer state" in line and "starting from" in line for line in logs.output),
                        logs.output)
        self.assertEqual(b.outer_step_count, 4)
        self.assertTrue(torch.equal(flat(b.outer_parameters()), flat(a.outer_parameters())))
        self.assertTrue(torch.equal(flat(mb.parameters()), flat(a.outer_parameters())))
        ma_m = [a.outer.state[p]["momentum_buffer"] for p in a.outer_parameters()]
        mb_m = [b.outer.state[p]["momentum_buffer"] for p in b.outer_parameters()]
        self.assertTrue(torch.equal(flat(ma_m), flat(mb_m)))
        self.assertGreater(float(flat(mb_m).abs().max()), 0)

    def test_joiner_takes_large_outer_state_in_chunks(self):
        # A state larger than one chunk of the trainer-state protocol (4
        # MiB: θ_outer and the momentum of 600 000 parameters, 4.8 MB)
        # comes to the joiner in chunks, whole and unchanged.
        def big(seed=0):
            torch.manual_seed(seed)
            return torch.nn.Sequential(torch.nn.Linear(4, 600), torch.nn.Tanh(), torch.nn.Linear(600, 1000))
        ma = big()
        a = self.make("dl-bigstate", ma, inner=torch.optim.SGD(ma.parameters(), lr=1e-3))
        g = torch.Generator().manual_seed(5)
        for _ in range(6):  # 2 outer steps
            x = torch.randn(8, 4, generator=g)
            a.zero_grad()
            F.mse_loss(ma(x), torch.zeros(8, 1000)).backward()
            a.step()
        self.assertEqual(a.outer_step_count, 2)
        view = a._state()[1]
        self.assertGreater(len(view), 4 << 20)
        whole = view[0:len(view)]
        self.assertEqual(whole, a._wire_state())
        self.assertEqual(view[5:4099] + view[4099:len(view)], whole[5:])  # any range, any cut
        mb = big(seed=9)
        b = self.make("dl-bigstate", mb, inner=torch.optim.SGD(mb.parameters(), lr=1e-3), boot=self.boot(a))
        self.assertEqual(b.started_from, "peer state")
        self.assertTrue(torch.equal(flat(b.outer_parameters()), flat(a.outer_parameters())))
        ma_m = [a.outer.state[p]["momentum_buffer"] for p in a.outer_parameters()]
        mb_m = [b.outer.state[p]["momentum_buffer"] for p in b.outer_parameters()]
        self.assertTrue(torch.equal(flat(ma_m), flat(mb_m)))

    def test_other_inner_optimizer_refused(self):
        ma = net()
        a = self.make("dl-mismatch", ma)
        train(a, ma, batches(3, 6))
        before = flat(a.outer_parameters())
        for inner, says in [(lambda p: torch.optim.SGD(p, lr=0.1), "SGD("),
                            (lambda p: torch.optim.AdamW(p, lr=3e-2), "AdamW(")]:
            with self.subTest(says=says):
                mb = net()
                with self.assertRaises(pspnode.DiLoCoMismatch) as cm:
                    self.make("dl-mismatch", mb, inner=inner(mb.parameters()), boot=self.boot(a))
                msg = str(cm.exception)
                self.assertIn("inner " + says, msg)
                self.assertIn("not the job's", msg)
                self.assertIsInstance(cm.exception, pspnode.ModelMismatch)
        # The job's parameters are as they were, and it goes on.
        self.assertTrue(torch.equal(flat(a.outer_parameters()), before))
        self.assertEqual(a.client.status().step, 2)
        train(a, ma, batches(4, 3))
        self.assertEqual(a.outer_step_count, 3)

    def test_compression(self):
        # Two int8 workers: their daemons send models in int8 (the exchange
        # says so in the Welcome) and each merges the other's. A worker of
        # another compression is refused at connect, nothing published; one
        # whose daemon runs another encoding than its own is told so.
        ma, mb = net(), net()
        a = self.make("dl-int8", ma)  # int8 is the default under epidemic
        self.assertEqual(a.compression, "int8")
        self.assertEqual(a.exchange, "epidemic:1:int8")
        b = self.make("dl-int8", mb, compression="int8", boot=self.boot(a))
        merged, errors = 0, []

        def one_round(opt, model, seed):
            try:
                train(opt, model, batches(seed, 3))
            except Exception as e:  # surfaced below
                errors.append(e)

        # The two train at once, as workers do: each outer step waits (up
        # to merge_wait) for the other's model of the round, which comes.
        # (One after the other, every outer step waited out merge_wait.)
        for r in range(6):
            ts = [threading.Thread(target=one_round, args=(a, ma, 30 + r)),
                  threading.Thread(target=one_round, args=(b, mb, 40 + r))]
            [t.start() for t in ts]
            [t.join() for t in ts]
            self.assertEqual(errors, [])
            merged += a.last_merged + b.last_merged
        self.assertGreater(merged, 0)
        self.assertGreater(a.client.status().node.updates_sent, 0)
        mc = net()
        with self.assertRaises(pspnode.DiLoCoMismatch) as cm:
            self.make("dl-int8", mc, boot=self.boot(a), compression="none")
        self.assertIn("compression none", str(cm.exception))
        me = net()  # int4's daemon runs (epidemic:1:int4), and is another compression
        with self.assertRaises(pspnode.DiLoCoMismatch) as cm:
            self.make("dl-int8", me, boot=self.boot(a), compression="int4")
        self.assertIn("compression int4", str(cm.exception))
        md = net()
        with self.assertRaises(ValueError) as cm:
            self.make("dl-int8-own", md, compression="bf16", args=["--exchange", "gossip"])
        self.assertIn("gossip", str(cm.exception))

    def test_fragments_train_and_send_a_fragment_a_round(self):
        # Streaming DiLoCo: two workers whose models are cut into F
        # fragments, synchronised in turn, fragment k mod F at outer step
        # k, every H inner steps each. They train (the loss falls), merge
        # each other's fragments, and each outer step sends about 1/F of
        # the model. A worker of another F is refused at connect.
        torch.manual_seed(0)
        w = torch.randn(64, 64) / 8
        for F in (2, 4):
            with self.subTest(F=F):
                models = [torch.nn.Linear(64, 64, bias=False) for _ in range(2)]
                for m in models:
                    torch.nn.init.zeros_(m.weight)
                a = self.make(f"dl-frag{F}", models[0], H=4, fragments=F, compression="none", merge_wait=0,
                              inner=torch.optim.SGD(models[0].parameters(), lr=4.0))
                b = self.make(f"dl-frag{F}", models[1], H=4, fragments=F, compression="none", merge_wait=0,
                              boot=self.boot(a), inner=torch.optim.SGD(models[1].parameters(), lr=4.0))
                self.assertEqual(a.exchange, f"epidemic:1:fragments={F}")
                g = torch.Generator().manual_seed(F)
                losses, merged = [], 0
                for _ in range(24):
                    for opt, m in ((a, models[0]), (b, models[1])):
                        x = torch.randn(32, 64, generator=g)
                        opt.zero_grad()
                        loss = F_.mse_loss(m(x), x @ w)
                        loss.backward()
                        opt.step()
                        losses.append(loss.item())
                    merged += a.last_merged + b.last_merged
                self.assertEqual(a.outer_step_count, 24 * F // 4)  # F outer steps every H inner steps
                self.assertLess(sum(losses[-8:]) / 8, 0.5 * sum(losses[:8]) / 8)
                self.assertGreater(merged, 0)
                # The bytes the daemons sent per model (a fragment) delivered:
                # the fragment's 4·N/F, and the streams' other bytes.
                sa, sb = a.client.status().node, b.client.status().node
                per_model = (sa.out_bytes + sb.out_bytes) / (sa.updates_sent + sb.updates_sent)
                whole = 4 * 64 * 64
                self.assertLess(per_model, 1.3 * whole / F + 1024)
                self.assertGreater(per_model, 0.9 * whole / F)
                with self.assertRaises(pspnode.DiLoCoMismatch) as cm:
                    mc = torch.nn.Linear(64, 64, bias=False)
                    self.make(f"dl-frag{F}", mc, H=4, fragments=1, compression="none", boot=self.boot(a),
                              inner=torch.optim.SGD(mc.parameters(), lr=4.0))
                self.assertIn("fragments", str(cm.exception))
                a.close()
                b.close()

    def test_diverging_outer_lr_and_nan_pseudo_gradient(self):
        ma, mb = net(), net()
        a = self.make("dl-diverge", ma)
        b = self.make("dl-diverge", mb, boot=self.boot(a))
        train(a, ma, batches(5, 3))
        train(b, mb, batches(6, 3))
        # An outer learning rate that diverges (a schedule gone wrong): the
        # outer step would leave the job's bound; it is undone and said.
        b.outer.param_groups[0]["lr"] = 1e7
        outer_before = flat(b.outer_parameters())
        momentum_before = flat([b.outer.state[p]["momentum_buffer"] for p in b.outer_parameters()])
        with self.assertRaises(FloatingPointError) as cm:
            train(b, mb, batches(7, 3))
        self.assertIn("outer learning rate", str(cm.exception))
        self.assertIn("1e+07", str(cm.exception))
        self.assertTrue(torch.equal(flat(b.outer_parameters()), outer_before))
        self.assertTrue(torch.equal(flat([b.outer.state[p]["momentum_buffer"] for p in b.outer_parameters()]),
                                    momentum_before))
        self.assertTrue(torch.equal(flat(mb.parameters()), outer_before))
        # Under the epidemic exchange the outer step is taken before the
        # model is published: the diverged one was not, and the round is
        # not counted.
        self.assertIn("nothing was published", str(cm.exception))
        self.assertEqual(b.outer_step_count, 1)
        self.assertEqual(b.client.status().step, 1)
        # A pseudo-gradient that is not finite (the inner training
        # diverged): nothing is published, the model goes back to θ_outer.
        b.outer.param_groups[0]["lr"] = 0.7
        with torch.no_grad():
            next(mb.parameters()).view(-1)[0] = float("nan")
        with self.assertRaises(FloatingPointError) as cm:
            train(b, mb, batches(8, 3))
        self.assertIn("not finite", str(cm.exception))
        self.assertIn("Nothing was published", str(cm.exception))
        self.assertEqual(b.client.status().step, 1)
        self.assertTrue(torch.equal(flat(mb.parameters()), outer_before))
        # The peer's parameters stay finite and it goes on.
        train(a, ma, batches(10, 6))
        self.assertTrue(bool(torch.isfinite(flat(a.outer_parameters())).all()))
        self.assertTrue(bool(torch.isfinite(flat(ma.parameters())).all()))

    def test_state_dict_round_trip_and_schedulers(self):
        m1 = net()
        inner1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
        o1 = self.make("dl-sd-a", m1, inner=inner1)
        s1 = torch.optim.lr_scheduler.StepLR(o1, step_size=4, gamma=0.5)  # on the DiLoCo: sets the inner rates
        self.assertIsInstance(o1, torch.optim.Optimizer)
        self.assertIs(o1.param_groups, inner1.param_groups)
        train(o1, m1, batches(11, 7), sched=s1)  # 2 outer steps and 1 inner
        self.assertAlmostEqual(inner1.param_groups[0]["lr"], 1e-2 * 0.5)  # 7 // 4 halvings
        saved = {"model": {k: v.clone() for k, v in m1.state_dict().items()}, "opt": o1.state_dict(),
                 "sched": s1.state_dict()}
        self.assertEqual((saved["opt"]["diloco"]["outer_step"], saved["opt"]["diloco"]["inner_step"]), (2, 1))
        m2 = net(seed=4)
        inner2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
        o2 = self.make("dl-sd-b", m2, inner=inner2)
        s2 = torch.optim.lr_scheduler.StepLR(inner2, step_size=4, gamma=0.5)  # on the inner optimizer
        m2.load_state_dict(saved["model"])
        o2.load_state_dict(saved["opt"])
        s2.load_state_dict(saved["sched"])
        self.assertEqual((o2.outer_step_count, o2.inner_step_count), (2, 1))
        self.assertEqual(o2.client.status().step, 2)
        rest = batches(12, 8)
        train(o1, m1, rest, sched=s1)
        train(o2, m2, rest, sched=s2)
        self.assertEqual((o1.outer_step_count, o2.outer_step_count), (5, 5))
        self.assertTrue(torch.equal(flat(m1.parameters()), flat(m2.parameters())))
        self.assertTrue(torch.equal(flat(o1.outer_parameters()), flat(o2.outer_parameters())))
        self.assertEqual(inner1.param_groups[0]["lr"], inner2.param_groups[0]["lr"])
        # Another configuration's state_dict is refused, naming both.
        m3 = net()
        o3 = self.make("dl-sd-c", m3, H=4)
        with self.assertRaises(ValueError) as cm:
            o3.load_state_dict(saved["opt"])
        self.assertIn("H=3", str(cm.exception))
        self.assertIn("H=4", str(cm.exception))

    def test_step_from_two_threads(self):
        m = net()
        opt = self.make("dl-threads", m)
        opt._stepping.acquire()
        try:
            errs = []
            t = threading.Thread(target=lambda: errs.append(self._try_step(opt)))
            t.start()
            t.join()
            self.assertIn("two threads", errs[0])
        finally:
            opt._stepping.release()

    @staticmethod
    def _try_step(opt):
        try:
            opt.step()
        except RuntimeError as e:
            return str(e)
        return ""


class GossipFake(FakeDaemon):
    """The fake daemon under gossip, with N̂ = 2: each Step's pull merges
    the vector peer (the sum of a peer's deltas)."""

    def __init__(self, n, peer, welcome_params=None, state=None):
        super().__init__(n)
        self.peer, self.welcome_params, self.state = peer, welcome_params, state
        self.published = []

    def Session(self, request_iterator, context):
        hello = next(request_iterator).hello
        self.hello = hello
        w = pb.Welcome(session="s1", step=hello.step, job="fake", exchange="gossip", update_kind=pb.UPDATE_KIND_DELTA,
                       population=2, lr_scale=0.5, max_abs_value=1e4, model_id=hello.model_id)
        if self.welcome_params is not None:
            w.step, w.has_params, w.params_source = 7, True, "peer P at step 7"
            w.params.data = self.welcome_params.tobytes()
            if self.state is not None:
                w.state.CopyFrom(pb.TrainerState(kind=STATE_KIND, step=7, data=self.state))
                w.state_source = "peer P"
        yield pb.DaemonMessage(welcome=w)
        for _ in request_iterator:
            pass

    def Step(self, request, context):
        self.published.append(np.frombuffer(request.update.data, dtype="<f4").copy())
        reply = pb.StepReply(barrier=pb.BarrierReply(step=request.step + 1, population=2, lr_scale=0.5))
        reply.pull.merged = 1
        reply.pull.update.data = self.peer.tobytes()
        return reply


class EpidemicFake(FakeDaemon):
    """The fake daemon under epidemic:1 with N̂ = 2: it counts the models
    it has taken (Status), takes `arriving` more when a step is published,
    and each Pull hands back the model published moved by `change` (the
    average to take) when models came since the last."""

    exchange = "epidemic:1"

    def __init__(self, n, change, came_in_round, arriving=1):
        super().__init__(n)
        self.change, self.came_in_round, self.arriving = change, came_in_round, arriving
        self.received, self.pulled_at, self.calls = 0, 0, []

    def Session(self, request_iterator, context):
        hello = next(request_iterator).hello
        yield pb.DaemonMessage(welcome=pb.Welcome(
            session="s1", step=0, job="fake", exchange=self.exchange, update_kind=pb.UPDATE_KIND_MODEL,
            population=2, lr_scale=1, max_abs_value=1e4, model_id=hello.model_id))
        for _ in request_iterator:
            pass

    def Status(self, request, context):
        return pb.StatusReply(node=pb.NodeStatus(updates_received=self.received))

    def inner_steps_done(self):
        self.received += self.came_in_round  # what came during the round

    def Publish(self, request, context):
        self.calls.append("publish")
        self.received += self.arriving
        self.model = np.frombuffer(request.update.data, dtype="<f4").copy()
        return pb.PublishReply(step=request.step)

    def Barrier(self, request, context):
        self.calls.append("barrier")
        return pb.BarrierReply(step=request.step, population=2, lr_scale=1)

    def Pull(self, request, context):
        k = self.received - self.pulled_at
        self.pulled_at = self.received
        self.calls.append(f"pull:{k}")
        reply = pb.PullReply()
        if k:
            reply.merged = k
            reply.update.data = (self.model + self.change).tobytes()
        return reply


class MergeWait(unittest.TestCase):
    """An outer step publishes, passes the barrier, waits (up to
    merge_wait) for the round's models, and merges them with whatever
    came during the round."""

    def run_round(self, came_in_round, arriving=1, **kw):
        m = net()
        n = sum(p.numel() for p in m.parameters())
        change = np.full(n, 0.25, dtype="<f4")
        fake = EpidemicFake(n, change, came_in_round, arriving)
        addr = serve_fake(self, fake)
        opt = pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), addr, model=m, H=2, shared_memory=False,
                             connect_timeout=10, outer_lr=1.0, outer_momentum=0.0, **kw)
        self.addCleanup(opt.close)
        data = batches(16, 2)
        train(opt, m, data[:1])
        fake.inner_steps_done()
        t0 = time.monotonic()
        train(opt, m, data[1:])
        return opt, fake, time.monotonic() - t0

    def test_merges_the_rounds_model_with_what_came(self):
        # One model came during the round and one after the barrier: one
        # pull merges both, and the outer step (lr 1, no momentum) lands
        # on θ_i + the average's change.
        opt, fake, _ = self.run_round(came_in_round=1, merge_wait=30)
        self.assertEqual(fake.calls, ["publish", "barrier", "pull:2"])
        self.assertEqual(opt.last_merged, 2)
        twin = net()
        train(torch.optim.SGD(twin.parameters(), lr=0.1), twin, batches(16, 2))
        want = flat(twin.parameters()) + 0.25
        self.assertTrue(torch.allclose(flat(opt.outer_parameters()), want, atol=1e-6))

    def test_waits_at_most_merge_wait(self):
        # Nothing arrives: the outer step waits merge_wait, then goes on
        # with its own pseudo-gradient.
        opt, fake, _ = self.run_round(came_in_round=0, arriving=0, merge_wait=0.3)
        self.assertEqual(fake.calls, ["publish", "barrier", "pull:0"])
        self.assertEqual(opt.last_merged, 0)

    def test_local_outer_step_then_average_with_quasi_global_momentum(self):
        # Under epidemic the worker takes the outer step on its own
        # pseudo-gradient and publishes the result (Nesterov, lr 0.5,
        # momentum 0.5: θ_outer − 0.5·(Δ + 0.5·Δ) on the first round), takes
        # the average (here the published model + 0.25) as θ_outer, and
        # its momentum buffer becomes (1 − μ)·(the round's whole move)/lr.
        # Two rounds: the second buffer is μ·the first + (1 − μ)·its move.
        m = net()
        n = sum(p.numel() for p in m.parameters())
        fake = EpidemicFake(n, np.full(n, 0.25, dtype="<f4"), 0)
        addr = serve_fake(self, fake)
        lr, mu = 0.5, 0.5
        opt = pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), addr, model=m, H=2, shared_memory=False,
                             connect_timeout=10, outer_lr=lr, outer_momentum=mu, merge_wait=5)
        self.addCleanup(opt.close)
        twin = net()
        plain = torch.optim.SGD(twin.parameters(), lr=0.1)
        theta = flat(opt.outer_parameters())
        buf = None
        for r in range(2):
            data = batches(20 + r, 2)
            train(opt, m, data)
            train(plain, twin, data)
            delta = theta - flat(twin.parameters())
            nb = delta if buf is None else mu * buf + delta
            published = theta - lr * (delta + mu * nb)
            self.assertTrue(torch.allclose(torch.from_numpy(fake.model), published, atol=1e-5), r)
            after = published + 0.25
            self.assertTrue(torch.allclose(flat(opt.outer_parameters()), after, atol=1e-5), r)
            move = (theta - after) / lr
            buf = (1 - mu) * move if buf is None else mu * buf + (1 - mu) * move
            got = flat([opt.outer.state[p]["momentum_buffer"] for p in opt.outer_parameters()])
            self.assertTrue(torch.allclose(got, buf, atol=1e-5), (r, (got - buf).abs().max()))
            theta = after
            with torch.no_grad():
                for p, q in zip(twin.parameters(), opt.outer_parameters()):
                    p.copy_(q)

    def test_plain_step_without_wait(self):
        m = net()
        n = sum(p.numel() for p in m.parameters())
        fake = EpidemicFake(n, np.zeros(n, "<f4"), 1)
        fake.Step = lambda request, context: (fake.calls.append("step"), pb.StepReply(
            barrier=pb.BarrierReply(step=request.step + 1, population=2, lr_scale=1)))[1]
        addr = serve_fake(self, fake)
        opt = pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), addr, model=m, H=1, shared_memory=False,
                             connect_timeout=10, merge_wait=0)
        self.addCleanup(opt.close)
        train(opt, m, batches(17, 1))
        self.assertEqual(fake.calls, ["step"])


class FragmentFake(EpidemicFake):
    """EpidemicFake whose exchange cuts the model into 2 fragments (its
    Status says so)."""

    exchange = "epidemic:1:fragments=2"

    def Status(self, request, context):
        return pb.StatusReply(exchange=self.exchange, node=pb.NodeStatus(updates_received=self.received))


class Fragments(unittest.TestCase):
    def make(self, m):
        n = sum(p.numel() for p in m.parameters())
        fake = FragmentFake(n, np.zeros(n, dtype="<f4"), 0)
        opt = pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), serve_fake(self, fake), model=m, H=4,
                             shared_memory=False, connect_timeout=10, merge_wait=0)
        self.addCleanup(opt.close)
        return opt, fake

    def test_schedule_outer_state_per_fragment_and_its_round_trips(self):
        # A daemon cutting the model into 2 fragments: outer step k comes
        # after inner step 2k and steps fragment k mod 2 alone, with its own
        # momentum; the other fragment's parameters keep their inner steps.
        # Its outer state (a joiner's bytes, the state dict) round-trips.
        m = net()
        a, fake = self.make(m)
        self.assertEqual((a.fragments, len(a.outers)), (2, 2))
        lo, hi = a.outers[1].lo, a.outers[1].hi
        start = flat(a.outer_parameters())
        train(a, m, batches(3, 2))  # outer step 1: fragment 1
        self.assertEqual((a.outer_step_count, a.inner_step_count), (1, 0))
        theta = flat(a.outer_parameters())
        self.assertTrue(torch.equal(theta[:lo], start[:lo]))  # fragment 0 not stepped
        self.assertFalse(torch.equal(theta[lo:hi], start[lo:hi]))
        self.assertFalse(torch.equal(flat(m.parameters())[:lo], start[:lo]))  # its inner steps go on
        self.assertTrue(torch.equal(flat(m.parameters())[lo:hi], theta[lo:hi]))
        self.assertNotIn(a.outers[1].params[0], a.outers[0].opt.state)
        train(a, m, batches(4, 6))  # outer steps 2, 3, 4
        self.assertEqual(a.outer_step_count, 4)
        b, _ = self.make(net(seed=5))
        from pspnode._diloco_state import load_wire_state
        load_wire_state(b, a._wire_state(), None)
        self.assertTrue(torch.equal(flat(b.outer_parameters()), flat(a.outer_parameters())))
        for oa, ob in zip(a.outers, b.outers):
            self.assertTrue(torch.equal(oa.opt.state[oa.params[0]]["momentum_buffer"],
                                        ob.opt.state[ob.params[0]]["momentum_buffer"]))
        sd = a.state_dict()
        self.assertEqual(len(sd["diloco"]["outer"]), 2)
        c, _ = self.make(net(seed=6))
        c.load_state_dict(sd)
        for oa, oc in zip(a.outers, c.outers):
            self.assertTrue(torch.equal(oa.opt.state[oa.params[0]]["momentum_buffer"],
                                        oc.opt.state[oc.params[0]]["momentum_buffer"]))
        # A worker of another F than its daemon's is told so.
        with self.assertRaises(ValueError) as cm:
            pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), serve_fake(self, FragmentFake(1, None, 0)),
                           model=m, H=4, fragments=4, shared_memory=False, connect_timeout=10)
        self.assertIn("fragments=4", str(cm.exception))


class WithGossipFake(unittest.TestCase):
    def make(self, fake, m, **kw):
        addr = serve_fake(self, fake)
        kw.setdefault("outer_momentum", 0.0)
        kw.setdefault("outer_lr", 1.0)
        opt = pspnode.DiLoCo(torch.optim.SGD(m.parameters(), lr=0.1), addr, model=m, H=2, shared_memory=False,
                             connect_timeout=10, **kw)
        self.addCleanup(opt.close)
        return opt

    def test_model_changed_after_wrapping(self):
        # The checks pspnode.Optimizer makes (one copy, in the session):
        # a parameter no longer contiguous, of another dtype or shape, or a
        # layer replaced is refused at zero_grad and step, naming the fix.
        m = net()
        opt = self.make(FakeDaemon(sum(p.numel() for p in m.parameters())), m, merge_wait=0)
        train(opt, m, batches(2, 1))
        w, last = m[0].weight.data, m[2]
        cases = [("contiguous", lambda: setattr(m[0].weight, "data", w.t().contiguous().t()),
                  lambda: setattr(m[0].weight, "data", w), "no longer contiguous"),
                 ("double", m.double, m.float, "float32"),
                 ("shape", lambda: setattr(m[0].bias, "data", torch.zeros(5)),
                  lambda: setattr(m[0].bias, "data", torch.zeros(8)), "changed shape"),
                 ("layer", lambda: m.__setitem__(2, torch.nn.Linear(8, 1)), lambda: m.__setitem__(2, last),
                  "layer added, removed or replaced")]
        for name, change, undo, says in cases:
            with self.subTest(name):
                change()
                for call in (opt.zero_grad, opt.step):
                    with self.assertRaises(RuntimeError) as cm:
                        call()
                    self.assertIn(says, str(cm.exception))
                undo()
        train(opt, m, batches(3, 1))
        self.assertEqual((opt.outer_step_count, opt.inner_step_count), (1, 0))

    def test_scheduler_steps_per_inner_step_and_follows_a_reset(self):
        # scheduler= is stepped once per inner step; when the daemon moves
        # to another lineage at outer step 40, the scheduler is brought to
        # inner step 40 × H and on_reset is told so.
        m = net()
        n = sum(p.numel() for p in m.parameters())
        fake = FakeDaemon(n, reset_at=2, reset_params=np.full(n, 0.5, dtype="<f4"))
        resets = []
        opt = self.make(fake, m, merge_wait=0, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5),
                        on_reset=resets.append)
        self.assertIsInstance(opt.scheduler, torch.optim.lr_scheduler.StepLR)
        train(opt, m, batches(4, 3))  # 3 inner steps: one halving
        self.assertEqual(opt.scheduler.last_epoch, 3)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.05)
        self.assertEqual(opt.state_dict()["diloco"]["scheduler"]["last_epoch"], 3)
        train(opt, m, batches(5, 1))  # the second outer step: the reset
        self.assertEqual(opt.outer_step_count, 40)
        self.assertEqual([r.step for r in resets], [80])
        self.assertEqual(opt.scheduler.last_epoch, 80)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 0.1 * 0.5 ** (80 // 3))
        self.assertTrue(torch.equal(flat(m.parameters()), torch.full((n,), 0.5)))

    def test_gossip_publishes_scaled_move_and_sums(self):
        # The worker takes the outer step on its own pseudo-gradient Δ =
        # θ_outer − θ_i (Nesterov, lr 0.5, momentum 0.5: a move of
        # −0.5·1.5·Δ on the first round), publishes that move × lr_scale
        # (0.5), and θ_outer ← θ_outer + its published move + the peer's.
        m = net()
        n = sum(p.numel() for p in m.parameters())
        peer = np.full(n, 0.01, dtype="<f4")
        fake = GossipFake(n, peer)
        opt = self.make(fake, m, outer_lr=0.5, outer_momentum=0.5)
        twin = net()
        start = flat(opt.outer_parameters())
        data = batches(13, 2)
        train(opt, m, data)  # H = 2: one outer step
        train(torch.optim.SGD(twin.parameters(), lr=0.1), twin, data)
        self.assertEqual(len(fake.published), 1)
        own = torch.from_numpy(fake.published[0])
        delta = start - flat(twin.parameters())
        self.assertTrue(torch.allclose(own, 0.5 * -0.5 * 1.5 * delta, atol=1e-6))
        got = flat(opt.outer_parameters())
        self.assertTrue(torch.allclose(got, start + own + torch.from_numpy(peer), atol=1e-6))
        self.assertGreater(float(own.abs().max()), 0)

    def test_joiner_state_from_fake_and_bad_state(self):
        m = net()
        n = sum(p.numel() for p in m.parameters())
        job = np.linspace(-1, 1, n).astype("<f4")
        # A state that is not one: the job's parameters, a fresh outer optimizer.
        with self.assertLogs("pspnode", "WARNING") as logs:
            opt = self.make(GossipFake(n, np.zeros(n, "<f4"), welcome_params=job, state=b"PSPDxx"), m)
        self.assertTrue(any("not usable" in line for line in logs.output), logs.output)
        self.assertTrue(torch.equal(flat(opt.outer_parameters()), torch.from_numpy(job)))
        self.assertEqual(len(opt.outer.state), 0)
        self.assertEqual(opt.outer_step_count, 7)
        # A good state (a peer's, made by another DiLoCo of the same
        # configuration) gives θ_outer and the momentum; non-finite
        # values in it are refused.
        src_m = net(seed=3)
        src = self.make(GossipFake(n, np.zeros(n, "<f4")), src_m, outer_momentum=0.5)
        train(src, src_m, batches(15, 4))
        good = src._wire_state()
        bad = bytearray(good)
        bad[-4:] = np.array([np.nan], dtype="<f4").tobytes()
        huge = bytearray(good)  # a momentum value beyond the job's MaxAbsValue (1e4 here)
        huge[-4:] = np.array([-3e38], dtype="<f4").tobytes()
        # The parameters the job's peers serve: the source's θ_outer, a
        # little moved (another worker's, a round on).
        theta = flat(src.outer_parameters()).numpy()
        served = (theta * 1.02).astype("<f4")
        cases = [("good", good, served, True), ("NaN", bytes(bad), served, False), ("short", good[:-4], served, False),
                 ("beyond MaxAbs", bytes(huge), served, False),
                 ("far from the job's parameters", good, job, False)]
        for name, data, params, ok in cases:
            with self.subTest(name):
                mm = net(seed=5)
                o = self.make(GossipFake(n, np.zeros(n, "<f4"), welcome_params=params, state=data), mm,
                              outer_momentum=0.5)
                if ok:
                    self.assertTrue(torch.equal(flat(o.outer_parameters()), flat(src.outer_parameters())))
                    self.assertTrue(torch.equal(
                        flat([o.outer.state[p]["momentum_buffer"] for p in o.outer_parameters()]),
                        flat([src.outer.state[p]["momentum_buffer"] for p in src.outer_parameters()])))
                else:
                    self.assertTrue(torch.equal(flat(o.outer_parameters()), torch.from_numpy(params)))
                    self.assertEqual(len(o.outer.state), 0)
                self.assertTrue(torch.equal(flat(mm.parameters()), flat(o.outer_parameters())))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    unittest.main()
