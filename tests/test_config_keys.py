"""The one table of identity and resumable keys covers every run-config key, and both users
(the sweep's cell identity, the resume check) read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedinit.cli import sweep_plan
from fedinit.config import RunConfig, load_defaults
from fedinit.config.keys import EXPERIMENT, NOT_IDENTITY, RESUME_MAY_CHANGE, SPECIAL
from server_app import run_basics
from server_app.checkpoint import CheckpointError


def test_every_run_config_key_is_classified_once() -> None:
    keys = set(load_defaults())
    unclassified = keys - EXPERIMENT - set(SPECIAL)
    assert not unclassified, (f"new run-config keys {sorted(unclassified)}: add each to "
                              "fedinit/config/keys.py (EXPERIMENT, or SPECIAL with a reason)")
    assert not EXPERIMENT & set(SPECIAL)
    assert not (EXPERIMENT | set(SPECIAL)) - keys, "fedinit/config/keys.py names removed keys"
    assert all(role.why for role in SPECIAL.values())


def test_the_sweep_and_the_resume_check_use_the_table() -> None:
    assert sweep_plan.NOT_IDENTITY is NOT_IDENTITY
    assert run_basics.RESUME_MAY_CHANGE is RESUME_MAY_CHANGE
    config = RunConfig.parse({}).to_dict()
    assert set(sweep_plan.identity(config)) == set(config) - NOT_IDENTITY
    assert "num-server-rounds" in sweep_plan.identity(config)  # identity, yet resumable
    assert "client-state-dir" not in RESUME_MAY_CHANGE  # not identity, yet fixed on resume


@pytest.mark.parametrize(("key", "value"), [("client-state-dir", "/elsewhere"), ("seed", 7)])
def test_a_resume_refuses_what_the_table_fixes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               key: str, value: object) -> None:
    saved = RunConfig.parse({"num-server-rounds": 2}).to_dict()
    monkeypatch.setattr(run_basics, "load_checkpoint", lambda _d: _Ckpt(saved))
    cfg = RunConfig.parse({"num-server-rounds": 3, "resume-dir": str(tmp_path), key: value})
    with pytest.raises(CheckpointError, match=f"made with {key}="):
        run_basics.resume_point(cfg)


def test_a_resume_accepts_what_the_table_allows(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    saved = RunConfig.parse({"num-server-rounds": 2}).to_dict()
    monkeypatch.setattr(run_basics, "load_checkpoint", lambda _d: _Ckpt(saved))
    changed = {"num-server-rounds": 3, "resume-dir": str(tmp_path), "data-dir": str(tmp_path),
               "round-timeout": 5.0, "max-failed-rounds": 9, "node-registry": "r.json"}
    assert set(changed) <= RESUME_MAY_CHANGE
    point = run_basics.resume_point(RunConfig.parse(changed))
    assert point is not None and point[0] == tmp_path.resolve()


class _Ckpt:
    """The fields of a sync run's checkpoint that ``resume_point`` reads."""

    def __init__(self, config: dict[str, object]) -> None:
        self.config = config
        self.server_round = 1
        self.async_state = None
