"""The client against a fake daemon: a gRPC server in this process that
speaks the trainer API's version 2 as told, for what a real daemon does
only in rare states (a reset to another lineage of the job) and for the
mapping of the daemon's ErrorInfo reasons to exception classes."""

import logging
import os
import shutil
import sys
import tempfile
import unittest
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import pspnode  # noqa: E402
from pspnode.client import SESSION_KEY, _WaitLog  # noqa: E402
from pspnode.rpc import status_pb2 as rpc_pb  # noqa: E402
from pspnode.trainer.v3 import trainer_pb2 as pb  # noqa: E402
from pspnode.trainer.v3 import trainer_pb2_grpc as pb_grpc  # noqa: E402


class _Status(grpc.Status):
    def __init__(self, code, details, trailing_metadata):
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


def failure(code, reason, message, **meta):
    """A status as the daemon's errors.go makes one."""
    info = rpc_pb.ErrorInfo(reason=reason, domain="trainer.pspnode", metadata=meta)
    st = rpc_pb.Status(code=code.value[0], message=message,
                       details=[rpc_pb.Any(type_url="type.googleapis.com/google.rpc.ErrorInfo",
                                           value=info.SerializeToString())])
    return _Status(code, message, (("grpc-status-details-bin", st.SerializeToString()),))


class FakeDaemon(pb_grpc.TrainerServicer):
    """Welcome at step 0 with the gossip exchange and no shared memory;
    Step returns reset_at's Reset at that step, else merges nothing;
    refuse, when set, is the status every Step ends with."""

    def __init__(self, n, reset_at=None, reset_params=None):
        self.n, self.reset_at, self.reset_params = n, reset_at, reset_params
        self.refuse = None
        self.sessions = []

    def Session(self, request_iterator, context):
        hello = next(request_iterator).hello
        self.hello = hello
        yield pb.DaemonMessage(waiting=pb.Waiting(reason="not joined: " + "x" * 600, waited_s=0))
        yield pb.DaemonMessage(welcome=pb.Welcome(
            session="s1", step=hello.step, job="fake", exchange="gossip", update_kind=pb.UPDATE_KIND_DELTA,
            population=1, lr_scale=1, max_abs_value=1e4, model_id=hello.model_id))
        for _ in request_iterator:
            pass

    def Step(self, request, context):
        self.sessions.append(dict(context.invocation_metadata()).get(SESSION_KEY))
        if self.refuse is not None:
            context.abort_with_status(self.refuse)
        reply = pb.StepReply(barrier=pb.BarrierReply(step=request.step + 1, population=1, lr_scale=1))
        if request.step == self.reset_at:
            reply.pull.reset.CopyFrom(pb.Reset(step=40, lineage="ab" * 16, reason="the job met an older lineage",
                                               params=pb.Tensor(data=self.reset_params.tobytes())))
        return reply


def serve_fake(test, fake):
    """Serves fake on a Unix socket for the length of test; returns the
    address."""
    tmp = tempfile.mkdtemp(prefix="pspnode-fake-")
    test.addCleanup(shutil.rmtree, tmp, True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_TrainerServicer_to_server(fake, server)
    sock = os.path.join(tmp, "fake.sock")
    server.add_insecure_port("unix:" + sock)
    server.start()
    test.addCleanup(server.stop, None)
    return "unix:" + sock


class WithFake(unittest.TestCase):
    def serve(self, fake):
        return serve_fake(self, fake)

    def test_reset_replaces_parameters_and_step(self):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        n = sum(p.numel() for p in m.parameters())
        job = np.arange(n, dtype="<f4") / 10
        fake = FakeDaemon(n, reset_at=3, reset_params=job)
        addr = self.serve(fake)
        seen = []
        inner = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        with self.assertLogs("pspnode", "WARNING") as logs:
            opt = pspnode.Optimizer(inner, addr, model=m, shared_memory=False, on_reset=seen.append,
                                    connect_timeout=10)
        self.addCleanup(opt.close)
        # The daemon's 600-character reason came as one short line.
        self.assertTrue(all(len(r) < 400 for r in logs.output), logs.output)
        x = torch.randn(4, 3)
        with self.assertLogs("pspnode", "WARNING") as logs:
            for _ in range(3):
                opt.zero_grad()
                m(x).pow(2).mean().backward()
                opt.step()
        self.assertEqual(opt.step_count, 40)
        self.assertTrue(torch.equal(opt.params_vector(), torch.from_numpy(job)))
        self.assertEqual([(r.step, r.lineage, r.reason) for r in seen], [(40, "ab" * 16, "the job met an older lineage")])
        self.assertTrue(any("lineage" in line for line in logs.output))
        # The wrapped optimizer's state is kept (momentum from three steps).
        self.assertTrue(all("momentum_buffer" in inner.state[p] for p in m.parameters()))
        # Every call named the session in its metadata.
        self.assertEqual(fake.sessions, ["s1"] * 3)
        # The next step goes on from the job's step.
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        opt.step()
        self.assertEqual(opt.step_count, 41)

    def test_errors_follow_the_reason_not_the_message(self):
        m = torch.nn.Linear(2, 1)
        fake = FakeDaemon(3)
        addr = self.serve(fake)
        opt = pspnode.Optimizer(torch.optim.SGD(m.parameters(), lr=0.1), addr, model=m, shared_memory=False,
                                connect_timeout=10, reconnect=False)
        self.addCleanup(opt.close)
        for reason, code, cls in [
            ("MODEL_MISMATCH", grpc.StatusCode.FAILED_PRECONDITION, pspnode.ModelMismatch),
            ("TRAINER_CONNECTED", grpc.StatusCode.ALREADY_EXISTS, pspnode.TrainerBusy),
            ("STEP_ORDER", grpc.StatusCode.OUT_OF_RANGE, pspnode.StepOrderError),
            ("NO_SESSION", grpc.StatusCode.FAILED_PRECONDITION, pspnode.SessionLost),
            ("NO_CHECKPOINT", grpc.StatusCode.FAILED_PRECONDITION, pspnode.NoCheckpoint),
            ("BAD_TENSOR", grpc.StatusCode.INVALID_ARGUMENT, pspnode.BadTensor),
        ]:
            with self.subTest(reason):
                fake.refuse = failure(code, reason, "words that name nothing", k="v")
                with self.assertRaises(cls) as cm:
                    opt.client.step(opt.step_count + 1, np.zeros(3, dtype=np.float32))
                self.assertEqual((cm.exception.reason, cm.exception.metadata, cm.exception.code),
                                 (reason, {"k": "v"}, code))

    def test_wait_log_is_short_and_rare(self):
        # A reason of 600 characters every 2 s for 5 minutes: a few short lines.
        clock = [0.0]
        import pspnode.client as client_mod
        real = client_mod.time.monotonic
        client_mod.time.monotonic = lambda: clock[0]
        self.addCleanup(setattr, client_mod.time, "monotonic", real)
        w = _WaitLog("unix:/x")
        with self.assertLogs("pspnode", "WARNING") as logs:
            for i in range(150):
                clock[0] = 2.0 * i
                w("not joined: " + "y" * 600, clock[0])
        self.assertLessEqual(len(logs.output), 6)
        self.assertTrue(all(len(line) < 300 for line in logs.output))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    unittest.main()
