"""Local training: mini-batch SGD with weight decay, a method's gradient hook, and clipping.

Step order (docs/algorithms.md, Rules): loss -> backward -> (SAM: gradient at the
perturbed point) -> the method's correction (SCAFFOLD, FedDyn, ...) -> clip the gradient norm
-> SGD step (weight decay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from strategies.method import GradientHook

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""loss_fn(model output, targets) -> scalar loss; cross-entropy for the image tasks."""

SAM_EPS = 1e-12
"""Guards the SAM ascent direction g / ||g|| against a zero gradient."""


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
    loss_fn: LossFn = nn.functional.cross_entropy,
    sam_rho: float = 0.0,
) -> LocalResult:
    """Train ``model`` in place on (x, y), shuffled by ``generator``; x, y on the model's device.

    The last partial batch of an epoch is kept, so every example is seen each epoch. With
    ``sam_rho > 0`` each step uses SAM's gradient (FedSAM); the reported loss is always the
    loss at the unperturbed point.
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
            xb, yb = x[idx], y[idx]
            loss = loss_fn(model(xb), yb)
            loss.backward()
            if sam_rho > 0:
                sam_gradient(model, params, xb, yb, loss_fn, sam_rho)
            if hook is not None:
                hook(params)
            if clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, clip_norm)
            opt.step()
            loss_sum += float(loss.detach())
            steps += 1
    return LocalResult(mean_loss=loss_sum / max(steps, 1), num_steps=steps, num_examples=n)


def sam_gradient(
    model: nn.Module,
    params: list[torch.Tensor],
    xb: torch.Tensor,
    yb: torch.Tensor,
    loss_fn: LossFn,
    rho: float,
) -> None:
    """Replace the gradients g in ``params`` by SAM's: the gradient at w + rho * g / ||g||.

    The weights are restored bit for bit (copied back, not subtracted), so the SGD step that
    follows starts from the original point, as in the authors' ESAM optimizer.
    """
    pairs = [(p, p.grad) for p in params if p.grad is not None]
    if not pairs:
        return
    with torch.no_grad():
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for _, g in pairs]))
        scale = rho / (float(norm) + SAM_EPS)
        saved = [p.detach().clone() for p, _ in pairs]
        for p, g in pairs:
            p.add_(g, alpha=scale)
    for _, g in pairs:
        g.zero_()
    loss_fn(model(xb), yb).backward()
    with torch.no_grad():
        for (p, _), w in zip(pairs, saved, strict=True):
            p.copy_(w)
