"""Accuracy and loss of a model on a labelled tensor set (server test set, client data)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000
) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy in [0, 1]) of ``model`` on (x, y)."""
    model.eval()
    device = next(model.parameters()).device
    loss_sum, correct = 0.0, 0
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        out = model(xb)
        loss_sum += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    return loss_sum / len(y), correct / len(y)
