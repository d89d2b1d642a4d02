"""Where tensors live: CUDA when present, CPU otherwise (server and clients alike)."""

import torch


def device() -> torch.device:
    """CUDA when present, CPU otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
