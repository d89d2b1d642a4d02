"""Local training: mini-batch SGD with weight decay, a method's gradient hook, and clipping.

The order inside one step is fixed by ALGORITHMS.md: loss -> backward -> the method's
correction (SCAFFOLD, FedDyn, ...) -> clip the gradient norm -> SGD step (weight decay).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from strategies.base import GradientHook


@dataclass(frozen=True)
class LocalResult:
    """What one local training run reports."""

    mean_loss: float
    num_steps: int
    num_examples: int


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
) -> LocalResult:
    """Train ``model`` in place on (x, y), shuffled by ``generator``; x, y on the model's device.

    The last partial batch of an epoch is kept, so every example is seen each epoch.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    n = len(y)
    loss_sum, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(x.device)
        for i in range(0, n, batch_size):
            idx = order[i : i + batch_size]
            opt.zero_grad(set_to_none=False)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            if hook is not None:
                hook(params)
            if clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, clip_norm)
            opt.step()
            loss_sum += float(loss.detach())
            steps += 1
    return LocalResult(mean_loss=loss_sum / max(steps, 1), num_steps=steps, num_examples=n)
