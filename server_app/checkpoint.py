"""Server checkpoints: everything needed to continue a run after the server dies.

One file per run directory, ``checkpoint.npz``, rewritten atomically after every round:
the global model, the strategy's server state (SCAFFOLD c, FedDyn H, Adam moments, FedCM
momentum, ...), the round it ends, and the config it belongs to. Sampling and local shuffles
are seeded by (seed, round[, client]), so no random-generator state needs saving: the
resumed rounds draw exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server_app.results import atomic_write_bytes

CHECKPOINT_FILE = "checkpoint.npz"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line naming file and problem."""


@dataclass
class Checkpoint:
    """The server's state at the end of ``server_round``."""

    server_round: int
    weights: list[np.ndarray]
    strategy_state: dict[str, list[np.ndarray]]
    config: dict[str, Any]
    rows: list[dict[str, Any]] | None = field(default=None)
    """The result rows of rounds 1..server_round: rounds.jsonl/csv are rebuilt from these on
    resume, so a torn results file loses nothing (None in checkpoints older than this)."""


def non_finite_part(weights: list[np.ndarray], state: dict[str, list[np.ndarray]]) -> str | None:
    """Name of the first array (``weights[i]`` or ``<state key>[i]``) holding NaN or Inf.

    A diverged model must neither be resumed nor overwrite the last good checkpoint."""
    parts = [("weights", weights), *state.items()]
    for name, arrays in parts:
        for i, a in enumerate(arrays):
            if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                return f"{name}[{i}]"
    return None


def save_checkpoint(run_dir: Path, ckpt: Checkpoint) -> None:
    """Write ``run_dir/checkpoint.npz`` atomically (old or new file, never a torn one)."""
    arrays: dict[str, np.ndarray] = {f"w/{i}": a for i, a in enumerate(ckpt.weights)}
    for key, values in ckpt.strategy_state.items():
        for i, a in enumerate(values):
            arrays[f"s/{key}/{i}"] = a
    meta = {"format": FORMAT_VERSION, "round": ckpt.server_round, "config": ckpt.config,
            "num-weights": len(ckpt.weights),
            "state": {k: len(v) for k, v in ckpt.strategy_state.items()}}
    if ckpt.rows is not None:
        meta["rows"] = ckpt.rows
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(run_dir / CHECKPOINT_FILE, buf.getvalue())


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Read and check ``run_dir/checkpoint.npz``; CheckpointError (one line) if unusable."""
    path = run_dir / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (nothing to resume from)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable or corrupted: {err}") from None
    try:
        meta = json.loads(data.pop("meta").tobytes().decode())
        if meta["format"] != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {path} has format {meta['format']}, "
                                  f"expected {FORMAT_VERSION}")
        weights = [data[f"w/{i}"] for i in range(meta["num-weights"])]
        state = {k: [data[f"s/{k}/{i}"] for i in range(n)] for k, n in meta["state"].items()}
    except (KeyError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {err}") from None
    bad = non_finite_part(weights, state)
    if bad is not None:
        raise CheckpointError(f"checkpoint {path} holds NaN or Inf in {bad} (a diverged model); "
                              "it cannot be resumed")
    return Checkpoint(int(meta["round"]), weights, state, dict(meta["config"]),
                      meta.get("rows"))
