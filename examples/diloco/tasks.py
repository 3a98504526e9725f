"""The tasks of the DiLoCo matrix (examples/diloco/matrix.py): a model, its
data split among the workers, its inner optimizers and a held-out
evaluation, each small enough to train in seconds on one core.

  cnn     MNIST, two stride-2 5×5 convolutions and a linear layer (5 994
          parameters), 8 000 training and 2 000 held-out images of the
          repository's t10k set (model/mnist), each worker its
          DistributedSampler shard
  mlp     MNIST, 784 → 64 → 10 (50 890 parameters), the same data
  charlm  the character-level transformer of charlm.py (d 16, 2 layers,
          context 32) on Debian's licence texts, each worker its own
          random windows; its "accuracy" is the next character's
"""

import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "examples", "torch"))
sys.path.insert(0, HERE)

import charlm  # noqa: E402
import mnist  # noqa: E402

TASKS = ("cnn", "mlp", "charlm")
INNERS = ("sgd", "adamw")


class MNISTTask:
    """An MNIST model on the repository's t10k images: the first 8 000 to
    train (this worker's DistributedSampler shard, reshuffled each epoch
    by seed and epoch as the sampler does), the last 2 000 held out."""

    batch = 32

    def __init__(self, kind, rank, world, seed):
        xtr, ytr, self.xte, self.yte = mnist.load_mnist(os.path.join(REPO, "model", "mnist"))
        self.xtr, self.ytr = xtr, ytr
        self.kind, self.rank, self.world, self.seed = kind, rank, world, seed
        self.epoch, self.order, self.at = 0, None, 0

    def model(self):
        return mnist.CNN() if self.kind == "cnn" else mnist.MLP(hidden=64)

    def inner(self, name, params):
        if name == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.AdamW(params, lr=1e-3)

    def _shard(self):
        # torch.utils.data.DistributedSampler(shuffle=True, seed=seed):
        # a permutation by seed + epoch, every world-th index from rank.
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.xtr), generator=g)
        return perm[self.rank::self.world]

    def next(self):
        if self.order is None or self.at + self.batch > len(self.order):
            if self.order is not None:
                self.epoch += 1
            self.order, self.at = self._shard(), 0
        idx = self.order[self.at:self.at + self.batch]
        self.at += self.batch
        return self.xtr[idx], self.ytr[idx]

    def loss(self, model, x, y):
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model):
        out = model(self.xte)
        return float(F.cross_entropy(out, self.yte)), float((out.argmax(1) == self.yte).float().mean())


class CharTask:
    """charlm.py's model, smaller (d 16, context 32), on the licence texts:
    each worker its own random windows, 64 held-out windows."""

    batch = 8
    context = 32

    def __init__(self, rank, world, seed):
        train, held, self.vocab, _ = charlm.load_corpus()
        self.data = charlm.Windows(train, self.context, self.batch, seed=1000 * seed + rank)
        self.val = charlm.held_out(held, self.context, n=64)

    def model(self):
        return charlm.CharLM(len(self.vocab), d=16, layers=2, heads=4, context=self.context)

    def inner(self, name, params):
        if name == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)

    def next(self):
        return self.data.next()

    def loss(self, model, x, y):
        return charlm.loss_of(model, x, y)

    @torch.no_grad()
    def evaluate(self, model):
        x, y = self.val
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return float(loss), float((logits.argmax(-1) == y).float().mean())


def make(task, rank, world, seed):
    if task in ("cnn", "mlp"):
        return MNISTTask(task, rank, world, seed)
    if task == "charlm":
        return CharTask(rank, world, seed)
    raise SystemExit(f"unknown task {task!r}: want one of {', '.join(TASKS)}")


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().astype(np.float32, copy=True)

