"""Server checkpoints: everything needed to continue a run after the server dies.

One file per run directory, ``checkpoint.npz``, rewritten atomically after every round:
the global model, the strategy's server state (SCAFFOLD c, FedDyn H, Adam moments, FedCM
momentum, ...), the round it ends, and the config it belongs to. Sampling and local shuffles
are seeded by (seed, round[, client]), so no random-generator state needs saving: the
resumed rounds draw exactly what the uninterrupted run would have drawn.

A ``rounds=async`` run checkpoints at every flush (``server_app/async_resume.py``): there the
round is the model version, ``async_state`` holds the loop's own state (its seeded choice's
generator, the virtual clock, the tasks in flight) and ``extra`` the model versions those
tasks were sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.store.files import RecordError, expect_counts, read_record, write_record

CHECKPOINT_FILE = "checkpoint.npz"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line naming file and problem."""


def _unusable(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} {problem}")


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
    async_state: dict[str, Any] | None = field(default=None)
    """``rounds=async`` only: the loop's state at the flush (``server_app/async_resume.py``);
    None in a sync run's checkpoint."""
    extra: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """``rounds=async`` only: named arrays beside the model (the versions tasks in flight were
    sent)."""


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
    """Write ``run_dir/checkpoint.npz`` atomically (old or new file, never a torn one).

    A record with groups ``w`` (the model) and ``s/<key>`` (each strategy state entry)."""
    arrays = {"w": ckpt.weights, **{f"s/{k}": v for k, v in ckpt.strategy_state.items()},
              **{f"x/{k}": v for k, v in ckpt.extra.items()}}
    meta: dict[str, Any] = {"format": FORMAT_VERSION, "round": ckpt.server_round,
                            "config": ckpt.config, "num-weights": len(ckpt.weights),
                            "state": {k: len(v) for k, v in ckpt.strategy_state.items()}}
    if ckpt.rows is not None:
        meta["rows"] = ckpt.rows
    if ckpt.async_state is not None:
        meta["async"] = ckpt.async_state
        meta["extra"] = {k: len(v) for k, v in ckpt.extra.items()}
    write_record(run_dir / CHECKPOINT_FILE, arrays, meta)


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Read and check ``run_dir/checkpoint.npz``; CheckpointError (one line) if unusable."""
    path = run_dir / CHECKPOINT_FILE
    if not path.is_file():
        raise _unusable(path, "does not exist (nothing to resume from)")
    try:
        groups, meta = read_record(path)
        if meta.get("format") != FORMAT_VERSION:
            raise RecordError(path, f"has format {meta.get('format')}, "
                                    f"expected {FORMAT_VERSION}")
        extra_counts = dict(meta.get("extra", {}))
        counts = {"w": meta["num-weights"], **{f"s/{k}": n for k, n in meta["state"].items()},
                  **{f"x/{k}": n for k, n in extra_counts.items()}}
        expect_counts(path, groups, counts)
        config, server_round = dict(meta["config"]), int(meta["round"])
        async_state = meta.get("async")
        if async_state is not None and not isinstance(async_state, dict):
            raise TypeError(f"'async' is a {type(async_state).__name__}, not an object")
    except RecordError as err:
        raise _unusable(path, err.problem) from None
    except KeyError as err:
        raise _unusable(path, f"is incomplete: missing {err}") from None
    except (TypeError, ValueError, AttributeError) as err:
        raise _unusable(path, f"has a malformed meta: {err}") from None
    weights = groups.get("w", [])
    state = {k: groups.get(f"s/{k}", []) for k in meta["state"]}
    extra = {k: groups.get(f"x/{k}", []) for k in extra_counts}
    bad = non_finite_part(weights, {**state, **extra})
    if bad is not None:
        raise _unusable(path, f"holds NaN or Inf in {bad} (a diverged model); "
                              "it cannot be resumed")
    return Checkpoint(server_round, weights, state, config, meta.get("rows"), async_state,
                      extra)
