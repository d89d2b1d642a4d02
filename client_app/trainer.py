"""Local training: mini-batch SGD with weight decay, a method's gradient hook, and clipping.

Step order (docs/algorithms.md, Rules; one step is ``fedinit/task/sgd_step.py``): the batch gradient
(backward of the loss, or the method's own ``GradientFn``: FedSAM's gradient at the perturbed
point) -> the method's correction hook (SCAFFOLD, FedDyn, ...) -> clip the gradient norm -> SGD
step (weight decay).
Nothing here knows a method: a method's ``ClientRule.train`` picks the hook, the gradient and
the passes (``fedinit/methods/method.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedinit.methods.method import TrainedPass
from fedinit.task.models import get_weights, set_weights
from fedinit.task.sgd_step import sgd_step

if TYPE_CHECKING:
    from fedinit.methods.method import GradientFn, GradientHook, LossesFn, SgdPass
    from fedinit.methods.weights import Weights

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""loss_fn(model output, targets) -> scalar loss; cross-entropy for the image tasks."""


@dataclass(frozen=True)
class LocalResult:
    """What one local training run reports."""

    mean_loss: float
    num_steps: int
    num_examples: int


def backward(model: nn.Module, params: list[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor,
             loss_fn: LossFn) -> torch.Tensor:
    """The plain batch gradient: backward of the loss at the current weights."""
    loss = loss_fn(model(xb), yb)
    loss.backward()
    return loss


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    clip_norm: float,
    generator: torch.Generator,
    hook: GradientHook | None = None,
    loss_fn: LossFn = nn.functional.cross_entropy,
    gradient: GradientFn | None = None,
) -> LocalResult:
    """Train ``model`` in place on (x, y), shuffled by ``generator``; x, y on the model's device.

    The last partial batch of an epoch is kept, so every example is seen each epoch. The
    reported loss is the mean of what ``gradient`` (default ``backward``) returns per step.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    grad_fn = gradient or backward
    n = len(y)
    loss_sum, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(x.device)
        for i in range(0, n, batch_size):
            idx = order[i : i + batch_size]
            loss_sum += sgd_step(opt, params, partial(grad_fn, model, params, x[idx], y[idx],
                                                      loss_fn), hook, clip_norm)
            steps += 1
    return LocalResult(mean_loss=loss_sum / max(steps, 1), num_steps=steps, num_examples=n)


def local_generator(seed: int, server_round: int, partition_id: int,
                    stream: int = 0) -> torch.Generator:
    """The shuffling generator of one participation, seeded by (seed, round, client) and, for
    a second pass or fine-tuning, a stream number (0, the global pass, keeps the old seeds)."""
    words = [seed, server_round, partition_id] + ([stream] if stream else [])
    state = np.random.SeedSequence(words).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass(frozen=True)
class SgdSettings:
    """The run's local-training settings (run config) for one participation."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    clip_norm: float
    seed: int
    server_round: int
    partition_id: int


def sgd_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: SgdSettings,
             loss_fn: LossFn = nn.functional.cross_entropy) -> SgdPass:
    """The ``SgdPass`` a ``LocalJob`` carries: ``local_sgd`` on this client's data with the run's
    settings, from the given weights, shuffled by the participation's ``stream``."""
    s = settings

    def run(start: Weights, hook: GradientHook | None = None, *,
            gradient: GradientFn | None = None, stream: int = 0) -> TrainedPass:
        set_weights(model, start)
        res = local_sgd(model, x, y, epochs=s.epochs, batch_size=s.batch_size, lr=s.lr,
                        weight_decay=s.weight_decay, clip_norm=s.clip_norm,
                        generator=local_generator(s.seed, s.server_round, s.partition_id,
                                                  stream),
                        hook=hook, loss_fn=loss_fn, gradient=gradient)
        return TrainedPass(get_weights(model), res.mean_loss, res.num_steps, res.num_examples)

    return run


def train_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                 loss_fn: LossFn = nn.functional.cross_entropy) -> LossesFn:
    """The ``LossesFn`` a ``LocalJob`` carries: each model's mean loss over this client's
    training examples (x, y), in evaluation mode and without gradients, in batches of
    ``batch_size`` in the data's own order (no shuffling, no generator drawn: the same
    batches for every model and every call, so the result is deterministic)."""

    def run(models: Sequence[Weights]) -> list[float]:
        n = len(y)
        if n == 0:
            raise ValueError("a client without training examples has no training loss")
        out = []
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for w in models:
                set_weights(model, list(w))
                total = 0.0
                for i in range(0, n, batch_size):
                    xb, yb = x[i: i + batch_size], y[i: i + batch_size]
                    total += float(loss_fn(model(xb), yb)) * len(yb)
                out.append(total / n)
        model.train(was_training)
        return out

    return run
