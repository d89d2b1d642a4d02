"""What every experiment run has, whatever its schedule: its directory's name, where it resumes
from, the errors that end it, the final model written, a DP row's epsilon. The synchronous
driver (``server_app/experiment.py``) and the asynchronous one (``server_app/async_rounds.py``)
both use these, each around its schedule on the round engine."""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedinit.config import RunConfig
from fedinit.config import keys as config_keys
from fedinit.methods.dp_budget import Budget
from fedinit.store.files import atomic_write_bytes
from fedinit.task.models import set_weights
from server_app.checkpoint import Checkpoint, CheckpointError, load_checkpoint, non_finite_part
from server_app.privacy import COUNTED


def run_name(cfg: RunConfig) -> str:
    """A directory name that says what ran: method, RI beta, data, seed and start time."""
    ri = f"ri{cfg.train.beta:g}" if cfg.train.beta != 0 else "nori"
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    regimes = f"-{cfg.data.num_regimes}{cfg.data.regime_kind}" if cfg.data.num_regimes else ""
    d = cfg.data
    return (f"{cfg.method}-{ri}-{d.dataset}-{d.partition}{d.dirichlet_alpha:g}{regimes}"
            f"-s{cfg.seed}-{stamp}")


RESUME_MAY_CHANGE = config_keys.RESUME_MAY_CHANGE
"""Keys a resumed run may set differently from the checkpoint's config
(fedinit/config/keys.py)."""


class ModelDiverged(RuntimeError):
    """The global model (or the method's server state) became NaN or Inf."""


class NothingTrained(RuntimeError):
    """No round of the run aggregated a single reply: the result is the initial model."""


def resume_point(cfg: RunConfig) -> tuple[Path, Checkpoint] | None:
    """The run directory and checkpoint to continue from, checked against ``cfg``."""
    if not cfg.fleet.resume_dir:
        return None
    run_dir = Path(cfg.fleet.resume_dir).resolve()
    ckpt = load_checkpoint(run_dir)
    made = "async" if ckpt.async_state is not None else "sync"
    if ckpt.config.get("rounds", "sync") != made:
        raise CheckpointError(f"resume-dir {run_dir}: the checkpoint says rounds="
                              f"{ckpt.config.get('rounds', 'sync')!r} but holds a "
                              f"rounds={made!r} run's state")
    if made != cfg.schedule.rounds:
        raise CheckpointError(f"resume-dir {run_dir}: the checkpoint is of a rounds={made!r} "
                              f"run, this run has rounds={cfg.schedule.rounds!r}")
    now = cfg.to_dict()
    then = {**{k: config_keys.value_before(k, v, ckpt.config) for k, v in now.items()
                if k in config_keys.BEFORE_KEY}, **ckpt.config}
    for key, value in then.items():
        if key not in RESUME_MAY_CHANGE and now.get(key) != value:
            raise CheckpointError(f"resume-dir {run_dir}: the checkpoint was made with "
                                  f"{key}={value!r}, this run has {key}={now.get(key)!r}")
    if ckpt.server_round >= cfg.train.num_server_rounds:
        raise CheckpointError(f"resume-dir {run_dir}: the checkpoint is at "
                              f"{'version' if made == 'async' else 'round'} "
                              f"{ckpt.server_round}, "
                              f"num-server-rounds={cfg.train.num_server_rounds}"
                              " leaves nothing to do")
    return run_dir, ckpt


def check_finite(rnd: int, weights: list[np.ndarray], state: dict[str, list[Any]],
                  out: Path) -> None:
    """Stop before a NaN/Inf model is evaluated, recorded or checkpointed over a good one."""
    bad = non_finite_part(weights, state)
    if bad is not None:
        kept = f"round {rnd - 1}'s checkpoint in {out} is kept" if rnd > 1 else "nothing kept"
        raise ModelDiverged(f"round {rnd}: the aggregated global model holds NaN or Inf in {bad} "
                            f"(training diverged: lower lr or server-lr); stopped, {kept}")


def dp_fields(budget: Budget, counted: int) -> dict[str, Any]:
    """A DP round's epsilon under both conventions after ``counted`` runs of the mechanism
    (``server_app.results.DP_FIELDS``)."""
    return {"dp-epsilon": budget.epsilon(counted),
            "dp-epsilon-add-remove": budget.epsilon_add_remove(counted), COUNTED: counted}


def write_model(model: torch.nn.Module, final: list[np.ndarray], out: Path) -> None:
    """``model.pt``: ``final`` in ``model`` (the run's architecture), as its ``state_dict``."""
    set_weights(model, final)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    atomic_write_bytes(out / "model.pt", buf.getvalue())
