"""One local SGD step in the rules' order, for every local training loop (the project's
``client_app/trainer.py`` and a user's, ``strategies/client.py``).

docs/algorithms.md, Rules: the batch gradient -> the method's correction hook (SCAFFOLD,
FedDyn, ...) -> clip the gradient norm -> the optimizer's step (SGD with weight decay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fedinit.methods.method import GradientHook


def sgd_step(opt: torch.optim.Optimizer, params: list[torch.Tensor],
             gradient: Callable[[], torch.Tensor], hook: GradientHook | None,
             clip_norm: float) -> float:
    """Zero the gradients, run ``gradient()`` (the backward pass; it returns the batch loss),
    apply ``hook`` to the gradients, clip their norm to ``clip_norm`` (0: no clipping) and
    take ``opt``'s step. The batch loss as a float."""
    opt.zero_grad(set_to_none=False)
    loss = gradient()
    if hook is not None:
        hook(params)
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    opt.step()
    return float(loss.detach())
