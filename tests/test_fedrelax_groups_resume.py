"""FedRelax's ``relax-train=groups`` across a kill: the group models are written to
``server-models/`` under each member's id and the candidate models (uploads) under -1 - id,
both kept by the checkpointed versions, so a server killed after round 3's training (or after
round 3 wrote its files but before its checkpoint) and resumed ends as the uninterrupted run,
model, state and every server copy bit for bit (``tests/test_resume_and_faults.py``'s
checks). Round 3 is the first after a 2-round warm-up in which the loss graph measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import test_resume_and_faults as faults

pytestmark = [pytest.mark.usefixtures("quick_runs"), pytest.mark.slow]

GROUPS = {"beta": 0.0, "graph": "loss", "relax-warmup": 2, "graph-refresh-every": 2,
          "graph-k": 1, "relax-train": "groups"}


def test_killed_after_training_resumes_bit_identical(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(faults.PER_CLIENT, "fedrelax-groups", GROUPS)
    faults.test_killed_and_resumed_run_ends_bit_identical(tmp_path, "fedrelax-groups")
    assert_a_group_trained(tmp_path / "ref-run")


def test_killed_before_the_checkpoint_resumes_bit_identical(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(faults.PER_CLIENT, "fedrelax-groups", GROUPS)
    faults.test_fedrelax_killed_after_writing_its_client_models_resumes_bit_identical(
        tmp_path, monkeypatch, "fedrelax-groups")
    assert_a_group_trained(tmp_path / "ref-run")


def assert_a_group_trained(run_dir: Path) -> None:
    """The runs compared held a group of two or more clients after the warm-up (else the
    group files would not have been exercised)."""
    lines = [json.loads(line) for line in (run_dir / "groups.jsonl").read_text().splitlines()]
    assert lines and any(len(set(d["groups"])) < len(d["groups"]) for d in lines)
