"""Where tensors live: CUDA when present, CPU otherwise (server and clients alike)."""

import torch


def device() -> torch.device:
    """CUDA when present, CPU otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe(dev: torch.device) -> str:
    """One line for logs: which device, by name, so an operator sees where training ran."""
    if dev.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(dev)}, torch {torch.__version__})"
    return f"cpu ({torch.get_num_threads()} threads, torch {torch.__version__})"
